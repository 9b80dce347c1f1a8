"""``kvtier bench copy``: host-tier store and load throughput against a plain torch copy.

The engine is the bench model's KV layout (8 layers, 8 KV heads, head_dim 64, bf16, 32-token
engine blocks) on the machine's default device, its layers carved from one allocation as vLLM
places them. Each job moves one request's worth of blocks
(``tokens``) between shuffled engine blocks and the host slots kvtier's own ``ChunkManager`` hands
out while the tier churns (every store evicts), through the real ``TransferWorker`` path. The bound
is one ``dst.copy_(src)`` of the same number of bytes between two contiguous buffers on the same
devices, timed just before each job; the figure is the median over rounds of bound time / job time
(1.0 = as fast as a plain copy). On the CPU the bound runs on torch's threads (every core by
default) and kvtier's jobs on its copy lanes (``handlers.copy_lanes``); both counts are recorded.

The bound's OpenMP threads are parked between copies (``OMP_WAIT_POLICY=passive``, set when this
module loads torch, recorded in the JSON): spinning threads would hold the cores the job timed
next needs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

_TORCH_FIRST = "torch" in sys.modules  # then libgomp has read its settings already
if not _TORCH_FIRST:
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402  (after the OpenMP wait policy is set)
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kvtier.addresses import EngineBlocks, HostChunks, TransferSpec  # noqa: E402
from kvtier.apps.bench.common.results import write_json  # noqa: E402
from kvtier.apps.bench.common.timing import median, time_call  # noqa: E402
from kvtier.apps.bench.copy import report  # noqa: E402
from kvtier.apps.bench.copy.report import CHUNK_TOKENS, GOAL  # noqa: E402
from kvtier.layout import KVLayout, build_layout  # noqa: E402
from kvtier.media import Medium  # noqa: E402
from kvtier.tiers.host.buffers import HostTier  # noqa: E402
from kvtier.tiers.host.index import ChunkManager  # noqa: E402
from kvtier.tiers.host.io import engine_host_handlers  # noqa: E402
from kvtier.tiers.host.io.handlers import copy_lanes  # noqa: E402
from kvtier.worker import TransferWorker  # noqa: E402

# what the bound's OpenMP threads do between copies, recorded with the figures
OMP_WAIT_POLICY = "unknown (torch loaded first)" if _TORCH_FIRST else os.environ["OMP_WAIT_POLICY"]

LAYERS, KV_HEADS, HEAD_DIM, ENGINE_BLOCK = 8, 8, 64, 32


def run(
    out_dir: Path,
    tokens: int = 4096,
    rounds: int = 15,
    device: str | None = None,
    console: Console | None = None,
) -> list[dict[str, Any]]:
    """Measure, print a table, write ``copy-<device>.json``, ``.md`` and ``.png`` under
    ``out_dir``; the rows."""
    console = console or Console()
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    blocks_per_job = tokens // ENGINE_BLOCK
    num_blocks = 4 * blocks_per_job
    generator = torch.Generator().manual_seed(0)
    # every layer carved from one allocation, as vLLM 0.32 places them (``KVCacheTensor``)
    backing = torch.randn(
        LAYERS, num_blocks, KV_HEADS, ENGINE_BLOCK, 2 * HEAD_DIM, generator=generator
    ).to(target, torch.bfloat16)
    caches = {f"layer.{i}": backing[i] for i in range(LAYERS)}
    layout = build_layout(caches, [list(caches)], num_blocks)
    rows: list[dict[str, Any]] = []
    progress = tqdm(total=len(CHUNK_TOKENS) * rounds, desc="bench copy", unit="round")
    for chunk_tokens in CHUNK_TOKENS:
        ratios = _measure(layout, chunk_tokens, blocks_per_job, rounds, progress.update)
        nbytes = blocks_per_job * sum(layout.page_bytes)
        for direction, values in ratios.items():
            rows.append(
                {
                    "chunk_tokens": chunk_tokens,
                    "direction": direction,
                    "bytes_per_job": nbytes,
                    "ratio_to_plain_copy": round(median(values), 3),
                    "ratio_min": round(min(values), 3),
                    "ratio_max": round(max(values), 3),
                }
            )
    progress.close()
    meta = {"device": str(target), "tokens_per_job": tokens, "rounds": rounds, "goal": GOAL,
            "cpu_copy_lanes": copy_lanes(), "bound_threads": torch.get_num_threads(),
            "omp_wait_policy": OMP_WAIT_POLICY}  # fmt: skip
    path = out_dir / f"copy-{target.type}.json"
    write_json(path, "copy", rows, report.summary, **meta)
    report.plot(rows, path.with_suffix(".png"), target)
    report.print_table(rows, console, target)
    return rows


def _measure(
    layout: KVLayout,
    chunk_tokens: int,
    blocks_per_job: int,
    rounds: int,
    tick: Callable[[], object],
) -> dict[str, list[float]]:
    """Paired ratios (bound time / job time) per direction, one pair per round."""
    factor = chunk_tokens // ENGINE_BLOCK
    chunks_per_job = blocks_per_job // factor
    host = HostTier(layout, 2 * chunks_per_job, factor)
    worker = TransferWorker()
    store, load = engine_host_handlers(layout, host)
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    manager = ChunkManager(host.num_chunks)  # slots as kvtier hands them out, under churn
    rng = np.random.default_rng(chunk_tokens)
    nbytes = blocks_per_job * sum(layout.page_bytes)
    bound = _Bound(nbytes, layout.device)
    ratios: dict[str, list[float]] = {"store": [], "load": []}
    for round_ in range(
        rounds + 2
    ):  # two rounds fill the tier and warm up; then every store evicts
        keys = [(round_, i) for i in range(chunks_per_job)]
        plan = manager.place(keys)
        assert plan is not None and len(plan.slots) == chunks_per_job
        engine = EngineBlocks(
            rng.permutation(layout.num_blocks)[:blocks_per_job], (blocks_per_job,), (0,)
        )
        slots = HostChunks(np.array(plan.slots))
        stored = time_call(bound.store) / time_call(
            partial(_job, worker, 2 * round_, (engine, slots))
        )
        manager.complete_store(dict.fromkeys(keys, 0))
        loaded = time_call(bound.load) / time_call(
            partial(_job, worker, 2 * round_ + 1, (slots, engine))
        )
        if round_ >= 2:
            ratios["store"].append(stored)
            ratios["load"].append(loaded)
            tick()
    worker.shutdown()
    return ratios


def _job(worker: TransferWorker, job_id: int, spec: tuple[TransferSpec, TransferSpec]) -> None:
    assert worker.transfer_async(job_id, spec)
    worker.wait([job_id])
    (result,) = worker.get_finished()
    assert result.success, result


class _Bound:
    """One plain copy of the same bytes between two buffers on the devices a job uses."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.engine = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)

    def store(self) -> None:
        self.host.copy_(self.engine, non_blocking=True)

    def load(self) -> None:
        self.engine.copy_(self.host, non_blocking=True)
