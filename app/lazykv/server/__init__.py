"""The local OpenAI-compatible API: another client of ``lazykv.core``, like the window (never Qt, never
``llama_cpp`` directly).

    settings.py      what a server is started with (host, key, limits, cache budget), checked once
    types.py         the OpenAI request and response schemas (pydantic), and the error shape
    engine_access.py the engine's one thread: a bounded queue of generations, each cancellable
    prefix_cache.py  encrypted KV snapshots keyed by token prefix, kept across restarts (LRU in GiB)
    app.py           the routes (Starlette), authentication, body limits, streaming (SSE)

``python -m lazykv serve`` (lazykv/cli/serve.py) puts them together.
"""
