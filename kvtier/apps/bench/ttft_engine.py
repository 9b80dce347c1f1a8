"""An in-process vLLM engine for the TTFT benchmarks.

on_engine(setup, config, body)  ``body(llm)`` on a fresh engine, the only one in the process
EngineHost                      one engine and the commands a bench sends it (``ttft_process``)
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kvtier.apps.bench.ttft_setup import Setup
from kvtier.apps.bench.ttft_timing import (
    Sample,
    Served,
    own_cpu_seconds,
    reset_prefix_cache,
    served,
)
from kvtier.apps.bench.ttft_timing import timed as timed_request

if TYPE_CHECKING:
    from vllm import LLM

    from kvtier.counters import KVTierStats

T = TypeVar("T")


def on_engine(setup: Setup, config: str, body: Callable[[LLM], T]) -> T:
    """``body`` on a fresh engine of ``config``, the only one alive; torn down after it.

    ``body`` must not keep the engine: an old engine collected later would tear down the
    process-wide distributed state of the next one.
    """
    import vllm

    llm = vllm.LLM(**setup.engine_args(setup.transfer(config)))
    try:
        result = body(llm)
    finally:
        engine = weakref.ref(llm)
        del llm
        _collect()
        vllm.distributed.cleanup_dist_env_and_memory()
    if engine() is not None:
        raise RuntimeError(f"kvtier bench ttft: the {config} engine is still referenced")
    return result


def _collect() -> None:
    gc.unfreeze()  # the in-process EngineCore froze its startup heap (KV cache included)
    gc.collect()


class EngineHost:
    """One in-process engine, built from ``vllm.LLM`` keyword arguments, and its commands.

    The host owns the engine for the life of its process: vLLM keeps one worker-side KV
    connector per process, so an engine with kvtier and one without cannot share a process.
    """

    def __init__(self, engine_args: dict[str, Any]) -> None:
        import vllm

        self.llm = vllm.LLM(**engine_args)
        self.kvtier = engine_args.get("kv_transfer_config", None) is not None and (
            engine_args["kv_transfer_config"]["kv_connector"] == "KVTierConnector"
        )

    def commands(self) -> dict[str, Callable[..., Any]]:
        """The commands by name, as ``ttft_process.EngineProcess.call`` sends them."""
        return {
            "ttft": self.ttft,
            "reset_prefix_cache": self.reset_prefix_cache,
            "settle": self.settle,
            "kvtier_stats": self.kvtier_stats,
            "serve": self.serve,
            "cpu_seconds": own_cpu_seconds,
        }

    def ttft(self, prompt: list[int]) -> Sample:
        """One ``max_tokens=1`` request, timed (``ttft_timing.timed``)."""
        return timed_request(self.llm, prompt)

    def reset_prefix_cache(self) -> None:
        reset_prefix_cache(self.llm)

    def settle(self) -> None:
        """With kvtier: step until no transfer is in flight (``kvtier.vllm.settle``)."""
        if self.kvtier:
            from kvtier.vllm import settle

            settle(self.llm)

    def kvtier_stats(self) -> KVTierStats:
        """A snapshot of kvtier's counters (``kvtier.vllm.stats``)."""
        from kvtier.vllm import stats

        return stats(self.llm)  # pickled on the way out: a copy

    def serve(self, prompts: list[list[int]], max_tokens: int) -> Served:
        """A batch served together; with kvtier, its stores drained (``ttft_timing.served``)."""
        return served(self.llm, prompts, max_tokens, drain=self.kvtier)
