"""Conversation operations for tests, made of the ones the app uses (``Store.sync_transcript`` and
``Store.conversation``), so that the tests exercise the paths the app takes."""

from __future__ import annotations

from lazykv.core.history.records import DEFAULT_TITLE, Synced, new_uid
from lazykv.core.history.store import Store


def create_conversation(
    store: Store, title: str = DEFAULT_TITLE, system_prompt: str = "", settings: dict | None = None
) -> int:
    """A new empty conversation's id, created as the app creates one (by a new uid)."""
    return store.sync_transcript(new_uid(), [], 0, title=title, system_prompt=system_prompt,
                                 settings=settings or {}, create=True).id  # fmt: skip


def append_message(store: Store, conv_id: int, role: str, content: str) -> Synced:
    """Add one message after the conversation's last one."""
    record = store.conversation(conv_id)
    return store.sync_transcript(record.uid, [*record.messages, {"role": role, "content": content}],
                                 len(record.messages), system_prompt=record.system_prompt)  # fmt: skip


def stored_messages(store: Store, conv_id: int) -> list[dict]:
    """The conversation's stored transcript."""
    return store.conversation(conv_id).messages


def set_system_prompt(store: Store, conv_id: int, text: str) -> Synced:
    record = store.conversation(conv_id)
    return store.sync_transcript(record.uid, record.messages, len(record.messages), system_prompt=text)


def set_settings(store: Store, conv_id: int, settings: dict) -> Synced:
    record = store.conversation(conv_id)
    return store.sync_transcript(record.uid, record.messages, len(record.messages),
                                 system_prompt=record.system_prompt, settings=settings)  # fmt: skip


def snapshot_bytes(store: Store) -> int:
    """Total size of the snapshots the conversations point at, each file counted once."""
    refs = (store.conversation(s.id).snapshot for s in store.list_conversations())
    return sum({ref.sha256: ref.size for ref in refs if ref is not None}.values())
