"""The "Local server" switch: the local API served from the window's engine (real SmolLM2, slow)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import openai
from pytestqt.qtbot import QtBot

from lazykv.server.service import free_port
from tests.qt.test_main_window import REPLY_TIMEOUT_MS, chat, open_window

OTHER = [{"role": "system", "content": "You are an expert on trains."},
         {"role": "user", "content": "Which is the fastest train?"}]


def _ask(qtbot: QtBot, client: openai.OpenAI, **kwargs: Any) -> Any:
    """A blocking client call on a thread of its own, the GUI's event loop running meanwhile."""
    answer: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answer.update(reply=client.chat.completions.create(**kwargs)))
    thread.start()
    qtbot.waitUntil(lambda: not thread.is_alive(), timeout=REPLY_TIMEOUT_MS)
    return answer["reply"]


def test_a_server_request_leaves_the_open_chat_its_cache(qtbot: QtBot, smollm2_path: Path) -> None:
    port = free_port()
    w = open_window(qtbot, smollm2_path, local_server=True, local_server_port=port)
    try:
        label = w.local_server.label
        qtbot.waitUntil(label.isVisible, timeout=10_000)
        assert label.text() == f"Local API http://127.0.0.1:{port}/v1"
        first = chat(qtbot, w, "Name a colour.")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct.Q4_1"]
        reply = _ask(qtbot, client, model="m", messages=OTHER, max_tokens=4)
        assert reply.choices[0].message.content and reply.usage.prompt_tokens > 10
        second = chat(qtbot, w, "And another one?")
        assert second.n_reused >= first.n_prompt  # the chat's cache was put back after the request
        w.apply_settings({"local_server": False})
        qtbot.waitUntil(lambda: not label.isVisible())
        qtbot.waitUntil(lambda: _refused(port), timeout=10_000)
    finally:
        w.close()


def _refused(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    except httpx.TransportError:
        return True
    return False
