"""The peer tier: a prefill engine's KV pulled by its decode engine (prefill→decode)."""
