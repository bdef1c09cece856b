"""Tool calls and their results as turns of a conversation (core/chat): what the engine is sent (OpenAI's
shape, no app keys), what the history keeps (the call's status too), how regenerate and continue treat
them, and the turns a bad caller is refused."""

from __future__ import annotations

import pytest

from lazykv.core.chat import turns
from lazykv.core.chat.conversation import (
    Conversation,
    ReplyStats,
    check_turn,
    tool_label,
    tool_result_note,
)
from lazykv.core.kinds import FinishReason, ToolStatus

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "files__read", "arguments": '{"path": "<b>notes</b>.txt"}'}}
CALL_2 = {"id": "call_2", "type": "function", "function": {"name": "clock__now", "arguments": "{}"}}


def _asked() -> Conversation:
    c = Conversation("Be brief.")
    c.add("user", "What do my notes say?")
    c.add_tool_calls("Let me look.", [CALL, CALL_2])
    return c


def _answered() -> Conversation:
    """A tool round done: the calls, their results (one denied), the reply after them."""
    c = _asked()
    c.add_tool_result("call_1", "files__read", "Buy milk.", truncated=True)
    c.add_tool_result("call_2", "clock__now", "The user denied this call.", ToolStatus.DENIED)
    c.add("assistant", "Your notes say: buy milk.")
    return c


def test_the_engine_is_sent_openai_messages_and_the_history_keeps_the_status() -> None:
    c = _answered()
    assert c.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What do my notes say?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL, CALL_2]},
        {"role": "tool", "tool_call_id": "call_1", "name": "files__read", "content": "Buy milk."},
        {"role": "tool", "tool_call_id": "call_2", "name": "clock__now",
         "content": "The user denied this call."},
        {"role": "assistant", "content": "Your notes say: buy milk."},
    ]
    kept = c.turns()  # no system prompt: it is not a turn
    assert kept[2]["tool"] == {"status": "ok", "truncated": True, "server": "files", "tool": "read"}
    assert kept[3]["tool"]["status"] == ToolStatus.DENIED
    assert [check_turn(t) for t in c.turns()] == c.turns()  # what is stored reads back as a turn


def test_what_is_handed_out_is_a_copy() -> None:
    c = _answered()
    sent, kept = c.messages(), c.turns()
    sent[2]["tool_calls"][0]["function"]["arguments"] = "changed"
    kept[3]["tool"]["status"] = "error"
    assert c.messages()[2]["tool_calls"][0] == CALL
    assert c.turns()[3]["tool"]["status"] == "denied"


def test_a_result_answers_a_call_that_waits_for_one() -> None:
    c = _asked()
    assert [call["id"] for call in c.pending_tool_calls()] == ["call_1", "call_2"]
    c.add_tool_result("call_2", "clock__now", "noon")
    assert [call["id"] for call in c.pending_tool_calls()] == ["call_1"]
    with pytest.raises(ValueError, match="no tool call 'call_2' waits"):
        c.add_tool_result("call_2", "clock__now", "noon again")
    with pytest.raises(ValueError, match="no tool call 'call_9' waits"):
        c.add_tool_result("call_9", "clock__now", "?")
    c.add_tool_result("call_1", "files__read", "Buy milk.")
    assert c.pending_tool_calls() == []
    c.add("assistant", "Done.")
    assert c.pending_tool_calls() == []
    with pytest.raises(ValueError, match="add_tool_result"):
        c.add("tool", "output")  # type: ignore[arg-type]


def test_a_tool_call_turn_is_checked() -> None:
    c = Conversation()
    c.add("user", "hi")
    with pytest.raises(ValueError, match="one call or more"):
        c.add_tool_calls("", [])
    with pytest.raises(ValueError, match="the type 'function'"):
        c.add_tool_calls("", [{**CALL, "type": "web"}])
    with pytest.raises(ValueError, match="arguments"):
        c.add_tool_calls("", [{**CALL, "function": {"name": "x", "arguments": {"a": 1}}}])
    with pytest.raises(ValueError, match="status must be one of"):
        check_turn({"role": "tool", "tool_call_id": "c", "name": "n", "content": "",
                    "tool": {"status": "fine", "truncated": False, "server": "", "tool": "n"}})
    with pytest.raises(ValueError, match="role, content, name and tool_call_id"):
        check_turn({"role": "tool", "content": "out"})
    assert len(c) == 1


def test_regenerating_the_reply_after_the_results_keeps_the_tool_turns() -> None:
    c = _answered()
    assert turns.ends_with_reply(c)
    pending = turns.begin_regenerate(c)
    assert c.messages()[-1]["role"] == "tool"  # the engine is sent the results to answer again
    end = turns.finish_reply(c, pending, "Milk, it says.", FinishReason.STOP, [], None, None)
    assert end.added and len(c) == 5 and c.asks_for_tools(1)
    assert c.versions(4) == ["Your notes say: buy milk.", "Milk, it says."]
    assert turns.page_version(c, -1) and c.shown()[4]["content"] == "Your notes say: buy milk."


def test_a_reply_that_asks_for_tools_ends_with_its_calls_and_is_never_continued() -> None:
    c = Conversation()
    c.add("user", "What time is it?")
    pending = turns.PendingReply()
    end = turns.finish_reply(c, pending, "", FinishReason.STOP, [], ReplyStats(0.2, 30.0, 12), None,
                             tool_calls=[CALL_2])
    assert end.added and c.shown()[-1] == {"role": "assistant", "content": "", "tool_calls": [CALL_2]}
    assert c.stats()[1].n_tokens == 12
    assert not turns.can_continue(c)
    with pytest.raises(ValueError, match="asks for tools"):
        c.extend_reply("more")
    cut = Conversation()
    cut.add("user", "hi")
    cut.add("assistant", "Hel")
    cut.set_stats(1, ReplyStats(0.1, 5.0, 2, turns.STOPPED))
    with pytest.raises(ValueError, match="cannot ask for tools"):
        turns.finish_reply(cut, turns.begin_continue(cut), "lo", FinishReason.STOP, [], None, None,
                           tool_calls=[CALL])


def test_a_tool_call_turn_taken_back_returns_whole_and_is_no_version_of_the_next_reply() -> None:
    c = _asked()
    c.take_back_reply()
    assert c.put_back_reply() and c.shown()[-1]["tool_calls"] == [CALL, CALL_2]
    c.take_back_reply()
    c.add("assistant", "I cannot read files.")
    assert c.versions(1) == ["I cannot read files."]  # not "Let me look." without its calls


def test_the_oldest_turns_dropped_count_tool_turns_one_each() -> None:
    c = _answered()
    c.add("user", "Thanks")
    dropped = c.messages()[1:6]  # the first exchange, tool turns included, as the engine dropped it
    assert turns.drop_oldest(c, dropped) == "context full: the 5 oldest messages were dropped to make room"
    assert c.messages()[1:] == [{"role": "user", "content": "Thanks"}]


def test_a_tool_in_words() -> None:
    assert tool_label("files__read") == "files › read"
    assert tool_label("plain") == "plain"
    assert tool_label("x__y", "My server", "read") == "My server › read"
    c = _answered()
    assert tool_result_note(c.shown()[2]) == "output cut to fit"
    assert tool_result_note(c.shown()[3]) == "denied by the user"
