"""Structured output: a request's ``response_format`` as a GBNF grammar the engine samples under.

The grammar comes from llama-cpp-python's port of llama.cpp's json-schema-to-grammar
(``llama_cpp.llama_grammar``). That converter silently drops the keywords it cannot express and
asserts on some others, so a schema is checked here first: a keyword the grammar would not enforce
is refused with a ``SchemaError`` naming it (the API answers 400), since a reply that need not
validate is what the client asked us to rule out. What is enforced: ``ENFORCED`` below (the
README's "Structured output" says it for users); annotations are allowed and ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llama_cpp.llama_grammar import PRIMITIVE_RULES, json_schema_to_gbnf

TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "default", "examples",
                         "deprecated", "readOnly", "writeOnly"})
ENFORCED = frozenset({"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                      "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
                      "definitions", "pattern", "format", "minLength", "maxLength"})
FORMATS = ("date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5")
MAX_DEPTH = 48  # nested schemas
MAX_COUNT = 1000  # minItems, maxItems, minLength, maxLength, a pattern's {n,m}: the grammar spells each out
ALL_OF_PART = frozenset({"type", "properties", "required", "$ref"}) | ANNOTATIONS
ALL_OF_BESIDE = frozenset({"allOf", "type", "$defs", "definitions"})
_OWNER = {"minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
          "properties": "object", "required": "object", "additionalProperties": "object",
          "items": "array", "prefixItems": "array", "minItems": "array", "maxItems": "array"}
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
# the converter's string character lets raw control characters through (invalid JSON); llama.cpp's does not
_CHAR = PRIMITIVE_RULES["char"].content
_JSON_CHAR = _CHAR.replace('[^"\\\\]', '[^"\\\\\\x7F\\x00-\\x1F]', 1)


class SchemaError(ValueError):
    """A schema the grammar cannot enforce; ``keyword`` names what, ``where`` the place in the schema."""

    def __init__(self, keyword: str, where: str, why: str) -> None:
        at = f" at '{where}'" if where else ""
        super().__init__(f"The JSON schema's '{keyword}'{at} {why}")
        self.keyword = keyword
        self.where = where


def json_object_grammar() -> str:
    """Any JSON object (``{"type": "json_object"}``)."""
    return _convert({"type": "object"})


def schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of ``schema`` (``{"type": "json_schema"}``), or SchemaError."""
    normal = _Checker(schema).normalize(schema, "", 0)
    try:
        return _convert(normal)
    except (AssertionError, ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
        raise SchemaError("schema", "", f"cannot be turned into a grammar: {err}") from None


def _convert(schema: dict[str, Any]) -> str:
    grammar = json_schema_to_gbnf(json.dumps(schema))
    return grammar.replace(f"char ::= {_CHAR}", f"char ::= {_JSON_CHAR}")


class _Checker:
    """Walks a schema: refuses what the converter would not enforce, and rewrites two spellings it
    handles wrongly (a list of types with constraints; an ``allOf`` of one part)."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def normalize(self, node: Any, where: str, depth: int) -> Any:
        if not isinstance(node, dict):
            raise SchemaError("schema", where, "must be a JSON object (a boolean schema cannot be enforced).")
        if depth > MAX_DEPTH:
            raise SchemaError("schema", where, f"is nested deeper than {MAX_DEPTH} levels.")
        for key in node:
            if key not in ENFORCED and key not in ANNOTATIONS:
                raise SchemaError(key, where, "cannot be enforced by the grammar, so a reply could break it; "
                                  "remove it or express it with the supported keywords.")
        out = {k: v for k, v in node.items() if k not in ANNOTATIONS}
        self._check_type(out, where)
        if "enum" in out and (not isinstance(out["enum"], list) or not out["enum"]):
            raise SchemaError("enum", where, "must be a non-empty list of values.")
        self._check_counts(out, where)
        self._check_strings(out, where)
        self._check_ref(out, where)
        if "required" in out:
            self._check_required(out, where)
        if "prefixItems" in out and "items" in out:
            raise SchemaError("prefixItems", where, "together with 'items' cannot be enforced.")
        if isinstance(out.get("type"), list) and len(out["type"]) > 1:
            if "anyOf" in out or "oneOf" in out:
                raise SchemaError("type", where, "as a list beside 'anyOf'/'oneOf' cannot be enforced.")
            out = {"anyOf": [{**{k: v for k, v in out.items() if k != "type" and _OWNER.get(k, t) == t},
                              "type": t} for t in out["type"]]}
        elif isinstance(out.get("type"), list):
            out["type"] = out["type"][0] if out["type"] else None
        if out.get("type") == "array" and "items" not in out and "prefixItems" not in out \
                and ("minItems" in out or "maxItems" in out):
            out["items"] = {}
        if "allOf" in out:
            parts, beside = out["allOf"], set(out) - {"allOf", "$defs", "definitions"}
            if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict) and not beside:
                # pydantic's {"allOf": [{"$ref": ...}], "description": ...}: the one part is the schema
                merged = {**{k: v for k, v in out.items() if k != "allOf"}, **parts[0]}
                return self.normalize(merged, where, depth + 1)
            self._all_of(out, where)
        return self._children(out, where, depth)

    def _children(self, out: dict[str, Any], where: str, depth: int) -> dict[str, Any]:
        def sub(key: str) -> str:
            return f"{where}.{key}" if where else key

        for key in ("properties", "$defs", "definitions"):
            if key in out:
                if not isinstance(out[key], dict):
                    raise SchemaError(key, where, "must be an object.")
                out[key] = {name: self.normalize(s, sub(f"{key}.{name}"), depth + 1)
                            for name, s in out[key].items()}
        for key in ("additionalProperties", "items"):
            if key in out and not isinstance(out[key], bool):
                if isinstance(out[key], list):
                    out[key] = [self.normalize(s, sub(f"{key}.{i}"), depth + 1)
                                for i, s in enumerate(out[key])]
                else:
                    out[key] = self.normalize(out[key], sub(key), depth + 1)
        if out.get("items") is False or out.get("items") is True:
            raise SchemaError("items", where, "as a boolean cannot be enforced; give a schema.")
        for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
            if key in out:
                if not isinstance(out[key], list) or not out[key]:
                    raise SchemaError(key, where, "must be a non-empty list of schemas.")
                out[key] = [self.normalize(s, sub(f"{key}.{i}"), depth + 1) for i, s in enumerate(out[key])]
        return out

    def _check_type(self, out: dict[str, Any], where: str) -> None:
        if "type" not in out:
            return
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        if not types:
            raise SchemaError("type", where, "is an empty list: no reply could match.")
        for t in types:
            if t not in TYPES:
                raise SchemaError("type", where, f"is {json.dumps(t)}; a type is one of {', '.join(TYPES)}.")

    def _check_counts(self, out: dict[str, Any], where: str) -> None:
        for key in ("minItems", "maxItems", "minLength", "maxLength"):
            if key in out:
                value = out[key]
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
                    raise SchemaError(key, where, f"must be a whole number from 0 to {MAX_COUNT} here.")
        for low, high in (("minItems", "maxItems"), ("minLength", "maxLength")):
            if low in out and high in out and out[low] > out[high]:
                raise SchemaError(low, where, f"is larger than '{high}': no reply could match.")

    def _check_strings(self, out: dict[str, Any], where: str) -> None:
        is_string = "string" in (out["type"] if isinstance(out.get("type"), list) else [out.get("type")])
        for key in ("minLength", "maxLength"):
            if key in out and not is_string:
                raise SchemaError(key, where, 'is enforced only with "type": "string".')
        if "format" in out and is_string and out["format"] not in FORMATS:
            raise SchemaError("format", where, f"{json.dumps(out['format'])} cannot be enforced; the formats "
                              f"enforced are {', '.join(FORMATS[:4])}.")
        if "pattern" in out:
            pattern = out["pattern"]
            if not isinstance(pattern, str) or not (pattern.startswith("^") and pattern.endswith("$")):
                raise SchemaError("pattern", where, 'is enforced only when anchored: "^...$".')
            for match in _QUANTIFIER.finditer(pattern):
                if any(int(n) > MAX_COUNT for n in match.groups() if n):
                    raise SchemaError("pattern", where, f"repeats more than {MAX_COUNT} times.")

    def _check_ref(self, out: dict[str, Any], where: str) -> None:
        if "$ref" not in out:
            return
        ref = out["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise SchemaError("$ref", where, f"is {json.dumps(ref)}: only references inside the schema "
                              "(\"#/$defs/...\") are followed; nothing is fetched.")
        target: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError("$ref", where, f"is {json.dumps(ref)}, which the schema does not define.")
            target = target[part]

    def _check_required(self, out: dict[str, Any], where: str) -> None:
        required = out["required"]
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            raise SchemaError("required", where, "must be a list of property names.")
        properties = out.get("properties", {})
        missing = [name for name in required if not isinstance(properties, dict) or name not in properties]
        if missing:
            raise SchemaError("required", where, f"names {json.dumps(missing[0])}, which 'properties' does "
                              "not define: the grammar could not make the reply hold it.")

    def _all_of(self, out: dict[str, Any], where: str) -> None:
        parts = out["allOf"]
        if not isinstance(parts, list) or not parts:
            raise SchemaError("allOf", where, "must be a non-empty list of schemas.")
        for part in parts:
            resolved = part
            if isinstance(part, dict) and "$ref" in part:
                self._check_ref(part, where)
                resolved = self.root
                for key in part["$ref"][2:].split("/"):
                    resolved = resolved[key.replace("~1", "/").replace("~0", "~")]
            if not isinstance(resolved, dict) or not set(resolved) <= ALL_OF_PART \
                    or resolved.get("type", "object") != "object" or set(out) - ALL_OF_BESIDE:
                raise SchemaError("allOf", where, "is enforced only as a list of object schemas (properties "
                                  "and required) with nothing else beside it.")
