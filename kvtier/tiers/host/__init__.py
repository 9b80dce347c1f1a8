"""The host-memory tier: pinned buffers of chunks, the first tier below the engine."""
