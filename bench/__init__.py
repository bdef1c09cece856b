"""LazyKV benchmark report: quality, speed and conversion pause of the lazy q8_0 KV cache.

Run with ``python -m bench`` (see bench/README.md); writes bench/results/lazy_kv.md and PNG plots.
"""
