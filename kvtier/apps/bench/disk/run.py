"""``kvtier bench disk``: the disk tier against raw sequential I/O, and TTFT from disk in vLLM.

Throughput, in a fresh directory on the file system of ``--dir``: an engine of the bench model's
per-layer KV shape (8 KV heads, head_dim 64, bf16, 32-token engine blocks) but ``layers`` deep
(32: 4 MiB chunks of 64 tokens), a host tier of ``chunks`` chunks of random bytes. Per round:

    store       ``TierWriteHandler`` writes every chunk to its file, then ``os.sync()``; bound:
                the same bytes written to one file, 4 MiB per ``os.write``, then ``os.sync()``
    cold load   page cache dropped (``posix_fadvise(DONTNEED)``, checked with ``mincore``), then
                ``TierLoadHandler`` loads every chunk into shuffled engine blocks (verified);
                bound: the one file read back, 4 MiB per ``readinto``, from a dropped cache
    warm load   the same again, the files now in the page cache (bound: a warm read)

The two sides of a pair run back to back, in alternating order; the first round is a warm-up.
A figure is the median over rounds of bound time / kvtier time (1.0 = as fast as raw I/O).
TTFT from disk is ``ttft.py`` (the TTFT driver on a disk tier); the table, the PNG and the
Markdown are ``report.py``.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from tqdm import tqdm

from kvtier.addresses import EngineBlocks, HostChunks, TierChunks
from kvtier.apps.bench.common import page_cache
from kvtier.apps.bench.common.jobs import HEAD_DIM, KV_HEADS, bench_layout, run_job
from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.common.timing import OtherLoad, median, time_call
from kvtier.apps.bench.disk import report
from kvtier.keys import LayoutFingerprint, make_key
from kvtier.tiers.base.chunk_io import TierLoadHandler, TierWriteHandler
from kvtier.tiers.disk.files import DiskTier, default_readers
from kvtier.tiers.host.buffers import HostTier

ENGINE_BLOCK, CHUNK_TOKENS = 32, 64
FACTOR = CHUNK_TOKENS // ENGINE_BLOCK
RAW_IO = 4 << 20  # bytes per raw read or write call
MEASURES = ("store", "cold_load", "warm_load")


def run(
    out_dir: Path,
    parent: Path = Path("."),
    chunks: int = 64,
    layers: int = 32,
    rounds: int = 9,
    tokens: int = 4096,
    repeats: int = 3,
    model: str | Path = "bench",
    dtype: str = "bfloat16",
    device: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure, print a table, write ``disk-<device>.json``, ``.md`` and ``.png`` under
    ``out_dir``.

    Works in a fresh directory under ``parent`` (removed after). Its engines run in this
    process: ``common.engine_env`` must be applied (the command does). Returns the JSON
    document. Raises ``RuntimeError`` when a TTFT hit did not come from the files it should
    have.
    """
    from kvtier.apps.bench.disk import ttft as disk_ttft

    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-disk-", dir=parent) as work:
        with tqdm(total=rounds + 1, desc="bench disk: throughput", unit="round") as progress:
            others = OtherLoad()
            throughput = measure_throughput(Path(work), chunks, layers, rounds, target,
                                            progress.update)  # fmt: skip
            throughput["other_load_cores"] = others.cores()
        ttft = disk_ttft.measure(Path(work), tokens, repeats, model, dtype)
        file_system = _file_system(Path(work))
    rows = report.ratio_rows(throughput, ttft)
    meta = {"device": str(target), "file_system": file_system, "goals": report.GOALS,
            "throughput": throughput, "ttft": ttft,
            "runtime_s": round(time.perf_counter() - started, 1)}  # fmt: skip
    path = out_dir / f"disk-{target.type}.json"
    document = write_json(path, "disk", rows, report.summary, **meta)
    report.plot(rows, meta, path.with_suffix(".png"))
    report.print_table(rows, meta, console or Console())
    return document


def measure_throughput(
    work: Path,
    chunks: int,
    layers: int,
    rounds: int,
    device: torch.device,
    tick: Callable[[], object],
) -> dict[str, Any]:
    """Paired ratios (raw time / kvtier time) per measure, medians over ``rounds`` rounds."""
    rig = _Rig(work, chunks, layers, device)
    seconds: dict[str, list[float]] = {f"{side}_{m}": [] for m in MEASURES
                                       for side in ("kvtier", "raw")}  # fmt: skip
    resident_after_drop: list[float] = []
    for round_ in range(rounds + 1):
        kept = round_ > 0  # round 0 makes the directories and faults the memory in: a warm-up
        rig.clear()
        _pair(seconds, "store", kept, round_, rig.store, rig.raw.write)
        page_cache.drop(rig.files())
        resident_after_drop.append(page_cache.resident(rig.files()))
        for measure in ("cold_load", "warm_load"):
            _pair(seconds, measure, kept, round_, partial(rig.load, round_), rig.raw.read)
        tick()
    rig.shutdown()
    payload = chunks * sum(rig.tier.view_bytes(0))
    return {
        "layers": layers, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "dtype": "bfloat16",
        "engine_block_tokens": ENGINE_BLOCK, "chunk_tokens": CHUNK_TOKENS, "chunks": chunks,
        "chunk_file_bytes": rig.tier.file_bytes(0), "payload_bytes": payload,
        "raw_io_bytes": RAW_IO, "rounds": rounds,
        "resident_after_drop": round(max(resident_after_drop), 4),
        "measures": {m: _summary(seconds[f"raw_{m}"], seconds[f"kvtier_{m}"], payload)
                     for m in MEASURES},
    }  # fmt: skip


