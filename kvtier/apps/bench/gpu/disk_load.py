"""Disk-tier loads of the request into engine blocks, page cache cold and warm, against raw I/O.

    measure(shape, tokens, device, reps, clock, parent)   disk_warm_ratio and disk_cold_ratio

The request's chunks are stored into a host tier by the connector's own store, written as chunk
files by ``DiskTier`` in a fresh directory under ``parent`` (removed after), and synced. A load is
the disk tier's ``TierLoadHandler`` moving every chunk of the request into other engine blocks on
the device (checked against the originals after the reps), ``readers`` files at once as the
engine's disk tier reads them by default (``disk.readers``). The bound: the same payload bytes in
one file, read ``RAW_IO`` bytes per call into pinned host memory, then one host -> device copy of
the whole; read by one thread and, where the engine reads several files at once, by as many
threads over equal ranges, the faster of the two rep by rep (``raw``, ``raw_readers``). Cold: a
side's files dropped from the page cache (``page_cache.drop``; ``resident_after_drop`` shows that
it worked) right before it reads them; warm: read again from the page cache
(``resident_before_warm`` shows that they were there). Per rep the sides run back to back, their
order turning; each drops only its own files, so that no side's warm read follows another's drop
(the two bounds read one file: each drops it before its own cold read). Where the engine reads
several files at once, a loader that reads one at a time is timed beside them
(``one_reader_ratio``), from a copy of the files: it asks the kernel to read a file ahead, which
leaves the file in the page cache in small pages, and kvtier's warm reads must find the pages
its own reads brought (read from small pages, 512 MiB took 1.3-1.4 x as long, one thread, Linux
6.18, ext4). And the bound's reads with kvtier's checksum (``raw_checked``: the
same threads, each range read ``READ_PIECE`` at a time and each piece hashed once read, as a
chunk file is): ``checksum_ceiling`` is the bound over it, the most a load that checks every byte
can reach here, and ``checked_ratio`` is it over kvtier's load, what kvtier costs besides.
``reads_ratio``: the bound over kvtier's reads alone (``kvtier_reads``: every chunk file read
and checked by the loader's readers into pinned memory, nothing moved to the device), which
splits what kvtier costs besides between its reads and its moves. ``variants``: where the engine
reads several files at once, kvtier's load with staging halves twice as large, and with twice
the readers too (``VARIANTS``), each as kvtier's time over its own (above 1: faster), so that a
run shows whether the defaults should change.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from kvtier.addresses import TierChunks
from kvtier.apps.bench.common import page_cache
from kvtier.apps.bench.common.jobs import run_job
from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.figures import Measured, ratios, summary
from kvtier.apps.bench.gpu.host_copy import HostRig, mechanisms
from kvtier.apps.bench.gpu.shapes import Shape
from kvtier.keys import ChunkKey, LayoutFingerprint
from kvtier.tiers.base.chunk_format import READ_PIECE
from kvtier.tiers.base.chunk_io import STAGE_BYTES, TierLoadHandler
from kvtier.tiers.base.chunk_reads import ChunkReader
from kvtier.tiers.disk.files import DiskTier, default_readers

RAW_IO = 4 << 20  # bytes per raw read call
# kvtier's loads with other settings, where it reads several files at once: (readers, staging
# half) as multiples of the engine's defaults (``default_readers``, ``chunk_io.STAGE_BYTES``)
VARIANTS = {"kvtier_wide_halves": (1, 2), "kvtier_more_readers": (2, 2)}


def measure(
    shape: Shape, tokens: int, device: torch.device, reps: int, clock: Clock, parent: Path
) -> Measured:
    parent.mkdir(parents=True, exist_ok=True)
    rig = HostRig(shape, tokens, device, only=mechanisms(device)[:1])
    try:
        rig.move(rig.mechanisms[0], store=True)
        with tempfile.TemporaryDirectory(prefix="kvtier-bench-gpu-", dir=parent) as work:
            return _measure(rig, Path(work), reps, clock)
    finally:
        rig.close()


def _measure(rig: HostRig, work: Path, reps: int, clock: Clock) -> Measured:
    layout = rig.engine.layout
    fingerprint = LayoutFingerprint(f"bench-gpu-{rig.shape.name}", "bfloat16", layout.describe(),
                                    0, 1, 0, rig.shape.chunk_tokens)  # fmt: skip
    digest = fingerprint.digest()
    keys = rig.request.keys(digest)
    records = rig.records()

    def written(name: str) -> DiskTier:
        tier = DiskTier(work / name, 0, digest, fingerprint.describe(), layout, rig.shape.factor)
        for key, record in zip(keys, records, strict=True):
            tier.write(key, [record])
        return tier

    tier = written("tier")
    tiers = {"kvtier": tier}
    readers = default_readers(layout.device.type)  # as the engine's disk tier, by default
    if readers > 1:  # and one at a time, to show what the readers beside each other bring:
        # from files of its own, as it asks the kernel to read them ahead (a file read ahead
        # lands in the page cache in small pages, which every later read copies slower)
        tiers["one_reader"] = written("one-reader")
    loaders = {name: TierLoadHandler(layout, t, "disk", readers if t is tier else 1)
               for name, t in tiers.items()}  # fmt: skip
    variants = VARIANTS if readers > 1 else {}  # kvtier's loads, the next defaults to weigh
    for name, (more, wider) in variants.items():
        loaders[name] = TierLoadHandler(layout, tier, "disk", readers * more, STAGE_BYTES * wider)
    raw = _RawFile(work / "raw.bin", records, layout.device, readers)
    os.sync()
    jobs = itertools.count()
    source = TierChunks("disk", keys)

    def loading(loader: TierLoadHandler) -> Callable[[], object]:
        return lambda: run_job(loader, next(jobs), source, rig.target)

    bounds = {"raw": raw.read} | ({"raw_readers": raw.read_parallel} if readers > 1 else {})
    checked = {"raw_checked": raw.read_checked}  # not a bound: what the checksum costs
    reads = ChunkReader(tier, "bench", readers)
    staged = np.split(raw.host.numpy(), np.cumsum([len(r) for r in records])[:-1])
    sides = bounds | checked | {name: loading(loader) for name, loader in loaders.items()}
    sides["kvtier_reads"] = lambda: _all_read(reads, keys, staged)
    files = dict.fromkeys([*bounds, *checked], [raw.path]) | {
        name: page_cache.files(t.root) for name, t in tiers.items()
    }
    files |= dict.fromkeys(["kvtier_reads", *variants], files["kvtier"])
    seconds: dict[str, list[float]] = {}
    resident: dict[str, list[float]] = {"cold": [], "warm": []}  # before each timed read
    try:
        for load in sides.values():
            load()  # warm-up: the loaders' staging, the first touch of the target blocks
        names = list(sides)
        for rep in range(reps):
            for temperature in ("cold", "warm"):
                turn = rep % len(names)
                for side in names[turn:] + names[:turn]:  # each side first in its turn
                    if temperature == "cold":
                        page_cache.drop(files[side])
                    resident[temperature].append(page_cache.resident(files[side]))
                    seconds.setdefault(f"{side}_{temperature}", []).append(
                        clock.seconds(sides[side]))  # fmt: skip
    finally:
        raw.close()
        reads.shutdown()
        for loader in loaders.values():
            loader.shutdown()
    if not rig.loaded_intact():
        raise RuntimeError("a disk load brought back other bytes than were written")
    nbytes = rig.request.nbytes
    bound = {t: _faster([seconds[f"{side}_{t}"] for side in bounds]) for t in ("warm", "cold")}
    figures = {f"disk_{t}_ratio": ratios(bound[t], seconds[f"kvtier_{t}"])
               for t in ("warm", "cold")}  # fmt: skip
    details = {
        "bytes": nbytes, "files": len(keys), "file_bytes": tier.file_bytes(0), "readers": readers,
        "resident_after_drop": round(max(resident["cold"]), 4),
        "resident_before_warm": round(min(resident["warm"]), 4), "raw_io_bytes": RAW_IO,
        "seconds": {name: summary(values) for name, values in seconds.items()},
        "gb_s": {name: round(nbytes / min(values) / 1e9, 2) for name, values in seconds.items()},
    }  # fmt: skip
    details["checksum_ceiling"] = {t: ratios(bound[t], seconds[f"raw_checked_{t}"])
                                   for t in ("warm", "cold")}  # fmt: skip
    details["reads_ratio"] = {t: ratios(bound[t], seconds[f"kvtier_reads_{t}"])
                              for t in ("warm", "cold")}  # fmt: skip
    details["checked_ratio"] = {t: ratios(seconds[f"raw_checked_{t}"], seconds[f"kvtier_{t}"])
                                for t in ("warm", "cold")}  # fmt: skip
    details["variants"] = {
        name: {"readers": readers * more, "stage_bytes": STAGE_BYTES * wider,
               "ratio": {t: ratios(seconds[f"kvtier_{t}"], seconds[f"{name}_{t}"])
                         for t in ("warm", "cold")}}
        for name, (more, wider) in variants.items()
    }  # fmt: skip
    if "one_reader" in loaders:
        details["one_reader_ratio"] = {
            t: ratios(seconds[f"raw_{t}"], seconds[f"one_reader_{t}"]) for t in ("warm", "cold")
        }
    return Measured(figures, {}, details)


def _all_read(reader: ChunkReader, keys: Sequence[ChunkKey], into: Sequence[np.ndarray]) -> None:
    if not all(reader.read(keys, into)):
        raise RuntimeError("a chunk file the bench wrote failed its checks")


def _faster(sides: Sequence[Sequence[float]]) -> list[float]:
    """Rep by rep, the least of the sides' seconds."""
    return [min(rep) for rep in zip(*sides, strict=True)]


