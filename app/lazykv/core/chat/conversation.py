"""The conversation: a system prompt, the turns in order, and where the KV precision changed.

A turn is a dict in OpenAI's message shape, which the engine's chat template takes: a user's or a
reply's ``{"role", "content"}``; a reply that asks for tools adds ``tool_calls`` (each ``{"id", "type":
"function", "function": {"name", "arguments"}}``, the arguments JSON text); a tool's result is
``{"role": "tool", "tool_call_id", "name", "content"}`` plus, for the app only, ``tool``: how the call
ended (``ToolStatus``), whether its output was cut, and the server and tool it ran on. ``messages()``
(what the engine is fed) carries only OpenAI's keys; ``turns()`` (what the history stores) all of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lazykv.core.kinds import ToolStatus

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")
TOOL_NAME_SEPARATOR = "__"  # a tool's name as the model sees it: "server__tool"
# a turn's keys besides role and content, by role: OpenAI's (sent to the engine), then the app's own
SENT_KEYS: dict[str, tuple[str, ...]] = {"user": (), "assistant": ("tool_calls",),
                                         "tool": ("tool_call_id", "name")}
APP_KEYS: dict[str, tuple[str, ...]] = {"user": (), "assistant": (), "tool": ("tool",)}
_CALL_KEYS, _FUNCTION_KEYS = {"id", "type", "function"}, {"name", "arguments"}
_TOOL_META_TYPES = {"status": str, "truncated": bool, "server": str, "tool": str}


def split_tool_name(name: str) -> tuple[str, str]:
    """("server", "tool") of a tool's name as the model sees it ("server__tool"); ("", name) without
    a server."""
    server, sep, tool = name.partition(TOOL_NAME_SEPARATOR)
    return (server, tool) if sep and server and tool else ("", name)


def tool_label(name: str, server: str = "", tool: str = "") -> str:
    """A tool in words, "server › tool" (``server`` and ``tool`` when known, else from ``name``)."""
    if not (server and tool):
        server, tool = split_tool_name(name)
    return f"{server} › {tool}" if server else tool


# how a tool call that did not simply run is said under its result
TOOL_STATUS_WORDS = {ToolStatus.OK: "", ToolStatus.ERROR: "the tool failed",
                     ToolStatus.DENIED: "denied by the user", ToolStatus.CANCELLED: "stopped"}
TRUNCATED_WORDS = "output cut to fit"


def tool_result_label(turn: Mapping[str, Any]) -> str:
    """A tool result's tool in words, "server › tool" (its stored server and tool, else its name)."""
    meta = turn.get("tool") or {}
    return tool_label(turn.get("name", ""), meta.get("server", ""), meta.get("tool", ""))


def tool_result_note(turn: Mapping[str, Any]) -> str:
    """What is said of a tool result besides its output: "denied by the user", "output cut to fit"
    ("" for a call that ran and gave all its output, or a result without the app's fields)."""
    meta = turn.get("tool") or {}
    words = [TOOL_STATUS_WORDS.get(meta.get("status", ToolStatus.OK), ""),
             TRUNCATED_WORDS if meta.get("truncated") else ""]
    return " · ".join(w for w in words if w)


def pretty_arguments(arguments: str) -> str:
    """A call's arguments to read: JSON indented (its strings as written, never escaped to \\u), other
    text as it is."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments


def tool_calls_of(turn: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool calls a turn asks for ([] for any other turn), copied."""
    return [{**call, "function": dict(call["function"])} for call in turn.get("tool_calls") or ()]


def copy_turn(turn: Mapping[str, Any]) -> dict[str, Any]:
    """A turn copied deep enough that changing the copy cannot change it."""
    copied = dict(turn)
    if "tool_calls" in copied:
        copied["tool_calls"] = tool_calls_of(turn)
    if isinstance(copied.get("tool"), Mapping):
        copied["tool"] = dict(copied["tool"])
    return copied


def sent(turn: Mapping[str, Any]) -> dict[str, Any]:
    """The turn as the engine is sent it: OpenAI's keys only."""
    keys = ("role", "content", *SENT_KEYS.get(turn["role"], ()))
    return copy_turn({k: turn[k] for k in keys if k in turn})


