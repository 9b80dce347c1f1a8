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
command loads torch): libgomp's default keeps them spinning for ~16 ms after every copy, on the
cores the job timed next needs, and a two-lane job then measured ~0.65 of the bound instead of
~0.9. Parked threads do not slow the bound itself (5.3 ms per 64 MiB, 5.4-5.7 ms spinning).
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
from rich.table import Table  # noqa: E402
from tqdm import tqdm  # noqa: E402

from kvtier.addresses import EngineBlocks, HostChunks, TransferSpec  # noqa: E402
from kvtier.apps.bench.report import median, time_call, write_json  # noqa: E402
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
CHUNK_TOKENS = (32, 64, 256)


def run(
    out_dir: Path,
    tokens: int = 4096,
    rounds: int = 15,
    device: str | None = None,
    console: Console | None = None,
) -> list[dict[str, Any]]:
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
    meta = {"device": str(target), "tokens_per_job": tokens, "rounds": rounds, "goal": 0.8,
            "cpu_copy_lanes": copy_lanes(), "bound_threads": torch.get_num_threads(),
            "omp_wait_policy": OMP_WAIT_POLICY}  # fmt: skip
    write_json(out_dir / f"copy-{target.type}.json", "copy", rows, **meta)
    _plot(rows, out_dir / f"copy-{target.type}.png", target)
    _print(rows, console, target)
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


def _print(rows: list[dict[str, Any]], console: Console, device: torch.device) -> None:
    table = Table(title=f"kvtier host-tier copy / plain torch copy of the same bytes ({device})")
    for column in ("chunk tokens", "direction", "MiB per job", "ratio (median)", "min", "max"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["chunk_tokens"]),
            row["direction"],
            f"{row['bytes_per_job'] / 2**20:.0f}",
            f"{row['ratio_to_plain_copy']:.2f}",
            f"{row['ratio_min']:.2f}",
            f"{row['ratio_max']:.2f}",
        )
    console.print(table)


def _plot(rows: list[dict[str, Any]], path: Path, device: torch.device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 3.5))
    width = 0.38
    for i, direction in enumerate(("store", "load")):
        picked = [r for r in rows if r["direction"] == direction]
        positions = [j + (i - 0.5) * width for j in range(len(picked))]
        axes.bar(positions, [r["ratio_to_plain_copy"] for r in picked], width, label=direction)
    axes.axhline(0.8, color="grey", linestyle="--", linewidth=1, label="goal 0.8")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(CHUNK_TOKENS)), [f"{t} tokens" for t in CHUNK_TOKENS])
    axes.set_ylabel("throughput / plain torch copy")
    axes.set_title(f"kvtier host tier, bench-model layout ({device.type})")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
