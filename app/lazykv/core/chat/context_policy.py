"""What happens when a conversation no longer fits the context: stop, or drop the oldest turns.

Never silent: the caller gets either the messages that fit together with the ones dropped,
or a ContextFullError that says how large the conversation is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lazykv.core.errors import ContextFullError
from lazykv.core.kinds import ContextFullPolicy

MIN_REPLY_ROOM = 16  # a prompt leaving less room than this for the reply counts as full
DEFAULT_REPLY_ROOM = 512


@dataclass(frozen=True)
class Fitted:
    messages: list[dict[str, str]]
    dropped: list[dict[str, str]]
    n_prompt: int  # tokens of the prompt made from ``messages``


def reply_room(n_ctx: int, max_tokens: int | None) -> int:
    """Tokens kept free for the reply when older turns are dropped."""
    wanted = max_tokens if max_tokens else DEFAULT_REPLY_ROOM
    return max(MIN_REPLY_ROOM, min(wanted, n_ctx // 4))


def fit_messages(
    messages: Sequence[dict[str, str]],
    count_tokens: Callable[[Sequence[dict[str, str]]], int],
    n_ctx: int,
    policy: str,
    max_tokens: int | None = None,
) -> Fitted:
    """Return the messages to send under ``policy``; raise ContextFullError when none fit.

    ``stop`` sends everything or refuses; ``drop_oldest`` removes the oldest turns (a user
    message with the replies that follow it), never the system prompt or the last message.
    """
    try:
        policy = ContextFullPolicy(policy)
    except ValueError:
        known = ", ".join(ContextFullPolicy)
        raise ValueError(f"unknown context-full policy {policy!r} (known: {known})") from None
    kept = [dict(m) for m in messages]
    n_prompt = count_tokens(kept)
    if n_prompt + MIN_REPLY_ROOM <= n_ctx:
        if policy is ContextFullPolicy.STOP or n_prompt + reply_room(n_ctx, max_tokens) <= n_ctx:
            return Fitted(kept, [], n_prompt)
    if policy is ContextFullPolicy.STOP:
        raise ContextFullError(
            f"The conversation ({n_prompt} tokens) no longer fits the context of {n_ctx} tokens. "
            "Start a new chat, raise the context length, or let older turns be dropped "
            "(Settings > When the context is full)."
        )

    limit = n_ctx - reply_room(n_ctx, max_tokens)
    cuts = _turn_ends(kept)
    counted = {0: n_prompt}  # prompt sizes by turns dropped

    def n_tokens(drops: int) -> int:  # the prompt's size without the ``drops`` oldest turns
        if drops not in counted:
            counted[drops] = count_tokens(_without(kept, cuts, drops)[0])
        return counted[drops]

    if not cuts or n_tokens(len(cuts)) > limit:
        raise ContextFullError(
            f"Even the last message alone ({n_tokens(len(cuts))} tokens with the system prompt) does not "
            f"fit the context of {n_ctx} tokens with room for a reply. Shorten it or raise the "
            "context length."
        )
    drops = _fewest_drops(len(cuts), lambda d: n_tokens(d) <= limit)
    messages_kept, dropped = _without(kept, cuts, drops)
    return Fitted(messages_kept, dropped, n_tokens(drops))


def _turn_ends(messages: list[dict[str, str]]) -> list[int]:
    """Where the oldest turns end, oldest first: a turn is a user message with the replies after it;
    system messages are never dropped, nor the last message."""
    ends: list[int] = []
    start = 0
    while True:
        start = next((i for i in range(start, len(messages)) if messages[i]["role"] != "system"),
                     len(messages))
        if start >= len(messages) - 1:
            return ends
        end = start + 1
        while end < len(messages) - 1 and messages[end]["role"] not in ("user", "system"):
            end += 1
        ends.append(end)
        start = end


def _without(messages: list[dict[str, str]], ends: list[int], drops: int
             ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(kept, dropped) when the ``drops`` oldest turns are left out."""
    cut = ends[drops - 1] if drops else 0
    head = messages[:cut]
    kept = [m for m in head if m["role"] == "system"] + messages[cut:]
    return kept, [m for m in head if m["role"] != "system"]


def _fewest_drops(most: int, fits: Callable[[int], bool]) -> int:
    """The fewest oldest turns to drop so that the rest fits (``fits(most)`` holds; fewer drops never
    make a prompt smaller). Counts from the newest end, doubling the turns kept, then halves the gap:
    a few prompts of about the size that is sent, not one per dropped turn (with 4,000 messages each
    count tokenized the whole conversation again, a second every time)."""
    kept = 1
    while kept <= most and fits(most - kept):
        kept *= 2
    fitting, too_many = most - kept // 2, max(-1, most - kept)  # fits(fitting); not fits(too_many)
    while fitting - too_many > 1:
        middle = (fitting + too_many) // 2
        if fits(middle):
            fitting = middle
        else:
            too_many = middle
    return fitting