def sent_tool_keys(turn: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI keys a turn has besides role and content (a reply's tool_calls, a tool result's
    tool_call_id and name; {} for any other turn)."""
    return {k: turn[k] for k in SENT_KEYS.get(turn["role"], ()) if k in turn}


def check_turn(turn: Any, where: str = "the turn") -> dict[str, Any]:
    """A user's, reply's or tool result's turn (see the module's docstring), checked and copied;
    ValueError with a sentence that begins with ``where`` and says what is wrong."""
    if not isinstance(turn, Mapping):
        raise ValueError(f"{where}: expected an object with role and content, got {type(turn).__name__}")
    role = turn.get("role")
    if role not in SENT_KEYS:
        raise ValueError(f"{where}: role must be one of {', '.join(SENT_KEYS)}, not {role!r}")
    required = {"role", "content", *(SENT_KEYS[role] if role == "tool" else ())}
    allowed = {"role", "content", *SENT_KEYS[role], *APP_KEYS[role]}
    if not required <= set(turn) <= allowed:
        extra = f" (and may have {_words(allowed - required)})" if allowed != required else ""
        exactly = "exactly " if allowed == required else ""
        raise ValueError(f"{where}: expected {exactly}the fields {_words(required)}{extra}, "
                         f"got {sorted(turn)}")
    for key in ("content", "tool_call_id", "name"):
        if key in turn and not isinstance(turn[key], str):
            raise ValueError(f"{where}: {key} must be text, not {type(turn[key]).__name__}")
    if "tool_calls" in turn:
        _check_calls(turn["tool_calls"], where)
    if "tool" in turn:
        _check_tool_meta(turn["tool"], where)
    return copy_turn(turn)


def _words(keys: set[str]) -> str:
    """The fields in a sentence: "role, content and name"."""
    ordered = sorted(keys, key=lambda key: (0 if key == "role" else 1 if key == "content" else 2, key))
    return ordered[0] if len(ordered) == 1 else f"{', '.join(ordered[:-1])} and {ordered[-1]}"


def _check_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list) or not calls:
        raise ValueError(f"{where}: tool_calls must be a list of one call or more")
    for k, call in enumerate(calls, 1):
        if not isinstance(call, Mapping) or set(call) != _CALL_KEYS:
            raise ValueError(f"{where}: tool call {k} must have exactly the fields id, type and function")
        function = call["function"]
        if not isinstance(call["id"], str) or call["type"] != "function":
            raise ValueError(f"{where}: tool call {k} needs a text id and the type 'function'")
        if not (isinstance(function, Mapping) and set(function) == _FUNCTION_KEYS
                and all(isinstance(function[f], str) for f in _FUNCTION_KEYS)):
            raise ValueError(f"{where}: tool call {k}'s function must have a text name and arguments "
                             "(JSON text)")


def _check_tool_meta(meta: Any, where: str) -> None:
    if not isinstance(meta, Mapping) or set(meta) != set(_TOOL_META_TYPES):
        raise ValueError(f"{where}: tool must have exactly the fields {', '.join(_TOOL_META_TYPES)}")
    for key, kind in _TOOL_META_TYPES.items():
        if not isinstance(meta[key], kind):
            raise ValueError(f"{where}: tool's {key} must be {kind.__name__}, not {meta[key]!r}")
    if meta["status"] not in set(ToolStatus):
        raise ValueError(f"{where}: tool's status must be one of {', '.join(ToolStatus)}, "
                         f"not {meta['status']!r}")


def turn_texts(turn: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(what, text) of every text a checked turn holds: its content, a call's name, arguments, ..."""
    texts = [(key, turn[key]) for key in ("content", "tool_call_id", "name") if key in turn]
    for k, call in enumerate(turn.get("tool_calls") or (), 1):
        texts += [(f"tool call {k}'s id", call["id"]), (f"tool call {k}'s name", call["function"]["name"]),
                  (f"tool call {k}'s arguments", call["function"]["arguments"])]
    meta = turn.get("tool")
    if isinstance(meta, Mapping):
        texts += [(f"tool's {key}", meta[key]) for key in ("server", "tool")]
    return texts


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items ``a`` and ``b`` share: tokens a KV cache can reuse, turns a sync keeps."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Marker:
    """A note shown inside a message at ``offset`` characters, e.g. where the cache went to 8-bit."""

    message_index: int
    offset: int
    label: str


