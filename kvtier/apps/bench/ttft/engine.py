"""An in-process vLLM engine for the TTFT benchmarks, and the commands a bench sends it.

EngineHost(llm, kvtier)            one engine in this process (the driver's ``Engine``)
EngineHost.of(engine_args)         built from ``vllm.LLM``'s arguments (an engine process's)
on_engine(setup, transfer, body)   ``body(host)`` on a fresh engine, the only one in the process

An in-process engine needs ``common.engine_env``'s variables set before vLLM is imported: the
command that runs the bench sets them (``apply_in_process_env``); ``RuntimeError`` here if not.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from kvtier.apps.bench.common.connector import KVTIER_CONNECTOR
from kvtier.apps.bench.common.connector_clock import ConnectorClock, engine_connectors
from kvtier.apps.bench.common.engine_env import require_in_process_env
from kvtier.apps.bench.common.timing import own_cpu_seconds
from kvtier.apps.bench.ttft.setup import Setup
from kvtier.apps.bench.ttft.timing import Sample, Served, reset_prefix_cache, served, timed
from kvtier.apps.engine_heap import freeze_heap, freeze_survivors

if TYPE_CHECKING:
    from vllm import LLM

    from kvtier.counters import KVTierStats

T = TypeVar("T")


class EngineHost:
    """One in-process engine, built from ``vllm.LLM`` keyword arguments, and its commands.

    The host owns the engine: vLLM keeps one worker-side KV connector per process, so an
    engine with kvtier and one without cannot share a process, nor live one after another
    unless the first was collected (``on_engine``).
    """

    def __init__(self, llm: LLM, kvtier: bool) -> None:
        self.llm = llm
        self.kvtier = kvtier  # kvtier is its connector
        self._clock: ConnectorClock | None = None

    @classmethod
    def of(cls, engine_args: dict[str, Any]) -> EngineHost:
        require_in_process_env()
        import vllm

        freeze_heap()
        return cls(vllm.LLM(**engine_args), _is_kvtier(engine_args))

    def commands(self) -> dict[str, Callable[..., Any]]:
        """The commands by name, as ``process.EngineProcess.call`` sends them."""
        return {
            "ttft": self.ttft,
            "reset_prefix_cache": self.reset_prefix_cache,
            "settle": self.settle,
            "kvtier_stats": self.kvtier_stats,
            "serve": self.serve,
            "cpu_seconds": own_cpu_seconds,
            "connector_seconds": self.connector_seconds,
        }

    def ttft(self, prompt: list[int]) -> Sample:
        """One ``max_tokens=1`` request, timed (``timing.timed``)."""
        return timed(self.llm, prompt)

    def reset_prefix_cache(self) -> None:
        reset_prefix_cache(self.llm)

    def settle(self) -> None:
        """With kvtier: step until no transfer is in flight (``kvtier.vllm.settle``)."""
        if self.kvtier:
            from kvtier.vllm import settle

            settle(self.llm)

    def kvtier_stats(self) -> KVTierStats:
        """A copy of kvtier's counters now (the engine's change in place)."""
        from kvtier.vllm import stats

        return copy.deepcopy(stats(self.llm))

    def connector_seconds(self) -> float:
        """The time the engine's thread spent in its KV connector's calls since the first
        ``connector_seconds`` (``common.connector_clock``; 0.0 then, and without a connector)."""
        if self._clock is None:
            self._clock = ConnectorClock(engine_connectors(self.llm))
        return self._clock.seconds

    def serve(self, prompts: list[list[int]], max_tokens: int) -> Served:
        """A batch served together; with kvtier, its stores drained (``timing.served``)."""
        return served(self.llm, prompts, max_tokens, drain=self.kvtier)


def on_engine(setup: Setup, transfer: dict[str, Any] | None, body: Callable[[EngineHost], T]) -> T:
    """``body`` on a fresh engine (``transfer``: its ``kv_transfer_config``), the only one
    alive; torn down after it.

    ``body`` must not keep the engine: an old engine collected later would tear down the
    process-wide distributed state of the next one.
    """
    require_in_process_env()
    import vllm

    args = setup.engine_args(transfer)
    freeze_heap()
    llm = vllm.LLM(**args)  # made here: a frame vLLM's first import keeps holds no engine after
    host = EngineHost(llm, _is_kvtier(args))
    try:
        result = body(host)
    finally:
        engine = weakref.ref(llm)
        llm.llm_engine.engine_core.shutdown()  # vLLM's teardown: its state, the heap unfrozen
        del llm, host
        freeze_survivors()
    if engine() is not None:
        raise RuntimeError("kvtier bench: an engine is still referenced after its body")
    return result


def _is_kvtier(engine_args: dict[str, Any]) -> bool:
    transfer = engine_args.get("kv_transfer_config")
    return transfer is not None and transfer["kv_connector"] == KVTIER_CONNECTOR
