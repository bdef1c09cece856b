"""A conversation exported as Markdown or JSON, and the check an imported one passes.

JSON export carries no snapshot (the context memory is rebuilt from the transcript); ``to_json``'s
output is what ``parse_export`` reads back, and anything else is refused with a sentence that says
what is wrong with it.
"""

from __future__ import annotations

import time
from typing import Any

from lazykv.core.history.records import (
DEFAULT_TITLE,
ConversationRecord,
check_text,
check_time,
clean_title,
settings_json,
validate_message,
)

EXPORT_FORMAT = "lazykv-conversation"
EXPORT_VERSION = 1
_EXPORT_FIELDS = {"format", "version", "title", "system_prompt", "settings", "messages", "created", "updated"}


def to_markdown(record: ConversationRecord) -> str:
    """The conversation as a Markdown document, for reading."""
    title = " ".join(record.title.split()) or DEFAULT_TITLE
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.created))
    parts = [f"# {title}", f"_LazyKV Chat conversation, started {created}_"]
    if record.system_prompt:
        parts += ["## System prompt", record.system_prompt]
    for message in record.messages:
        parts += [f"## {message['role'].capitalize()}", message["content"]]
    return "\n\n".join(parts) + "\n"


def to_json(record: ConversationRecord) -> dict:
    """The conversation as a JSON-able dict (no snapshot); ``parse_export`` reads it back."""
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "title": record.title,
        "system_prompt": record.system_prompt,
        "settings": record.settings,
        "messages": record.messages,
        "created": record.created,
        "updated": record.updated,
    }


def parse_export(data: Any) -> dict:
    """The fields of an exported conversation, checked against what the app can store and show,
    with settings as JSON text."""
    if not isinstance(data, dict):
        raise ValueError(f"not a LazyKV conversation: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != EXPORT_FORMAT:
        raise ValueError(
            f"not a LazyKV conversation: format is {data.get('format')!r}, not {EXPORT_FORMAT!r}"
        )
    version = data.get("version")
    if type(version) is not int or version != EXPORT_VERSION:
        raise ValueError(
            f"unsupported conversation version {version!r} (this LazyKV Chat reads {EXPORT_VERSION})"
        )
    unknown = sorted(set(data) - _EXPORT_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s) in the conversation: {', '.join(unknown)}")
    missing = sorted(_EXPORT_FIELDS - set(data))
    if missing:
        raise ValueError(f"missing field(s) in the conversation: {', '.join(missing)}")
    if not isinstance(data["messages"], list):
        raise ValueError(f"messages must be a list, not {type(data['messages']).__name__}")
    created = check_time("created", data["created"])
    updated = check_time("updated", data["updated"])
    return {
        "title": clean_title(data["title"]),
        "system_prompt": check_text("system_prompt", data["system_prompt"]),
        "settings": settings_json(data["settings"]),
        "messages": [validate_message(i, m) for i, m in enumerate(data["messages"])],
        "created": created,
        "updated": max(updated, created),
    }