@dataclass(frozen=True)
class ReplyStats:
    """Figures of one reply, shown under it and stored with it: time to first token (prompt processing
    included), generation speed, length; and how it ended when it did not end by itself ("Reply
    stopped: the context is full")."""

    time_to_first_token: float
    tokens_per_second: float | None
    n_tokens: int
    note: str = ""

    def summary(self) -> str:
        """E.g. "0.42 s to first token · 31.5 tokens/s · 64 tokens"."""
        parts = [f"{self.time_to_first_token:.2f} s to first token"]
        if self.tokens_per_second is not None:
            parts.append(f"{self.tokens_per_second:.1f} tokens/s")
        parts.append(f"{self.n_tokens} token{'s' if self.n_tokens != 1 else ''}")
        return " · ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"ttft_s": self.time_to_first_token, "tokens_per_s": self.tokens_per_second,
                "n_tokens": self.n_tokens, "note": self.note}

    @classmethod
    def from_json(cls, data: Any) -> ReplyStats | None:
        """The stats stored with a message; None for anything else (e.g. written by a later version)."""
        if not isinstance(data, dict):
            return None
        ttft, rate, n = data.get("ttft_s"), data.get("tokens_per_s"), data.get("n_tokens")
        note = data.get("note", "")
        numbers = isinstance(ttft, int | float) and isinstance(n, int) and not isinstance(n, bool)
        rate_ok = rate is None or isinstance(rate, int | float)
        if not (numbers and rate_ok and isinstance(note, str)):
            return None
        return cls(float(ttft), None if rate is None else float(rate), n, note)


@dataclass(frozen=True)
class _TakenBack:
    """A reply taken back to be regenerated: what the new one joins, and all it takes to put it back."""

    index: int
    turn: dict[str, Any]
    versions: list[str]  # every version so far, the one taken back included ([]: it asked for tools)
    version_stats: dict[int, ReplyStats]  # by version number, the one taken back's included
    stored_versions: list[str] | None  # as they were kept for the turn (None: never regenerated)
    stored_version_stats: dict[int, ReplyStats] | None  # likewise
    stats: ReplyStats | None
    markers: list[Marker]