class _RawFile:
    """The bound: the records' bytes in one file, read into pinned memory by one thread
    (``read``) or by ``readers`` threads over equal ranges (``read_parallel``, as many as the
    engine's disk tier reads files at once), then one copy to the device."""

    def __init__(
        self, path: Path, records: Sequence[np.ndarray], device: torch.device, readers: int
    ) -> None:
        self.path = path
        with open(path, "wb") as file:
            for record in records:
                file.write(record.data)
        nbytes = sum(len(record) for record in records)
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self.view = self.host.numpy().data
        self.engine = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.readers = max(1, readers)
        self._pool = ThreadPoolExecutor(self.readers, thread_name_prefix="kvtier-bench-raw")

    def read(self) -> None:
        with open(self.path, "rb", buffering=0) as file:
            self._read_range(file.fileno(), 0, len(self.view))
        self.engine.copy_(self.host, non_blocking=True)

    def read_parallel(self, piece: int = RAW_IO, hashed: bool = False) -> None:
        """The file read by ``readers`` threads over equal ranges, ``piece`` bytes a call, each
        piece hashed once read where ``hashed``; then one copy to the device."""
        size, n = len(self.view), self.readers
        ends = [size * k // n for k in range(n + 1)]
        with open(self.path, "rb", buffering=0) as file:
            fd = file.fileno()
            reads = [self._pool.submit(self._read_range, fd, a, b, piece,
                                       xxhash.xxh3_64() if hashed else None)
                     for a, b in zip(ends, ends[1:])]  # fmt: skip
            for done in reads:
                done.result()
        self.engine.copy_(self.host, non_blocking=True)

    def read_checked(self) -> None:
        """``read_parallel``, each range read ``READ_PIECE`` at a time and each piece hashed
        once read, as ``chunk_format.read_chunk`` checks a chunk file."""
        self.read_parallel(READ_PIECE, hashed=True)

    def _read_range(
        self, fd: int, start: int, end: int, piece: int = RAW_IO, hasher: Any = None
    ) -> None:
        at = start
        while at < end:
            view = self.view[at : min(at + piece, end)]
            got = os.preadv(fd, [view], at)
            if not got:
                raise OSError(f"{self.path} ended {end - at} bytes early")
            if hasher is not None:
                hasher.update(view[:got])
            at += got

    def close(self) -> None:
        self._pool.shutdown(wait=True)
