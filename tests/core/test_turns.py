"""The turn logic of a chat without Qt (core/chat/turns.py): a reply begun, continued in place, regenerated
as versions, paged, failed, cut by closing the app; the oldest turns dropped."""

from __future__ import annotations

import pytest

from lazykv.core.chat import turns
from lazykv.core.chat.conversation import Conversation, ReplyStats
from lazykv.core.kinds import FinishReason

LIMIT = "Reply stopped at the length limit (8 tokens; Settings > Max reply tokens)"


def _cut(text: str = "Red is", *versions: str) -> Conversation:
    """A conversation whose last reply, ``text``, was cut at the length limit (after ``versions``,
    regenerated)."""
    c = Conversation()
    c.add("user", "Name a colour and say why.")
    for earlier in versions:
        c.add("assistant", earlier)
        c.set_stats(1, ReplyStats(0.5, 10.0, 5))
        turns.begin_regenerate(c)
    pending = turns.PendingReply(regenerate=bool(versions))
    end = turns.finish_reply(c, pending, text, FinishReason.LENGTH, [], ReplyStats(0.5, 10.0, 3), 8)
    assert end.added and end.note == LIMIT
    return c


def _continue(c: Conversation, more: str, finish: FinishReason = FinishReason.STOP,
              stats: ReplyStats | None = None) -> turns.ReplyEnd:
    pending = turns.begin_continue(c)
    assert c.messages()[-1] == {"role": "assistant", "content": pending.continued}  # what is sent
    for piece in more.split(" "):
        pending.add(piece)
    return turns.finish_reply(c, pending, more, finish, [], stats or ReplyStats(0.8, 20.0, 3), 8)


def test_how_a_reply_ended_is_said_once() -> None:
    assert turns.how_it_ended(FinishReason.STOP, 8) == ""
    assert turns.how_it_ended(FinishReason.CANCELLED, 8) == "Reply stopped"
    assert turns.how_it_ended(FinishReason.LENGTH, 8) == LIMIT
    assert turns.how_it_ended(FinishReason.LENGTH, None) == "Reply stopped: the context is full"


def test_a_cut_reply_is_continued_in_place_not_as_a_second_version() -> None:
    c = _cut()
    assert turns.can_continue(c) and turns.versions_shown(c) == (0, 1)
    end = _continue(c, " warm and bright.")
    assert end.added and end.note == ""
    assert [t["content"] for t in c.turns()] == ["Name a colour and say why.", "Red is warm and bright."]
    assert c.versions(1) == ["Red is warm and bright."] and turns.versions_shown(c) == (0, 1)
    assert not turns.can_continue(c)  # it ended by itself
    stats = c.stats()[1]
    assert stats == end.stats and stats.n_tokens == 6 and stats.note == ""
    assert stats.time_to_first_token == 0.5  # the reply's first token, not the continuation's
    assert stats.tokens_per_second == pytest.approx(4 / (2 / 10.0 + 2 / 20.0))  # both parts' writing


def test_continuing_a_regenerated_version_extends_that_version() -> None:
    c = _cut("Blue is", "Green.")
    assert turns.versions_shown(c) == (1, 2)
    _continue(c, " calm.", FinishReason.LENGTH)
    assert c.versions(1) == ["Green.", "Blue is calm."] and turns.versions_shown(c) == (1, 2)
    assert turns.can_continue(c) and c.stats()[1].note == LIMIT  # cut again: it can go on again
    _continue(c, " Like the sea.")
    assert c.versions(1) == ["Green.", "Blue is calm. Like the sea."]
    assert turns.page_version(c, -1) and c.turns()[-1]["content"] == "Green."
    assert turns.page_version(c, 1) and c.turns()[-1]["content"] == "Blue is calm. Like the sea."
    assert not turns.page_version(c, 1)


def test_a_cut_replys_markers_stay_and_new_ones_go_under_its_end() -> None:
    c = _cut()
    turns.mark_end(c, "compacted before")
    pending = turns.begin_continue(c)
    pending.add(" warm.")
    pending.markers.append("compacted while continuing")
    turns.finish_reply(c, pending, " warm.", FinishReason.STOP, [], ReplyStats(0.1, None, 1), 8)
    assert [(m.message_index, m.offset, m.label) for m in c.markers()] == [
        (1, len("Red is"), "compacted before"), (1, len("Red is warm."), "compacted while continuing")]