class Conversation:
    """Turns in order plus the system prompt; ``messages()`` hands out copies, safe for another thread."""

    def __init__(self, system_prompt: str = "") -> None:
        self.system_prompt = system_prompt
        self._turns: list[dict[str, Any]] = []
        self._markers: list[Marker] = []
        self._stats: dict[int, ReplyStats] = {}  # by turn index: the replies' figures
        self._versions: dict[int, list[str]] = {}  # by turn index: every reply regenerated there
        # by turn index, by version number: each version's figures (this session's; the stored ones are
        # the version shown's)
        self._version_stats: dict[int, dict[int, ReplyStats]] = {}
        self._regenerating: _TakenBack | None = None  # the reply a new one replaces (regenerate)
        self._first_sent = 0  # turns before this were dropped to fit the context: shown, not sent

    def add(self, role: Role, content: str) -> None:
        if role not in ("user", "assistant"):
            hint = " (a tool's result: add_tool_result)" if role == "tool" else ""
            raise ValueError(f"a turn's role is user or assistant, not {role!r}{hint}")
        self._turns.append({"role": role, "content": content})
        pending, self._regenerating = self._regenerating, None
        if (pending is not None and pending.versions and role == "assistant"
                and pending.index == len(self._turns) - 1):
            self._versions[pending.index] = [*pending.versions, content]
            self._version_stats[pending.index] = dict(pending.version_stats)

    def add_tool_calls(self, text: str, tool_calls: Sequence[Mapping[str, Any]]) -> None:
        """A reply that asks for tools: its text (may be empty) and its calls, each ``{"id", "type":
        "function", "function": {"name", "arguments"}}``. It is a turn of its own, never a version of
        another: in place of a reply taken back to regenerate, that reply's versions are not kept."""
        turn = check_turn({"role": "assistant", "content": text, "tool_calls": list(tool_calls)},
                          "the tool calls")
        self._turns.append(turn)
        self._regenerating = None

    def add_tool_result(self, tool_call_id: str, name: str, content: str,
                        status: ToolStatus | str = ToolStatus.OK, truncated: bool = False,
                        server: str = "", tool: str = "") -> None:
        """The result of the call ``tool_call_id`` (one of ``pending_tool_calls()``) to the tool ``name``:
        its output (or what is said instead: an error, a denial), how it ended, whether the output was
        cut to fit, and the server and tool it ran on (by default, from ``name``: "server__tool")."""
        if tool_call_id not in {call["id"] for call in self.pending_tool_calls()}:
            raise ValueError(f"no tool call {tool_call_id!r} waits for a result")
        if not (server and tool):
            server, tool = split_tool_name(name)
        meta = {"status": str(status), "truncated": bool(truncated), "server": server, "tool": tool}
        self._turns.append(check_turn({"role": "tool", "tool_call_id": tool_call_id, "name": name,
                                       "content": content, "tool": meta}, "the tool result"))
        self._regenerating = None

    def pending_tool_calls(self) -> list[dict[str, Any]]:
        """The calls of the last reply that asked for tools that have no result yet, in order ([] when
        a turn other than a tool result followed it)."""
        answered: set[str] = set()
        for turn in reversed(self._turns):
            if turn["role"] == "tool":
                answered.add(turn["tool_call_id"])
            elif turn.get("tool_calls"):
                return [call for call in tool_calls_of(turn) if call["id"] not in answered]
            else:
                break
        return []

    def asks_for_tools(self, index: int) -> bool:
        """The turn at ``index`` is a reply that asks for tools."""
        return bool(self._turns[index].get("tool_calls"))

    def add_turn(self, turn: Mapping[str, Any]) -> None:
        """A turn as ``turns()`` gives it (a stored one, when opening a conversation): a user's, a
        reply (asking for tools or not) or a tool's result, checked (ValueError) and copied."""
        self._turns.append(check_turn(turn))
        self._regenerating = None

    def take_back_reply(self) -> None:
        """Remove the last turn, a reply, to regenerate it: the next reply added there joins it (and
        the replies it replaced) as one more version, the one shown. Until then ``put_back_reply``
        undoes it."""
        index = len(self._turns) - 1
        if index < 0 or self._turns[index]["role"] != "assistant":
            raise ValueError("the last turn is not a reply")
        stats = dict(self._version_stats.get(index, {}))
        if index in self._stats:
            stats[self.version_shown(index)] = self._stats[index]
        stored, stored_stats = self._versions.get(index), self._version_stats.get(index)
        versions = [] if self.asks_for_tools(index) else self.versions(index)
        taken = _TakenBack(index, copy_turn(self._turns[index]), versions, stats,
                           None if stored is None else list(stored),
                           None if stored_stats is None else dict(stored_stats), self._stats.get(index),
                           [m for m in self._markers if m.message_index == index])
        self.pop()
        self._regenerating = taken

    @property
    def regenerating(self) -> bool:
        """A reply was taken back and no new one has come in its place yet."""
        return self._regenerating is not None and self._regenerating.index == len(self._turns)

    def put_back_reply(self) -> bool:
        """The regenerate did not give a reply (stopped before its first word, or failed): the reply
        taken back returns as it was, with its versions, figures and markers. False when no reply
        was taken back."""
        taken, self._regenerating = self._regenerating, None
        if taken is None or taken.index != len(self._turns):
            return False
        self._turns.append(copy_turn(taken.turn))
        if taken.stored_versions is not None:
            self._versions[taken.index] = list(taken.stored_versions)
        if taken.stored_version_stats is not None:
            self._version_stats[taken.index] = dict(taken.stored_version_stats)
        if taken.stats is not None:
            self._stats[taken.index] = taken.stats
        self._markers.extend(taken.markers)
        return True

    def extend_reply(self, more: str) -> None:
        """Go on with the last turn, a reply that was cut off: ``more`` is added to its text, which
        stays the same version (its other versions, its figures and markers are kept)."""
        index = len(self._turns) - 1
        if index < 0 or self._turns[index]["role"] != "assistant":
            raise ValueError("the last turn is not a reply")
        if self.asks_for_tools(index):
            raise ValueError("the last turn asks for tools: it is answered by their results, not continued")
        content = self._turns[index]["content"]
        if index in self._versions:
            versions = list(self._versions[index])
            versions[self.version_shown(index)] = content + more
            self._versions[index] = versions
        self._turns[index] = {"role": "assistant", "content": content + more}

    def versions(self, index: int) -> list[str]:
        """Every version of the turn at ``index``, oldest first (one: its content, if never regenerated)."""
        return list(self._versions.get(index) or [self._turns[index]["content"]])

    def version_shown(self, index: int) -> int:
        """Which of ``versions(index)`` the turn holds now (the last one with its content)."""
        versions = self.versions(index)
        content = self._turns[index]["content"]
        return max(i for i, text in enumerate(versions) if text == content)

    def choose_version(self, number: int) -> None:
        """Show version ``number`` of the last turn, to continue from it, with its own figures (its
        speed, how it ended); the markers belonged to the version it replaces and go."""
        index = len(self._turns) - 1
        versions = self.versions(index)
        if not 0 <= number < len(versions):
            raise IndexError(f"no version {number} of turn {index}")
        kept = self._version_stats.setdefault(index, {})
        if index in self._stats:
            kept[self.version_shown(index)] = self._stats.pop(index)
        self._turns[index] = {**self._turns[index], "content": versions[number]}
        self._markers = [m for m in self._markers if m.message_index != index]
        if number in kept:
            self._stats[index] = kept[number]

    def set_versions(self, index: int, versions: Sequence[str]) -> None:
        """The versions of the turn at ``index`` (as stored); ignored unless its content is one of them."""
        if len(versions) > 1 and self._turns[index]["content"] in versions:
            self._versions[index] = list(versions)

    def all_versions(self) -> dict[int, list[str]]:
        """The turns that have more than one version, by index."""
        return {i: list(v) for i, v in self._versions.items()}

    def pop(self) -> dict[str, Any]:
        """Remove and return the last turn (e.g. a user turn whose reply failed)."""
        turn = self._turns.pop()
        self._regenerating = None
        self._first_sent = min(self._first_sent, len(self._turns))
        self._drop_after(len(self._turns))
        return turn

    def truncate(self, n_turns: int) -> list[dict[str, Any]]:
        """Keep the first ``n_turns`` turns; return the removed ones (for edit-and-resend)."""
        removed = self._turns[n_turns:]
        del self._turns[n_turns:]
        self._regenerating = None
        self._first_sent = min(self._first_sent, n_turns)
        self._drop_after(n_turns)
        return removed

    def _drop_after(self, n_turns: int) -> None:
        """Markers and stats of turns from ``n_turns`` on go with them."""
        self._markers = [m for m in self._markers if m.message_index < n_turns]
        self._stats = {i: s for i, s in self._stats.items() if i < n_turns}
        self._versions = {i: v for i, v in self._versions.items() if i < n_turns}
        self._version_stats = {i: v for i, v in self._version_stats.items() if i < n_turns}

    def clear(self) -> None:
        self._turns.clear()
        self._markers.clear()
        self._stats.clear()
        self._versions.clear()
        self._version_stats.clear()
        self._regenerating = None
        self._first_sent = 0

    @property
    def first_sent(self) -> int:
        return self._first_sent

    def forget_oldest(self, n_turns: int) -> None:
        """Stop sending the ``n_turns`` oldest turns still sent (the context was full); keep showing them."""
        self._first_sent = min(len(self._turns), self._first_sent + n_turns)

    def turns(self) -> list[dict[str, Any]]:
        """Every turn, copied, with all its keys (a tool result's ``tool`` too): what the history stores."""
        return [copy_turn(t) if len(t) > 2 else dict(t) for t in self._turns]

    def shown(self) -> Sequence[Mapping[str, Any]]:
        """The turns themselves, read-only, not copied: for a view on the GUI thread (copying 100,000
        turns there took 40 ms)."""
        return self._turns

    def messages(self) -> list[dict[str, Any]]:
        """What the engine is sent: the system prompt (when set) and every turn not dropped, in OpenAI's
        shape (a reply's ``tool_calls``, a tool result's ``tool_call_id`` and ``name``; no app keys)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return system + [sent(t) if len(t) > 2 else dict(t) for t in self._turns[self._first_sent:]]

    def last_index(self, role: Role) -> int | None:
        return next((i for i in range(len(self._turns) - 1, -1, -1) if self._turns[i]["role"] == role), None)

    def add_marker(self, message_index: int, offset: int, label: str) -> Marker | None:
        """A marker; None when the same one is there already (a resume's line, stored with the
        conversation, said again by the next resume: it is not added twice)."""
        marker = Marker(message_index, offset, label)
        if marker in self._markers:
            return None
        self._markers.append(marker)
        return marker

    def markers(self) -> list[Marker]:
        return list(self._markers)

    def markers_by_turn(self) -> dict[int, list[tuple[int, str]]]:
        """The markers by turn index, (offset, label) in order: as the history stores them."""
        found: dict[int, list[tuple[int, str]]] = {}
        for marker in self._markers:
            found.setdefault(marker.message_index, []).append((marker.offset, marker.label))
        return found

    def set_stats(self, index: int, stats: ReplyStats) -> None:
        if not 0 <= index < len(self._turns):
            raise IndexError(f"no turn {index} to give stats to")
        self._stats[index] = stats

    def stats(self) -> dict[int, ReplyStats]:
        """The replies' figures by turn index (only replies that had them)."""
        return dict(self._stats)

    def __len__(self) -> int:
        return len(self._turns)
