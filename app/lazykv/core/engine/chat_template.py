"""Which chat format a model is spoken to in, and why (Qt-free).

A GGUF file usually carries its chat template (``tokenizer.chat_template``, a Jinja template); that one is
used. A file without one still often belongs to a family whose format llama.cpp knows by name: its
built-in templates (``llama_chat_builtin_templates``), rendered by ``llama_chat_apply_template``. Which
one is llama.cpp's own guess (``llm_chat_detect_template``, the markers a template contains), given the
text of the model's special tokens (Gemma's vocabulary holds ``<start_of_turn>``, a ChatML model's
``<|im_start|>``), else the GGUF's ``general.architecture`` when that is itself a built-in template's name.
Where none is known the model may be a base model, not made for chat: a plain "User: / Assistant:"
transcript is used. Whatever the format, its end-of-turn markers end a reply (stop strings).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache

import llama_cpp

# the probe a template is recognised by: every role, two user turns (templates differ on system prompts)
_PROBE = (("system", "S"), ("user", "U1"), ("assistant", "A1"), ("user", "U2"))

# the plain format of a model with no known chat format (a base model continues a transcript)
PLAIN_ROLES = {"system": "", "user": "User: ", "assistant": "Assistant: "}
PLAIN_TURN_END = "\n\n"
PLAIN_STOP = "\nUser:"  # a base model goes on writing the user's next turn: the reply ends there


class TemplateSource(StrEnum):
    """Where the chat format comes from."""

    FILE = "file"  # the model file's own chat template
    BUILTIN = "builtin"  # one of llama.cpp's built-in templates: the file has none
    PLAIN = "plain"  # none known: a plain transcript (the model may be a base model)


@dataclass(frozen=True)
class ChatTemplateChoice:
    """The chat format a model is used with, why, and the markers that end its replies."""

    source: TemplateSource
    name: str = ""  # a built-in template's name in llama.cpp ("gemma", "chatml", "llama3", ...)
    found_by: str = ""  # how a built-in one was chosen: "special tokens" or "architecture"
    end_markers: tuple[str, ...] = ()  # the template's end of turn ("<end_of_turn>"), stop strings

    @property
    def from_file(self) -> bool:
        return self.source is TemplateSource.FILE

    @property
    def words(self) -> str:
        """Which template and why, as the Model information dialog says it."""
        if self.source is TemplateSource.FILE:
            return "From the model file"
        if self.source is TemplateSource.BUILTIN:
            return (f"llama.cpp's built-in “{self.name}” format: the file has none "
                    f"(chosen by the model's {self.found_by})")
        return ("A plain “User: / Assistant:” transcript: none known, the file has no chat template. "
                "This may be a base model, not made for chat")

    @property
    def short(self) -> str:
        """The same in a few words, for a status line."""
        if self.source is TemplateSource.FILE:
            return "chat template from the file"
        if self.source is TemplateSource.BUILTIN:
            return f"built-in {self.name} chat format (the file has none)"
        return "plain format: may be a base model"


def render(template: str, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str | None:
    """``messages`` in llama.cpp's built-in template named (or detected in) ``template``; None when
    llama.cpp knows no such template."""
    encoded = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
    chat = (llama_cpp.llama_chat_message * len(encoded))(
        *(llama_cpp.llama_chat_message(role, content) for role, content in encoded))
    size = 2 * sum(len(role) + len(content) for role, content in encoded) + 1024
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(template.encode("utf-8"), chat, len(encoded),
                                                add_generation_prompt, buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n  # llama.cpp said how many bytes it needs
    raise RuntimeError(f"llama.cpp's {template!r} template wrote more than it said it needs")


@cache
def builtin_names() -> tuple[str, ...]:
    """The names of llama.cpp's built-in chat templates."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    return tuple(name.decode("utf-8") for name in names if name)


def _probe(template: str) -> str | None:
    return render(template, [{"role": r, "content": c} for r, c in _PROBE], add_generation_prompt=True)


@cache
def _builtin_probes() -> tuple[tuple[str, str | None], ...]:
    return tuple((name, _probe(name)) for name in builtin_names())


def detect_builtin(hint: str) -> str | None:
    """The built-in template llama.cpp detects in ``hint`` (a template's text or the special tokens of a
    vocabulary), by its name; None when it detects none."""
    found = _probe(hint)
    if found is None:
        return None
    return next((name for name, probe in _builtin_probes() if probe == found), None)


@cache
def builtin_end_markers(name: str) -> tuple[str, ...]:
    """What a built-in template writes after an assistant turn (its end of turn: ``<end_of_turn>``,
    ``<|im_end|>``, ``<|eot_id|>``); where it writes nothing there, the start of the next user turn."""
    reply = [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}]
    one = render(name, reply, add_generation_prompt=False) or ""
    after = one[one.rfind("A1") + 2 :].strip() if "A1" in one else ""
    if not after:
        two = render(name, [*reply, {"role": "user", "content": "U2"}], add_generation_prompt=False) or ""
        between = two[two.rfind("A1") + 2 : two.rfind("U2")] if "A1" in two and "U2" in two else ""
        after = next((line.strip() for line in between.splitlines() if line.strip()), "")
    return (after,) if after else ()


def choose(file_template: str | None, architecture: str, special_tokens: Iterable[str]) -> ChatTemplateChoice:
    """The chat format of a model whose file carries ``file_template`` (None or "": none), of this
    ``general.architecture`` and whose vocabulary's special (control and user-defined) tokens read
    ``special_tokens``."""
    if file_template:
        return ChatTemplateChoice(TemplateSource.FILE)
    name = detect_builtin("\n".join(token for token in special_tokens if token))
    found_by = "special tokens"
    if name is None and architecture in builtin_names():
        name, found_by = architecture, "architecture"
    if name is None:
        return ChatTemplateChoice(TemplateSource.PLAIN, name="plain", end_markers=(PLAIN_STOP,))
    return ChatTemplateChoice(TemplateSource.BUILTIN, name, found_by, builtin_end_markers(name))


def plain_prompt(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> str:
    """``messages`` as a plain transcript (the format of a model with no known chat format)."""
    text = "".join(PLAIN_ROLES.get(m["role"], f"{m['role'].capitalize()}: ") + m["content"] + PLAIN_TURN_END
                   for m in messages)
    return text + PLAIN_ROLES["assistant"].rstrip() if add_generation_prompt else text
