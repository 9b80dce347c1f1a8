"""Reaching kvtier inside a running ``vllm.LLM``: its counters, each rank's, the connector."""

from __future__ import annotations

import time
from typing import Any

from kvtier.counters import KVTierStats
from kvtier.vllm.connector import KVTierConnector


def engine_connector(llm: Any) -> KVTierConnector:
    """The scheduler-side connector of an in-process ``vllm.LLM`` (tests, demo, benchmarks),
    alone or inside vLLM's MultiConnector."""
    return _ours(scheduler_connector(llm))


def scheduler_connector(llm: Any) -> Any:
    """The KV connector of an in-process ``vllm.LLM``'s scheduler, whatever it is (None: none)."""
    try:
        return llm.llm_engine.engine_core.engine_core.scheduler.connector
    except AttributeError as error:
        raise RuntimeError(
            "kvtier: the engine runs in other processes (VLLM_ENABLE_V1_MULTIPROCESSING=1); "
            "read the 'kvtier:' log lines or vLLM's connector stats instead"
        ) from error


def _ours(connector: Any) -> KVTierConnector:
    """kvtier's connector: ``connector``, or one of a MultiConnector's (RuntimeError: none)."""
    for candidate in (connector, *getattr(connector, "_connectors", ())):
        if isinstance(candidate, KVTierConnector):
            return candidate
    raise RuntimeError(f"kvtier: the engine's connector is {type(connector).__name__}")


def rank_counters(worker: Any) -> dict[str, int]:
    """This worker rank's kvtier counters; for ``llm.collective_rpc(rank_counters)``."""
    from dataclasses import asdict

    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return asdict(_ours(get_kv_transfer_group()).worker.counters)


def stats(llm: Any) -> KVTierStats:
    """kvtier's counters for an in-process ``vllm.LLM``."""
    return engine_connector(llm).scheduler.stats


def settle(llm: Any, timeout_s: float = 600.0) -> None:
    """Step an in-process ``vllm.LLM`` until kvtier has no transfer in flight and vLLM released
    every request (a finished request keeps its blocks until its stores drained; an idle engine
    writes its dirty host chunks to disk). RuntimeError after ``timeout_s`` seconds.

    Steps as ``generate`` does (``step_fn``): with asynchronous scheduling (vLLM's default on
    CUDA) a step may still be queued when ``generate`` returns, its output (and the workers'
    report of the stores it ran) taken only by the next step of that queue."""
    scheduler = engine_connector(llm).scheduler
    core = llm.llm_engine.engine_core.engine_core
    step = getattr(core, "step_fn", core.step)
    deadline = time.monotonic() + timeout_s
    while scheduler.has_jobs_in_flight or core.scheduler.has_requests() or _queued(core):
        if time.monotonic() > deadline:
            raise RuntimeError(f"kvtier: transfers still in flight after {timeout_s} s")
        step()


def _queued(core: Any) -> bool:
    """Whether the engine core holds a step whose output it has not taken yet."""
    return bool(getattr(core, "batch_queue", None))
