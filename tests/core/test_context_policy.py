"""The context-full policy with a token counter of one token per word plus 4 per message."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from lazykv.core.chat.context_policy import MIN_REPLY_ROOM, fit_messages, reply_room
from lazykv.core.errors import ContextFullError


def count(messages: Sequence[dict[str, str]]) -> int:
    return sum(4 + len(m["content"].split()) for m in messages)


def turns(*sizes: int) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": " ".join([f"w{i}"] * n)} for i, n in enumerate(sizes)]


SYSTEM = {"role": "system", "content": "be nice"}


def test_everything_is_sent_while_it_fits() -> None:
    messages = [SYSTEM, *turns(10, 10, 10)]
    for policy in ("stop", "drop_oldest"):
        fitted = fit_messages(messages, count, n_ctx=1000, policy=policy)
        assert fitted.messages == messages and fitted.dropped == [] and fitted.n_prompt == count(messages)


def test_stop_refuses_with_the_sizes() -> None:
    too_long = r"conversation \(\d+ tokens\) no longer fits the context of 100"
    with pytest.raises(ContextFullError, match=too_long):
        fit_messages([SYSTEM, *turns(40, 40, 30)], count, n_ctx=100, policy="stop")


def test_drop_oldest_drops_whole_turns_and_keeps_the_system_prompt_and_last_message() -> None:
    messages = [SYSTEM, *turns(30, 30, 30, 30, 5)]
    fitted = fit_messages(messages, count, n_ctx=128, policy="drop_oldest")
    assert fitted.messages[0] == SYSTEM
    assert fitted.messages[-1] == messages[-1]
    assert fitted.dropped == messages[1 : 1 + len(fitted.dropped)]
    assert fitted.dropped[0]["role"] == "user" and len(fitted.dropped) % 2 == 0
    assert fitted.n_prompt + reply_room(128, None) <= 128


def test_drop_oldest_cannot_drop_the_last_message() -> None:
    with pytest.raises(ContextFullError, match="Even the last message alone"):
        fit_messages([SYSTEM, *turns(10, 10, 500)], count, n_ctx=256, policy="drop_oldest")


def test_reply_room_is_bounded_by_a_quarter_of_the_context() -> None:
    assert reply_room(4096, None) == 512
    assert reply_room(1024, None) == 256
    assert reply_room(4096, 64) == 64
    assert reply_room(32, None) == MIN_REPLY_ROOM


def test_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown context-full policy"):
        fit_messages(turns(1), count, n_ctx=100, policy="truncate")


def test_drop_oldest_counts_a_few_prompts_not_one_per_dropped_turn() -> None:
    """Issue 17.14: with 4,000 messages each dropped turn counted the whole rest again (with a real
    model a second of tokenizing every time: a reply in such a conversation took half an hour)."""
    messages = [SYSTEM, *turns(*[10] * 4000)]
    sizes: list[int] = []

    def counting(ms: Sequence[dict[str, str]]) -> int:
        sizes.append(len(ms))
        return count(ms)

    fitted = fit_messages(messages, counting, n_ctx=1024, policy="drop_oldest")
    limit = 1024 - reply_room(1024, None)
    assert fitted.n_prompt == count(fitted.messages) <= limit
    assert count([SYSTEM, *fitted.dropped[-2:], *fitted.messages[1:]]) > limit  # the fewest turns dropped
    assert fitted.messages[0] == SYSTEM and fitted.dropped == messages[1 : 1 + len(fitted.dropped)]
    assert len(sizes) <= 30 and sum(sizes) < 2 * len(messages)


def test_drop_oldest_drops_what_dropping_one_turn_at_a_time_drops() -> None:
    """The same turns as the plain rule (drop the oldest turn until the rest fits), system messages
    anywhere and turns of several replies included."""
    rng = random.Random(7)
    for _ in range(300):
        roles = ["system"] + [rng.choice(("user", "user", "assistant", "system"))
                              for _ in range(rng.randint(1, 30))]
        messages = [{"role": r, "content": " ".join(["w"] * rng.randint(1, 40))} for r in roles]
        n_ctx = rng.randint(64, 600)
        try:
            expected: object = _dropping_one_turn_at_a_time(messages, n_ctx)
        except ContextFullError:
            expected = ContextFullError
        try:
            fitted = fit_messages(messages, count, n_ctx=n_ctx, policy="drop_oldest")
            got: object = (fitted.messages, fitted.dropped)
        except ContextFullError:
            got = ContextFullError
        assert got == expected


def _dropping_one_turn_at_a_time(messages: list[dict[str, str]], n_ctx: int
                                 ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    kept, dropped = list(messages), []
    if count(kept) + reply_room(n_ctx, None) <= n_ctx:
        return kept, dropped
    while count(kept) > n_ctx - reply_room(n_ctx, None):
        start = next((i for i, m in enumerate(kept) if m["role"] != "system"), len(kept))
        if start >= len(kept) - 1:
            raise ContextFullError("nothing left to drop")
        end = start + 1
        while end < len(kept) - 1 and kept[end]["role"] not in ("user", "system"):
            end += 1
        dropped += kept[start:end]
        del kept[start:end]
    return kept, dropped