class _Rig:
    """An engine, a host tier of random chunks, their disk tier and handlers, the raw file."""

    def __init__(self, work: Path, chunks: int, layers: int, device: torch.device) -> None:
        self.layout = bench_layout(layers, ENGINE_BLOCK, 2 * chunks * FACTOR, device)
        self.host = HostTier(self.layout, chunks, FACTOR)
        rng = np.random.default_rng(0)
        memory = self.host.memory_np
        memory[:] = np.frombuffer(rng.bytes(memory.size), dtype=np.uint8).reshape(memory.shape)
        shape = f"(kv_heads={KV_HEADS},block={ENGINE_BLOCK},2*head={2 * HEAD_DIM})"
        layout = f"cpu:{layers} layers:{shape}"
        fingerprint = LayoutFingerprint("bench-disk", "bfloat16", layout, 0, 1, 0, CHUNK_TOKENS)
        digest = fingerprint.digest()
        self.tier = DiskTier(work / "tier", 0, digest, fingerprint.describe(), self.layout, FACTOR)
        self.keys = tuple(make_key(digest, i, 0) for i in range(chunks))
        self.raw = _RawFile(work / "raw.bin", self.host)
        self.writer = TierWriteHandler(self.host, self.tier, "disk")
        readers = default_readers(device.type)  # as the engine's disk tier, by default
        self.loader = TierLoadHandler(self.layout, self.tier, "disk", readers)
        self._jobs = iter(range(1 << 62))

    def files(self) -> list[Path]:
        return [*page_cache.files(self.tier.root), self.raw.path]

    def clear(self) -> None:
        """Remove every chunk file and the raw file (the directories stay), then sync."""
        for path in self.files():
            path.unlink(missing_ok=True)
        os.sync()

    def store(self) -> None:
        slots = HostChunks(np.arange(len(self.keys), dtype=np.int64))
        run_job(self.writer, next(self._jobs), slots, TierChunks("disk", self.keys))
        os.sync()

    def load(self, round_: int) -> None:
        """Every chunk into shuffled engine blocks (the same ones within a round)."""
        count = len(self.keys) * FACTOR
        blocks = np.random.default_rng(round_).permutation(self.layout.num_blocks)[:count]
        engine = EngineBlocks(blocks.astype(np.int64), (count,), (0,))
        run_job(self.loader, next(self._jobs), TierChunks("disk", self.keys), engine)

    def shutdown(self) -> None:
        self.writer.shutdown()
        self.loader.shutdown()


def _pair(
    seconds: dict[str, list[float]],
    measure: str,
    kept: bool,
    round_: int,
    kvtier: Callable[[], None],
    raw: Callable[[], None],
) -> None:
    """Time ``kvtier`` and ``raw`` back to back, raw first in even rounds."""
    sides = [("raw", raw), ("kvtier", kvtier)]
    for side, fn in sides if round_ % 2 == 0 else sides[::-1]:
        elapsed = time_call(fn)
        if kept:
            seconds[f"{side}_{measure}"].append(elapsed)


class _RawFile:
    """The bound: dd-like sequential I/O of the host tier's bytes on one file, ``RAW_IO`` a call."""

    def __init__(self, path: Path, host: HostTier) -> None:
        self.path = path
        self.source = [host.memory_np.reshape(-1).data.cast("B")]
        self.buffer = bytearray(RAW_IO)

    def write(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for source in self.source:
                done = 0
                while done < len(source):
                    done += os.write(fd, source[done : done + RAW_IO])
        finally:
            os.close(fd)
        os.sync()

    def read(self) -> None:
        with open(self.path, "rb", buffering=0) as file:
            while file.readinto(self.buffer):
                pass


def _summary(raw: list[float], kvtier: list[float], nbytes: int) -> dict[str, Any]:
    ratios = [r / k for r, k in zip(raw, kvtier, strict=True)]
    return {
        "ratio": round(median(ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        "raw_mib_s": round(nbytes / median(raw) / 2**20, 1),
        "kvtier_mib_s": round(nbytes / median(kvtier) / 2**20, 1),
        "raw_s": [round(s, 4) for s in raw],
        "kvtier_s": [round(s, 4) for s in kvtier],
    }


def _file_system(path: Path) -> str:
    """``"ext4 on /dev/vda (/)"``: the mount holding ``path`` (Linux; "unknown" elsewhere)."""
    try:
        mounts = [line.split()[:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    target = str(path.resolve())
    inside = [m for m in mounts if target == m[1] or target.startswith(m[1].rstrip("/") + "/")]
    if not inside:
        return "unknown"
    device, mount, kind = max(inside, key=lambda m: len(m[1]))
    return f"{kind} on {device} ({mount})"
