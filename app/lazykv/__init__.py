"""LazyKV Chat: local desktop chat over a patched llama.cpp with a lazy q8_0 KV cache."""

__version__ = "0.1.0"
