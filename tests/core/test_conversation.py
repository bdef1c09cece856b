from __future__ import annotations

import pytest

from lazykv.core.conversation import Conversation


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


def test_pop_takes_back_the_last_turn() -> None:
    conversation = Conversation()
    conversation.add("user", "hi")
    assert conversation.pop() == {"role": "user", "content": "hi"}
    assert len(conversation) == 0


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        Conversation().add("robot", "beep")  # type: ignore[arg-type]