def test_a_continue_that_adds_nothing_leaves_the_reply_and_says_how_it_ends() -> None:
    c = _cut()
    before = c.stats()[1]
    end = _continue(c, "", FinishReason.CANCELLED, stats=None)  # stopped before its first word
    assert not end.added and end.kept == "stopped before it began"
    assert c.turns()[-1]["content"] == "Red is" and c.stats()[1] == before and turns.can_continue(c)
    end = _continue(c, "", FinishReason.STOP, stats=None)  # the model ends the reply right there
    assert not end.added and end.kept == "the model ended the reply there"
    assert c.turns()[-1]["content"] == "Red is" and c.stats()[1].note == "" and not turns.can_continue(c)


def test_a_failed_continue_changes_nothing_and_a_failed_reply_gives_the_turn_back() -> None:
    c = _cut()
    before = (c.turns(), c.stats(), c.all_versions())
    assert turns.undo_reply(c, turns.begin_continue(c)) is None
    assert (c.turns(), c.stats(), c.all_versions()) == before
    c.add("user", "And another?")
    assert turns.undo_reply(c, turns.PendingReply()) == "And another?" and len(c) == 2


def test_continue_is_refused_unless_the_last_reply_was_cut() -> None:
    c = Conversation()
    c.add("user", "Hello")
    assert not turns.can_continue(c)
    with pytest.raises(ValueError, match="cut off"):
        turns.begin_continue(c)
    turns.finish_reply(c, turns.PendingReply(), "Hi.", FinishReason.STOP, [], ReplyStats(0.1, None, 1), 8)
    assert turns.ends_with_reply(c) and not turns.can_continue(c)


def test_regenerate_keeps_versions_and_one_that_writes_nothing_puts_the_reply_back() -> None:
    c = Conversation()
    c.add("user", "Name a colour.")
    turns.finish_reply(c, turns.PendingReply(), "Red.", FinishReason.STOP, [], ReplyStats(0.1, None, 1), None)
    pending = turns.begin_regenerate(c)
    assert not turns.ends_with_reply(c) and turns.versions_shown(c) == (0, 0)
    end = turns.finish_reply(c, pending, "", FinishReason.CANCELLED, [], None, None)
    assert not end.added and end.kept == "stopped before it began" and c.turns()[-1]["content"] == "Red."
    pending = turns.begin_regenerate(c)
    pending.add("Blue.")
    turns.finish_reply(c, pending, "Blue.", FinishReason.STOP, [], ReplyStats(0.2, None, 1), None)
    assert c.versions(1) == ["Red.", "Blue."] and turns.versions_shown(c) == (1, 2)
    assert turns.undo_reply(c, turns.begin_regenerate(c)) is None and c.turns()[-1]["content"] == "Blue."


def test_dropped_turns_are_no_longer_sent_and_said() -> None:
    c = Conversation("Be brief.")
    for i in range(3):
        c.add("user", f"Q{i}")
        c.add("assistant", f"A{i}")
    c.add("user", "Q3")
    dropped = [{"role": "user", "content": "Q0"}, {"role": "assistant", "content": "A0"}]
    end = turns.finish_reply(c, turns.PendingReply(), "A3", FinishReason.STOP, dropped,
                             ReplyStats(0.1, None, 1), None)
    assert end.notes == ("context full: the 2 oldest messages were dropped to make room",)
    assert c.first_sent == 2 and c.messages()[1] == {"role": "user", "content": "Q1"}
    assert c.stats()[7].note == end.note and len(c) == 8  # still shown
    assert turns.drop_oldest(c, [{"role": "system", "content": "Be brief."}]) == "" and c.first_sent == 2


def test_closing_the_app_keeps_what_was_written_in_place() -> None:
    c = _cut()
    pending = turns.begin_continue(c)
    assert not turns.keep_cut(c, pending, None).added  # nothing new: the reply stays as it was cut
    pending.add(" warm")
    end = turns.keep_cut(c, pending, ReplyStats(0.3, None, 1))
    assert end.added and c.turns()[-1]["content"] == "Red is warm" and c.versions(1) == ["Red is warm"]
    assert c.stats()[1].note == turns.CLOSED and c.stats()[1].n_tokens == 4 and turns.can_continue(c)
    c.add("user", "More?")
    pending = turns.PendingReply()
    pending.add("Yes")
    turns.keep_cut(c, pending, ReplyStats(0.3, None, 1))
    assert c.turns()[-1] == {"role": "assistant", "content": "Yes"} and c.stats()[3].note == turns.CLOSED


def test_joined_stats_without_speeds() -> None:
    one = ReplyStats(0.4, None, 1, "Reply stopped")
    assert turns.joined_stats(one, ReplyStats(0.9, None, 1)) == ReplyStats(0.4, None, 2)
    assert turns.joined_stats(None, one) == one and turns.joined_stats(one, None) == one
