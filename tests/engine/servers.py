"""Real server processes for the engine tests (``kvtier.bench.servers``, shared with benches)."""

from kvtier.bench.servers import (
    KVTIER,
    WAIT_S,
    Server,
    free_port,
    launch,
    post,
    sample,
    serve_command,
    stop,
    wait,
    wait_healthy,
)

__all__ = [
    "KVTIER",
    "WAIT_S",
    "Server",
    "free_port",
    "launch",
    "post",
    "sample",
    "serve_command",
    "stop",
    "wait",
    "wait_healthy",
]
