"""A chat's turns as a reply changes them, without Qt: a reply begun (after the user's turn, in place of
the last reply to regenerate it, or going on with a reply that was cut off), how it ends or fails, the
oldest turns dropped to fit the context, the last reply's versions. The window's chat flow
(``qt/chat_flow.py``) calls these and shows what they did.

Tool turns: a reply that asks for tools ends with its calls (``finish_reply(..., tool_calls=...)``), is
answered by their results (``Conversation.add_tool_result``), never continued; the reply after the
results is a reply like any other (regenerated alone: the calls and results before it stay)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lazykv.core.chat.conversation import Conversation, ReplyStats
from lazykv.core.kinds import FinishReason

STOPPED = "Reply stopped"  # how the note under a reply that was cut off begins: Continue goes on with it
CLOSED = f"{STOPPED}: the app was closed"


def how_it_ended(finish: FinishReason, max_tokens: int | None) -> str:
    """The line under a reply that did not end by itself ("" when it did)."""
    if finish is FinishReason.CANCELLED:
        return STOPPED
    if finish is FinishReason.LENGTH:
        if max_tokens:  # the prompt was fitted to leave room for them: the limit was reached
            return f"{STOPPED} at the length limit ({max_tokens} tokens; Settings > Max reply tokens)"
        return f"{STOPPED}: the context is full"
    return ""


def ends_with_reply(conversation: Conversation) -> bool:
    n = len(conversation)
    return n > 0 and conversation.last_index("assistant") == n - 1


def can_continue(conversation: Conversation) -> bool:
    """The last reply was cut off (a length limit, Stop, the app closed) and can go on (not one that
    asked for tools: their results answer it)."""
    if not ends_with_reply(conversation) or conversation.asks_for_tools(len(conversation) - 1):
        return False
    stats = conversation.stats().get(len(conversation) - 1)
    return stats is not None and stats.note.startswith(STOPPED)


# -- the last reply's versions (regenerated replies) ----------------------------------------------------


def versions_shown(conversation: Conversation) -> tuple[int, int]:
    """(the version shown, how many there are) of the last reply; (0, 0) when the last turn is no reply."""
    if not ends_with_reply(conversation):
        return 0, 0
    index = len(conversation) - 1
    return conversation.version_shown(index), len(conversation.versions(index))


def page_version(conversation: Conversation, step: int) -> bool:
    """Show the last reply's version ``step`` back or on (the chat continues from it); False when there
    is none there."""
    number, count = versions_shown(conversation)
    if not 0 <= number + step < count:
        return False
    conversation.choose_version(number + step)
    return True


# -- the oldest turns dropped, lines under a message ----------------------------------------------------


def drop_oldest(conversation: Conversation, dropped: Sequence[Mapping[str, Any]]) -> str:
    """The engine left ``dropped`` out to fit the context: the conversation stops sending as many of its
    oldest turns (still shown). Returns what is said of it ("" when nothing was dropped)."""
    n = sum(1 for m in dropped if m["role"] != "system")
    if not n:
        return ""
    conversation.forget_oldest(n)
    return f"context full: the {n} oldest messages were dropped to make room"


def mark_end(conversation: Conversation, label: str) -> bool:
    """A line under the last message (a marker at its end), e.g. where the cache was compacted; False
    when there is no message, or the same line is there already."""
    if not len(conversation):
        return False
    index = len(conversation) - 1
    return conversation.add_marker(index, len(conversation.shown()[index]["content"]), label) is not None


def joined_stats(before: ReplyStats | None, after: ReplyStats | None) -> ReplyStats | None:
    """The figures of a reply continued: the time to its first token, its tokens counted together, the
    speed over both parts' writing (not the pause between them); the note is the second part's."""
    if before is None or after is None:
        return after if after is not None else before
    steps, seconds = 0, 0.0
    for part in (before, after):
        if part.tokens_per_second:
            steps += part.n_tokens - 1
            seconds += (part.n_tokens - 1) / part.tokens_per_second
    rate = steps / seconds if seconds > 0 else None
    return ReplyStats(before.time_to_first_token, rate, before.n_tokens + after.n_tokens, after.note)


# -- a reply, from its request to its end ---------------------------------------------------------------


@dataclass
class PendingReply:
    """The reply being written: what it goes on with, its text so far, the lines to put under it."""

    regenerate: bool = False  # it replaces the last reply, which it joins as one more version
    continued: str = ""  # the text of the reply cut off that it goes on with, in place ("" for none)
    text: str = ""  # the reply's text so far (a continued one's included)
    markers: list[str] = field(default_factory=list)  # lines to put under the reply when it ends

    @property
    def continuing(self) -> bool:
        return bool(self.continued)

    def add(self, piece: str) -> None:
        self.text += piece

    @property
    def new_text(self) -> str:
        """What this request wrote (without the reply it continues)."""
        return self.text[len(self.continued):]


def begin_regenerate(conversation: Conversation) -> PendingReply:
    """A new reply in place of the last one: that one is taken back (it comes back if none is written)."""
    conversation.take_back_reply()
    return PendingReply(regenerate=True)


def begin_continue(conversation: Conversation) -> PendingReply:
    """Going on with the last reply, cut off: it stays where it is, the same version, and what is
    written is added to it (the conversation sent ends with it, for the engine's ``stream_continue``)."""
    if not can_continue(conversation):
        raise ValueError("the last turn is not a reply that was cut off")
    cut = conversation.shown()[-1]["content"]
    return PendingReply(continued=cut, text=cut)


@dataclass(frozen=True)
class ReplyEnd:
    """What a reply's end did to the conversation, for the view to show."""

    added: bool  # a reply was added, or text to the reply continued
    kept: str = ""  # nothing was added: why ("stopped before it began"), the earlier reply kept as it was
    notes: tuple[str, ...] = ()  # what is said of it: the oldest turns dropped, how it ended
    stats: ReplyStats | None = None  # the figures under the reply (a continued one's: both parts')

    @property
    def note(self) -> str:
        """The line under the reply."""
        return "; ".join(self.notes)


def finish_reply(conversation: Conversation, pending: PendingReply, text: str, finish: FinishReason,
                 dropped: Sequence[Mapping[str, Any]], stats: ReplyStats | None,
                 max_tokens: int | None, tool_calls: Sequence[Mapping[str, Any]] = ()) -> ReplyEnd:
    """The engine answered ``pending`` with ``text`` (what followed, for a reply continued), ending as
    ``finish``, with the turns it ``dropped`` to fit and the figures the view measured (``stats``);
    ``tool_calls``: the reply asks for these tools (a turn of its own, its text may be empty; a reply
    continued cannot ask for any: ValueError)."""
    if tool_calls and pending.continuing:
        raise ValueError("a reply continued cannot ask for tools: continue is sent without them")
    ended = how_it_ended(finish, max_tokens)
    if not text and not tool_calls and pending.regenerate:
        conversation.put_back_reply()
        return ReplyEnd(False, _why_nothing(finish, ended) or "the model wrote nothing")
    if not text and not tool_calls and pending.continuing:
        if finish is not FinishReason.CANCELLED:  # the reply ends where it was cut: it says so now
            _restate_end(conversation, ended)
        return ReplyEnd(False, _why_nothing(finish, ended) or "the model ended the reply there")
    notes = tuple(n for n in (drop_oldest(conversation, dropped), ended) if n)
    note = "; ".join(notes)
    stats = replace(stats, note=note) if stats is not None else None
    if pending.continuing:
        stats = _extend(conversation, text, stats, note)
    elif text or tool_calls:
        if tool_calls:
            conversation.add_tool_calls(text, tool_calls)
        else:
            conversation.add("assistant", text)
        if stats is not None:
            conversation.set_stats(len(conversation) - 1, stats)
    for label in pending.markers:  # under the reply (under the user's message if it has none)
        mark_end(conversation, label)
    return ReplyEnd(bool(text or tool_calls), "", notes, stats)


def _why_nothing(finish: FinishReason, ended: str) -> str:
    return "stopped before it began" if finish is FinishReason.CANCELLED else ended


def _extend(conversation: Conversation, text: str, stats: ReplyStats | None, note: str) -> ReplyStats | None:
    """``text`` added to the last reply, cut off, whose figures become both parts' (``stats``: the second
    part's), with ``note`` under it; returns them."""
    index = len(conversation) - 1
    conversation.extend_reply(text)
    before = conversation.stats().get(index)
    joined = joined_stats(before, stats) if stats is not None else before
    if joined is not None:
        joined = replace(joined, note=note)
        conversation.set_stats(index, joined)
    return joined


def _restate_end(conversation: Conversation, ended: str) -> None:
    """The last reply's note says how it ended now (a continue that wrote nothing more)."""
    index = len(conversation) - 1
    stats = conversation.stats().get(index)
    if stats is not None:
        conversation.set_stats(index, replace(stats, note=ended))


def undo_reply(conversation: Conversation, pending: PendingReply) -> str | None:
    """The reply failed (refused, or an error): the conversation is as before it was asked. A
    regenerate's earlier reply comes back and a reply continued stays as it was cut; a new reply's
    user turn is taken back: its text is returned, for the message box."""
    if pending.regenerate:
        conversation.put_back_reply()
        return None
    if pending.continuing:
        return None
    if len(conversation) > 0 and conversation.last_index("user") == len(conversation) - 1:
        return conversation.pop()["content"]
    return None


def keep_cut(conversation: Conversation, pending: PendingReply, stats: ReplyStats | None) -> ReplyEnd:
    """The app closes while the reply is written (its answer will never come): what it wrote is kept,
    with a line saying that closing the app stopped it."""
    if not pending.new_text:
        return ReplyEnd(False)
    stats = replace(stats, note=CLOSED) if stats is not None else None
    if pending.continuing:
        stats = _extend(conversation, pending.new_text, stats, CLOSED)
    else:
        conversation.add("assistant", pending.text)
        if stats is not None:
            conversation.set_stats(len(conversation) - 1, stats)
    return ReplyEnd(True, "", (CLOSED,), stats)
