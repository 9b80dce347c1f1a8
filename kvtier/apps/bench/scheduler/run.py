"""``kvtier bench scheduler``: the scheduler half's cost per engine step as running requests grow.

No engine: ``sim.EngineSim`` drives a ``SchedulerConnector`` as vLLM would, with
``running`` requests of ``context``-token prompts (4k) decoding one token a step (a new block
every 16 tokens, a 64-token chunk stored as it completes, into a host tier of 4096 chunks under
eviction); requests finish after 64..512 tokens and new ones arrive (prompts as long, sharing
their first half: lookups, hits, loads, prefills); the workers report every job a step later.

A step's cost is the time spent in the scheduler half's calls: lookup and ``on_alloc`` for the
arrivals, building the step's ``ScheduledRequest``s and ``build_plan``, ``on_report``,
``request_finished``. The bound, timed in the same step, is a bare Python loop touching each new
block id of the step once: the least any per-step work must do. Figures: min / median / 90th
percentile / max cost over the measured steps, and the median of cost / bound.

Modes: ``incremental`` (each request's new blocks, as the adapter hands them now),
``whole-table`` (every request's whole table each step, as the adapter once did: O(total
blocks)), and with ``adapter`` also ``vllm-adapter`` (vLLM's real ``SchedulerOutput`` turned
into requests by ``kvtier.vllm.schedule``; its construction is not timed). As vLLM's engine does
after start-up, the heap is frozen (``gc.freeze``) after the warm-up steps.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from tqdm import tqdm

from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.scheduler import report
from kvtier.apps.bench.scheduler.sim import PHASES, Adapter, EngineSim, StepRecord, Workload
from kvtier.config import KVTierConfig
from kvtier.keys import ChunkKeyMaker, LayoutFingerprint
from kvtier.scheduler.connector import GroupSpec, SchedulerConnector

RUNNING = (32, 256, 1024)
BLOCK_TOKENS, FACTOR, HOST_CHUNKS = 16, 4, 4096
GOAL_MS, GOAL_RUNNING = 1.0, 256


def run(
    out_dir: Path,
    running: tuple[int, ...] = RUNNING,
    steps: int = 200,
    warmup: int = 64,
    context: int = 4096,
    compare: bool = True,
    adapter: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure, print a table, write ``scheduler.json``, ``.md`` and ``.png`` under ``out_dir``.

    ``compare`` adds the whole-table mode; ``adapter`` the vLLM adapter (imports vLLM). Returns
    the JSON document.
    """
    modes: dict[str, Adapter | None] = {"incremental": None}
    if compare:
        modes["whole-table"] = None
    if adapter:
        from kvtier.apps.bench.scheduler.vllm_adapter import vllm_adapter

        modes["vllm-adapter"] = vllm_adapter()
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    total = len(running) * len(modes) * (warmup + steps)
    with tqdm(total=total, desc="bench scheduler", unit="step") as progress:
        for count in running:
            for mode, make in modes.items():
                workload = Workload(
                    count, context, prompt=context, shared=context // 2, decode=(64, 512)
                )
                sim = EngineSim(_connector(), workload, mode == "whole-table", make)
                records = _measure(sim, warmup, steps, progress.update)
                rows.append(_row(mode, count, sim, records))
    meta = {
        "block_tokens": BLOCK_TOKENS,
        "chunk_tokens": BLOCK_TOKENS * FACTOR,
        "host_chunks": HOST_CHUNKS,
        "context": context,
        "steps": steps,
        "warmup": warmup,
        "goal_ms": GOAL_MS,
        "goal_running": GOAL_RUNNING,
        "runtime_s": round(time.perf_counter() - started, 1),
    }
    document = write_json(out_dir / "scheduler.json", "scheduler", rows, report.summary, **meta)
    report.plot(rows, meta, out_dir / "scheduler.png")
    report.print_table(rows, meta, console or Console())
    return document


def _connector() -> SchedulerConnector:
    fingerprint = LayoutFingerprint("bench", "bf16", "bench-scheduler", 0, 1, 0, BLOCK_TOKENS)
    return SchedulerConnector(
        KVTierConfig(cpu_bytes_to_use=1),
        [GroupSpec(BLOCK_TOKENS)],
        HOST_CHUNKS,
        1,
        ChunkKeyMaker(fingerprint, FACTOR),
    )


def _measure(sim: EngineSim, warmup: int, steps: int, tick: Any) -> list[StepRecord]:
    """``warmup`` steps (the first requests' prefills, the first arrivals), then ``steps``."""
    for _ in range(warmup):
        sim.step()
        tick()
    gc.collect()
    gc.freeze()
    try:
        records = []
        for _ in range(steps):
            records.append(sim.step())
            tick()
    finally:
        gc.unfreeze()
    sim.connector.check_integrity()
    return records


def _row(mode: str, running: int, sim: EngineSim, records: list[StepRecord]) -> dict[str, Any]:
    costs = [sum(r.seconds.values()) for r in records]
    ratios = [c / r.bound for c, r in zip(costs, records, strict=True) if r.bound > 0]
    blocks = sum(len(t) for r in sim.running for t in r.tables)

    def ms(values: list[float]) -> float:
        return round(median(values) * 1e3, 4)

    return {
        "mode": mode,
        "running": running,
        "blocks_held": blocks,
        "scheduled_per_step": round(median([float(r.scheduled) for r in records]), 1),
        "new_blocks_per_step": round(median([float(r.new_blocks) for r in records]), 1),
        "stores": sum(len(r.plan.stores) for r in records),
        "loads": sum(len(r.plan.loads) for r in records),
        "flushes": sum(len(r.plan.flush) for r in records),
        "ms_min": round(min(costs) * 1e3, 4),
        "ms_median": ms(costs),
        "ms_max": round(max(costs) * 1e3, 4),
        "phases_ms_median": {p: ms([r.seconds[p] for r in records]) for p in PHASES},
        "bound_us_median": round(median([r.bound for r in records]) * 1e6, 2),
        "ratio_to_bound": round(median(ratios), 1) if ratios else None,
        "ms_p90": round(sorted(costs)[int(0.9 * (len(costs) - 1))] * 1e3, 4),
    }
