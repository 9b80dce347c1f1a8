"""``kvtier demo`` (host tier only, until the vLLM connector lands): a multi-round chat workload.

Users share a system prompt and grow their own history each round. A stand-in engine "computes"
every block by writing bytes derived from the block's chained prefix hash, into a block pool that
is emptied between rounds (as ``reset_prefix_cache()`` would). Before computing, each request looks
its chunks up in kvtier's host tier and loads the hits; afterwards it stores its new chunks. Every
loaded byte is checked against what computing it would have written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from kvtier.keys import ChunkKeyMaker, LayoutFingerprint, chain_hashes
from kvtier.layout import build_layout, host_num_chunks
from kvtier.media import Medium
from kvtier.scheduler import ChunkManager
from kvtier.tiers.cpu import HostTier
from kvtier.worker import EngineBlocks, HostChunks, TransferWorker, engine_host_handlers

BLOCK, FACTOR, LAYERS, KV_HEADS, HEAD = 32, 2, 2, 2, 32  # the tiny model's KV layout


@dataclass
class RoundStats:
    round: int
    prompt_chunks: int = 0
    hit_chunks: int = 0
    bytes_loaded: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_chunks / self.prompt_chunks if self.prompt_chunks else 0.0


def run(users: int = 6, rounds: int = 5, out_dir: Path = Path("bench/results")) -> list[RoundStats]:
    num_blocks = 512
    caches = {
        f"layer.{i}": torch.zeros(num_blocks, KV_HEADS, BLOCK, 2 * HEAD) for i in range(LAYERS)
    }
    layout = build_layout(caches, [list(caches)], num_blocks)
    capacity = host_num_chunks(layout.bytes_per_block(), 1, FACTOR, 4 << 20)
    host = HostTier(layout, capacity, FACTOR)
    manager = ChunkManager(capacity)
    worker = TransferWorker()
    store, load = engine_host_handlers(layout, host)
    worker.register_handler(Medium.ENGINE, Medium.CPU, store)
    worker.register_handler(Medium.CPU, Medium.ENGINE, load)
    fingerprint = LayoutFingerprint("demo-tiny", "float32", layout="cpu", tp_rank=0, tp_size=1,
                                    pp_rank=0, chunk_tokens=BLOCK * FACTOR)  # fmt: skip
    keys_of = ChunkKeyMaker(fingerprint, FACTOR)
    rng = np.random.default_rng(0)
    system = rng.integers(0, 1000, 256).tolist()
    histories = [list(system) for _ in range(users)]
    stats, job = [], 0
    for round_ in tqdm(range(rounds), desc="kvtier demo", unit="round"):
        round_stats = RoundStats(round_)
        free = list(rng.permutation(num_blocks))  # the engine's cache is empty every round
        for history in histories:
            history += rng.integers(0, 1000, 96).tolist()
            hashes = chain_hashes(history, BLOCK)
            keys = keys_of.keys(hashes, group=0)
            blocks = np.array([free.pop() for _ in range(len(hashes))])
            hits = manager.lookup(keys).ready
            if hits:
                job += 1
                slots = HostChunks(np.array(manager.prepare_load(keys[:hits]).slots))
                engine = EngineBlocks(blocks[: hits * FACTOR], (hits * FACTOR,), (0,))
                _transfer(worker, job, (slots, engine))
                manager.complete_load(keys[:hits])
                manager.touch(keys[:hits])
                _verify(layout.views, blocks[: hits * FACTOR], hashes)
                round_stats.bytes_loaded += hits * FACTOR * sum(layout.page_bytes)
            for b in range(hits * FACTOR, len(hashes)):  # compute the rest
                _compute(layout.views, int(blocks[b]), hashes[b])
            plan = manager.prepare_store(keys[hits:])
            if plan is not None and plan.keys:
                job += 1
                wanted = set(plan.keys)  # plan.keys keeps the order of keys
                index = [i for i, k in enumerate(keys) if k in wanted]
                ids = np.concatenate([blocks[i * FACTOR : (i + 1) * FACTOR] for i in index])
                engine = EngineBlocks(ids, (len(ids),), (index[0] * FACTOR,))
                ok = _transfer(worker, job, (engine, HostChunks(np.array(plan.slots))))
                manager.complete_store(plan.keys, ok)
            round_stats.prompt_chunks += len(keys)
            round_stats.hit_chunks += hits
        manager.check_integrity()
        stats.append(round_stats)
    worker.shutdown()
    _report(stats, out_dir)
    return stats


def _page(block_hash: bytes, words: int) -> torch.Tensor:
    seed = int.from_bytes(block_hash[:8], "little") & ((1 << 63) - 1)
    return torch.randint(-(2**62), 2**62, (words,), generator=torch.Generator().manual_seed(seed))


def _compute(views: tuple[torch.Tensor, ...], block: int, block_hash: bytes) -> None:
    for i, view in enumerate(views):
        view[block] = _page(block_hash + bytes([i]), view.shape[1])


def _verify(views: tuple[torch.Tensor, ...], blocks: np.ndarray, hashes: list[bytes]) -> None:
    for b, block in enumerate(blocks.tolist()):
        for i, view in enumerate(views):
            if not torch.equal(view[block], _page(hashes[b] + bytes([i]), view.shape[1])):
                raise AssertionError(f"kvtier demo: block {b} came back wrong from the host tier")


def _transfer(
    worker: TransferWorker, job: int, spec: tuple[HostChunks | EngineBlocks, ...]
) -> bool:
    if not worker.transfer_async(job, (spec[0], spec[1])):
        return False
    worker.wait([job])
    return all(result.success for result in worker.get_finished())


def _report(stats: list[RoundStats], out_dir: Path) -> None:
    table = Table(title="kvtier demo: host tier, chat rounds (engine cache emptied every round)")
    for column in ("round", "prompt chunks", "from kvtier", "hit rate", "MiB loaded"):
        table.add_column(column, justify="right")
    for s in stats:
        table.add_row(str(s.round), str(s.prompt_chunks), str(s.hit_chunks), f"{s.hit_rate:.0%}",
                      f"{s.bytes_loaded / 2**20:.1f}")  # fmt: skip
    Console().print(table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3))
    axes.plot([s.round for s in stats], [s.hit_rate for s in stats], marker="o")
    axes.set_xlabel("round")
    axes.set_ylabel("prompt chunks from kvtier")
    axes.set_ylim(0, 1)
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_dir / "demo.png", dpi=120)
    plt.close(figure)
