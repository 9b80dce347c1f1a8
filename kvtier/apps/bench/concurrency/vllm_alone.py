"""vLLM's OpenAI server with no KV connector, started as ``kvtier serve`` starts it: the baseline
the benchmarks time ``kvtier serve`` against.

    python -m kvtier.apps.bench.concurrency.vllm_alone MODEL [vllm serve args]

As ``kvtier serve`` (``serve.serve_vllm``): ``vllm serve`` in this process, ``--host 127.0.0.1``
unless given; no ``--kv-transfer-config`` is added.
"""

from __future__ import annotations

import sys

from kvtier.apps.serve import DEFAULT_HOST, serve_vllm


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
    return serve_vllm(lambda _cpu_only, _sockets: [*argv, *host])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
