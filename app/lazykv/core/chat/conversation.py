"""The conversation: a system prompt, the turns in order, and where the KV precision changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")


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
    turn: dict[str, str]
    versions: list[str]  # every version so far, the one taken back included
    version_stats: dict[int, ReplyStats]  # by version number, the one taken back's included
    stored_versions: list[str] | None  # as they were kept for the turn (None: never regenerated)
    stored_version_stats: dict[int, ReplyStats] | None  # likewise
    stats: ReplyStats | None
    markers: list[Marker]


class Conversation:
    """Turns in order plus the system prompt; ``messages()`` hands out copies, safe for another thread."""

    def __init__(self, system_prompt: str = "") -> None:
        self.system_prompt = system_prompt
        self._turns: list[dict[str, str]] = []
        self._markers: list[Marker] = []
        self._stats: dict[int, ReplyStats] = {}  # by turn index: the replies' figures
        self._versions: dict[int, list[str]] = {}  # by turn index: every reply regenerated there
        # by turn index, by version number: each version's figures (this session's; the stored ones are
        # the version shown's)
        self._version_stats: dict[int, dict[int, ReplyStats]] = {}
        self._regenerating: _TakenBack | None = None  # the reply a new one replaces (regenerate)
        self._first_sent = 0  # turns before this were dropped to fit the context: shown, not sent

    def add(self, role: Role, content: str) -> None:
        if role not in ROLES or role == "system":
            raise ValueError(f"a turn's role is user or assistant, not {role!r}")
        self._turns.append({"role": role, "content": content})
        pending, self._regenerating = self._regenerating, None
        if pending is not None and role == "assistant" and pending.index == len(self._turns) - 1:
            self._versions[pending.index] = [*pending.versions, content]
            self._version_stats[pending.index] = dict(pending.version_stats)

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
        taken = _TakenBack(index, dict(self._turns[index]), self.versions(index), stats,
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
        self._turns.append(dict(taken.turn))
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
        self._turns[index] = {"role": self._turns[index]["role"], "content": versions[number]}
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

    def pop(self) -> dict[str, str]:
        """Remove and return the last turn (e.g. a user turn whose reply failed)."""
        turn = self._turns.pop()
        self._regenerating = None
        self._first_sent = min(self._first_sent, len(self._turns))
        self._drop_after(len(self._turns))
        return turn

    def truncate(self, n_turns: int) -> list[dict[str, str]]:
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

    def turns(self) -> list[dict[str, str]]:
        return [dict(t) for t in self._turns]

    def shown(self) -> Sequence[Mapping[str, str]]:
        """The turns themselves, read-only, not copied: for a view on the GUI thread (copying 100,000
        turns there took 40 ms)."""
        return self._turns

    def messages(self) -> list[dict[str, str]]:
        """What the engine is sent: the system prompt (when set) and every turn not dropped."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return system + self.turns()[self._first_sent :]

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
