"""A conversation exported as Markdown or JSON, and the check an imported one passes.

JSON export carries no snapshot (the context memory is rebuilt from the transcript); ``to_json``'s
output is what ``parse_export`` reads back, and anything else is refused with a sentence that says
what is wrong with it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from lazykv.core.chat.conversation import pretty_arguments, tool_label, tool_result_label, tool_result_note
from lazykv.core.history.records import (
    DEFAULT_TITLE,
    BranchLink,
    ConversationRecord,
    check_text,
    check_time,
    clean_title,
    settings_json,
    validate_message,
)

EXPORT_FORMAT = "lazykv-conversation"
# 2: the conversation's uid, and a branch's parent (its uid, title, branch point); 3: tool turns (a reply's
# tool_calls, a tool's result: the messages as ``Conversation.turns()`` gives them)
EXPORT_VERSION = 3
_EXPORT_FIELDS_V1 = {"format", "version", "title", "system_prompt", "settings", "messages", "created",
                     "updated"}
# each version's fields; its reader is ``parse_export`` (version 1: no uid, never a branch; before 3:
# messages of role and content only)
_EXPORT_FIELDS = {1: _EXPORT_FIELDS_V1, 2: _EXPORT_FIELDS_V1 | {"uid", "parent"},
                  3: _EXPORT_FIELDS_V1 | {"uid", "parent"}}
_TOOL_TURNS_SINCE = 3
_PARENT_FIELDS = {"uid", "title", "at"}
_UID = re.compile(r"[0-9a-f]{32}")


def to_markdown(record: ConversationRecord) -> str:
    """The conversation as a Markdown document, for reading."""
    title = " ".join(record.title.split()) or DEFAULT_TITLE
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
    parts = [f"# {title}", f"_LazyKV Chat conversation, started {created}_"]
    if record.system_prompt:
        parts += ["## System prompt", record.system_prompt]
    for i, message in enumerate(record.messages):
        markers = record.markers.get(i, [])
        if message["role"] == "tool":
            parts += _tool_result(message)
            continue
        parts.append(f"## {message['role'].capitalize()}")
        if message["content"] or markers:
            parts.append(_with_markers(message["content"], markers))
        for call in message.get("tool_calls") or ():
            parts += _tool_call(call)
    return "\n\n".join(parts) + "\n"


def _tool_call(call: Mapping[str, Any]) -> list[str]:
    """A reply's call of a tool: its name, then its arguments as written (indented when they are JSON)."""
    function = call["function"]
    return [f"**Tool call:** {_code_span(tool_label(function['name']))} (id {_code_span(call['id'])})",
            _fenced(pretty_arguments(function["arguments"]), "json")]


def _tool_result(message: Mapping[str, Any]) -> list[str]:
    """A tool's result: which tool, how it ended when it did not simply run, its output as text."""
    note = tool_result_note(message)
    return [f"## Tool result: {_code_span(tool_result_label(message))}",
            *([f"_{note}_"] if note else []), _fenced(message["content"], "text")]


def _code_span(text: str) -> str:
    """``text`` as inline code, shown as written whatever backticks it holds."""
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fenced(text: str, info: str) -> str:
    """``text`` as a code block, shown as written whatever fences it holds."""
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def _with_markers(text: str, markers: list[tuple[int, str]]) -> str:
    """``text`` with each marker a line of its own where it was: after the line it falls in (after a code
    block it falls in), or under the text."""
    if not markers:
        return text
    lines = text.splitlines(keepends=True)
    out, done, fenced, pending = [], 0, False, sorted(markers, key=lambda m: m[0])
    for line in lines:
        out.append(line)
        done += len(line)
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        while pending and pending[0][0] < done and not fenced:
            gap = "" if out[-1].endswith("\n\n") else "\n" if out[-1].endswith("\n") else "\n\n"
            out.append(f"{gap}_{pending.pop(0)[1]}_\n\n")
    out += [f"\n\n_{label}_" for _, label in pending]
    return "".join(out).strip("\n")


def to_json(record: ConversationRecord) -> dict:
    """The conversation as a JSON-able dict (no snapshot); ``parse_export`` reads it back."""
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "title": record.title,
        "system_prompt": record.system_prompt,
        "settings": record.settings,
        "messages": record.messages,
        "created": record.created,
        "updated": record.updated,
        "uid": record.uid,
        "parent": None if record.branch is None else {
            "uid": record.branch.parent_uid, "title": record.branch.parent_title, "at": record.branch.at},
    }


def parse_export(data: Any) -> dict:
    """The fields of an exported conversation, checked against what the app can store and show,
    with settings as JSON text."""
    if not isinstance(data, dict):
        raise ValueError(f"not a LazyKV conversation: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != EXPORT_FORMAT:
        raise ValueError(
            f"not a LazyKV conversation: format is {data.get('format')!r}, not {EXPORT_FORMAT!r}"
        )
    version = data.get("version")
    if type(version) is not int or version not in _EXPORT_FIELDS:
        raise ValueError(
            f"unsupported conversation version {version!r} (this LazyKV Chat reads "
            f"{' and '.join(map(str, _EXPORT_FIELDS))})"
        )
    fields = _EXPORT_FIELDS[version]
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"unknown field(s) in the conversation: {', '.join(unknown)}")
    missing = sorted(fields - set(data))
    if missing:
        raise ValueError(f"missing field(s) in the conversation: {', '.join(missing)}")
    if not isinstance(data["messages"], list):
        raise ValueError(f"messages must be a list, not {type(data['messages']).__name__}")
    if version < _TOOL_TURNS_SINCE:
        for i, m in enumerate(data["messages"]):
            if isinstance(m, dict) and (m.get("role") == "tool" or "tool_calls" in m):
                raise ValueError(f"message {i + 1}: tool calls and results are read from version "
                                 f"{_TOOL_TURNS_SINCE} on, and this conversation is version {version}")
    created = check_time("created", data["created"])
    updated = check_time("updated", data["updated"])
    return {
        "title": clean_title(data["title"]),
        "system_prompt": check_text("system_prompt", data["system_prompt"]),
        "settings": settings_json(data["settings"]),
        "messages": [validate_message(i, m) for i, m in enumerate(data["messages"])],
        "created": created,
        "updated": max(updated, created),
        "uid": _uid("uid", data["uid"]) if version >= 2 else None,
        "branch": _parent(data["parent"], len(data["messages"])) if version >= 2 else None,
    }


def _uid(what: str, value: Any) -> str:
    if not isinstance(value, str) or not _UID.fullmatch(value):
        raise ValueError(f"{what} must be a conversation uid (32 hexadecimal digits), not {value!r}")
    return value


def _parent(value: Any, n_messages: int) -> BranchLink | None:
    """A branch's parent as exported (None: the conversation is no branch)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != _PARENT_FIELDS:
        raise ValueError("parent must be null or an object with the fields "
                         f"{', '.join(sorted(_PARENT_FIELDS))}")
    at = value["at"]
    if type(at) is not int or not 0 <= at <= n_messages:
        raise ValueError(f"parent: at must be the number of messages the branch began with (0 to "
                         f"{n_messages}), not {at!r}")
    return BranchLink(_uid("parent: uid", value["uid"]), clean_title(value["title"]), at)
