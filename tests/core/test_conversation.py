from __future__ import annotations

import pytest

from lazykv.core.chat.conversation import Conversation, ReplyStats


def test_messages_are_copies_in_order() -> None:
    conversation = Conversation()
    conversation.add("user", "hi")
    conversation.add("assistant", "hello")
    messages = conversation.messages()
    assert messages == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    messages[0]["content"] = "changed"
    messages.clear()
    assert conversation.messages()[0]["content"] == "hi"
    assert len(conversation) == 2


def test_system_prompt_leads_the_messages_when_set() -> None:
    conversation = Conversation("Be brief.")
    conversation.add("user", "hi")
    assert conversation.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    conversation.system_prompt = "  "
    assert conversation.messages() == [{"role": "user", "content": "hi"}]


def test_pop_takes_back_the_last_turn() -> None:
    conversation = Conversation()
    conversation.add("user", "hi")
    assert conversation.pop() == {"role": "user", "content": "hi"}
    assert len(conversation) == 0


def test_truncate_for_edit_and_resend_drops_later_turns_and_their_markers() -> None:
    conversation = Conversation()
    for role, text in (("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")):
        conversation.add(role, text)
    conversation.add_marker(1, 1, "early")
    conversation.add_marker(3, 0, "late")
    removed = conversation.truncate(2)
    assert [t["content"] for t in removed] == ["c", "d"]
    assert [t["content"] for t in conversation.turns()] == ["a", "b"]
    assert [m.label for m in conversation.markers()] == ["early"]
    assert conversation.last_index("user") == 0 and conversation.last_index("assistant") == 1


def test_forgotten_turns_stay_visible_but_are_not_sent() -> None:
    conversation = Conversation("sys")
    for role, text in (("user", "a"), ("assistant", "b"), ("user", "c")):
        conversation.add(role, text)
    conversation.forget_oldest(2)
    assert [t["content"] for t in conversation.turns()] == ["a", "b", "c"]
    assert conversation.messages() == [{"role": "system", "content": "sys"}, {"role": "user", "content": "c"}]
    conversation.truncate(1)
    assert conversation.first_sent == 1 and conversation.messages() == [{"role": "system", "content": "sys"}]


@pytest.mark.parametrize("role", ["robot", "system"])
def test_turn_roles_are_user_or_assistant(role: str) -> None:
    with pytest.raises(ValueError, match="user or assistant"):
        Conversation().add(role, "beep")  # type: ignore[arg-type]


def test_a_regenerated_reply_keeps_every_version_and_the_chat_continues_from_the_one_chosen() -> None:
    c = Conversation()
    c.add("user", "Name a colour.")
    c.add("assistant", "Red.")
    assert c.versions(1) == ["Red."] and c.all_versions() == {}
    c.take_back_reply()
    assert len(c) == 1
    c.add("assistant", "Blue.")
    c.take_back_reply()
    c.add("assistant", "Green.")
    assert c.versions(1) == ["Red.", "Blue.", "Green."] and c.version_shown(1) == 2
    c.choose_version(0)
    assert c.turns()[1]["content"] == "Red." and c.version_shown(1) == 0
    assert c.messages()[-1] == {"role": "assistant", "content": "Red."}  # what the next reply reads
    c.add("user", "Another?")
    assert c.all_versions() == {1: ["Red.", "Blue.", "Green."]}
    c.truncate(1)  # an edit before the reply: its versions go with it
    assert c.all_versions() == {}


def test_a_taken_back_reply_not_replaced_at_its_place_joins_nothing() -> None:
    c = Conversation()
    c.add("user", "Hi")
    c.add("assistant", "Hello")
    c.take_back_reply()
    c.pop()  # the regeneration failed and its prompt went back to the input box
    c.add("user", "Hi again")
    c.add("assistant", "Hello again")
    assert c.all_versions() == {}
    c.pop()
    with pytest.raises(ValueError, match="not a reply"):  # the last turn is the user's
        c.take_back_reply()


def test_a_reply_taken_back_and_put_back_is_as_it_was() -> None:
    """A regenerate that gives no reply (stopped before its first word, or failed) loses nothing."""
    c = Conversation()
    c.add("user", "Name a colour.")
    c.add("assistant", "Red.")
    c.set_stats(1, ReplyStats(0.5, 10.0, 2, "Reply stopped"))
    c.add_marker(1, 2, "8-bit KV from here")
    c.take_back_reply()
    c.add("assistant", "Blue.")
    c.set_stats(1, ReplyStats(0.2, 20.0, 2))
    before = (c.turns(), c.all_versions(), c.stats(), c.markers(), c.version_shown(1))
    c.choose_version(0)
    c.choose_version(1)
    c.take_back_reply()
    assert c.regenerating and len(c) == 1
    assert c.put_back_reply() and not c.regenerating
    assert (c.turns(), c.all_versions(), c.stats(), c.markers(), c.version_shown(1)) == before
    c.choose_version(0)  # the other version still has its own figures
    assert c.stats()[1].note == "Reply stopped"
    assert not c.put_back_reply()  # nothing taken back
    c.take_back_reply()
    c.add("assistant", "Green.")
    assert not c.put_back_reply() and c.versions(1) == ["Red.", "Blue.", "Green."]
