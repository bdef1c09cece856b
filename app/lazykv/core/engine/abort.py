"""A context's abort callback, watched around long decodes (Qt-free)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import llama_cpp


class AbortWatch:
    """The context's abort callback: a decode in progress stops between graph nodes once the watched
    token is set (llama_decode then returns 2 and keeps the micro-batches it finished).

    Installed only around long decodes (a prompt being read, a transcript re-read): the callback is
    Python, called once per graph node, and needs the GIL each time; while tokens stream, the GUI
    thread runs Python and the reply is stopped between pieces instead."""

    def __init__(self, ctx: llama_cpp.llama_context_p, token: Callable[[], threading.Event | None]) -> None:
        self._ctx = ctx
        self._token = token
        self._callback = llama_cpp.ggml_abort_callback(self._aborted)  # kept alive with this object

    def _aborted(self, _data: ctypes.c_void_p) -> bool:
        token = self._token()
        return token is not None and token.is_set()

    @contextmanager
    def installed(self) -> Iterator[None]:
        llama_cpp.llama_set_abort_callback(self._ctx, self._callback, None)
        try:
            yield
        finally:
            llama_cpp.llama_set_abort_callback(self._ctx, llama_cpp.ggml_abort_callback(), None)
