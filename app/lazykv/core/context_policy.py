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

    dropped: list[dict[str, str]] = []
    limit = n_ctx - reply_room(n_ctx, max_tokens)
    while n_prompt > limit:
        turn = _oldest_turn(kept)
        if turn is None:
            raise ContextFullError(
                f"Even the last message alone ({n_prompt} tokens with the system prompt) does not "
                f"fit the context of {n_ctx} tokens with room for a reply. Shorten it or raise the "
                "context length."
            )
        start, end = turn
        dropped.extend(kept[start:end])
        del kept[start:end]
        n_prompt = count_tokens(kept)
    return Fitted(kept, dropped, n_prompt)


def _oldest_turn(messages: list[dict[str, str]]) -> tuple[int, int] | None:
    """[start, end) of the oldest droppable turn: not a system message, never the last message."""
    start = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
    if start is None or start >= len(messages) - 1:
        return None
    end = start + 1
    while end < len(messages) - 1 and messages[end]["role"] not in ("user", "system"):
        end += 1
    return start, end
