"""Reaching kvtier inside a running ``vllm.LLM``: its counters, each rank's, the connector."""

from __future__ import annotations

from typing import Any

from kvtier.counters import KVTierStats
from kvtier.vllm.connector import KVTierConnector


def engine_connector(llm: Any) -> KVTierConnector:
    """The scheduler-side connector of an in-process ``vllm.LLM`` (tests, demo, benchmarks)."""
    try:
        connector = llm.llm_engine.engine_core.engine_core.scheduler.connector
    except AttributeError as error:
        raise RuntimeError(
            "kvtier: the engine runs in other processes (VLLM_ENABLE_V1_MULTIPROCESSING=1); "
            "read the 'kvtier:' log lines or vLLM's connector stats instead"
        ) from error
    if not isinstance(connector, KVTierConnector):
        raise RuntimeError(f"kvtier: the engine's connector is {type(connector).__name__}")
    return connector


def rank_counters(worker: Any) -> dict[str, int]:
    """This worker rank's kvtier counters; for ``llm.collective_rpc(rank_counters)``."""
    from dataclasses import asdict

    from vllm.distributed.kv_transfer import get_kv_transfer_group

    connector = get_kv_transfer_group()
    assert isinstance(connector, KVTierConnector)
    return asdict(connector.worker.counters)


def stats(llm: Any) -> KVTierStats:
    """kvtier's counters for an in-process ``vllm.LLM``."""
    return engine_connector(llm).scheduler.stats


def settle(llm: Any, max_steps: int = 10_000) -> None:
    """Step an in-process ``vllm.LLM`` until kvtier has no transfer in flight and vLLM released
    every request (a finished request keeps its blocks until its stores drained)."""
    scheduler = engine_connector(llm).scheduler
    core = llm.llm_engine.engine_core.engine_core
    for _ in range(max_steps):
        if not scheduler.has_jobs_in_flight and not core.scheduler.has_requests():
            return
        core.step()
    raise RuntimeError(f"kvtier: transfers still in flight after {max_steps} engine steps")
