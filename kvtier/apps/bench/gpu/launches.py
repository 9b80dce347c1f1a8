"""The grid kernel's launches for a shape's pages, each timed on the device against one
contiguous copy: which ``kernel.Launch`` moves them fastest on this GPU.

    candidates(page_bytes) -> [Launch]   ``kernel.launch_for``'s first, then launches near it:
                                         half and twice its programs; pages of a step or more,
                                         twice its step, and one step a page (a page that is
                                         not a whole number of steps, MLA's 72 KiB, moves in
                                         steps of 32, 32 and 8 KiB); small pages, half and
                                         twice as many a step
    Sweep(rig)                           the request's pages as the host tier's handlers give
                                         them to the grid kernel, their tables on the device
    .move(launch, store)                 one job's launches, queued on the current stream
    .intact(launch) -> bool              a store and a load of the request byte for byte
    measure(rig, reps) -> Measured       per launch, whether it moved the right bytes and its
                                         store and load over the bound on the device alone
                                         (CUDA events; the submit is ``host_copy``'s), the
                                         fastest each way

``launch_for`` was chosen by a sweep on an H200 of the 8B shape's 32 KiB pages and the 70B
rank's 4 KiB pages (``docs/DESIGN.md``). This measure shows, in the run that shows the figures,
whether another launch moves a shape's pages faster, so that the next change to
``launch_for`` is measured, not guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.figures import Measured, Unavailable, ratios
from kvtier.apps.bench.gpu.host_copy import HostRig
from kvtier.pages import grid, kernel
from kvtier.pages.kernel import Launch
from kvtier.tiers.base.chunk_plan import plan_copy

MOST_WORDS = 16 << 10  # a step's 8-byte words, at most (128 KiB: one MLA page)
WIDE_WARPS = 16  # warps of a step larger than ``launch_for``'s largest


def candidates(page_bytes: int) -> list[Launch]:
    """``launch_for(page_bytes)``, then the launches near it worth timing (distinct, each a
    power of two of words a step, a whole number of pages' share)."""
    chosen = kernel.launch_for(page_bytes)
    found = [chosen, chosen._replace(programs=max(1, chosen.programs // 2)),
             chosen._replace(programs=2 * chosen.programs)]  # fmt: skip
    if chosen.pages == 1:
        words = max(1, -(-page_bytes // 8))
        whole = 1 << (words - 1).bit_length()  # a step the size of a page, or more
        for block in (2 * chosen.block, whole):
            if chosen.block < block <= MOST_WORDS:
                found.append(Launch(1, block, WIDE_WARPS, chosen.programs))
    else:
        share = chosen.block // chosen.pages
        for pages in (chosen.pages // 2, 2 * chosen.pages):
            if 2 <= pages <= kernel.MAX_PAGES:
                found.append(chosen._replace(pages=pages, block=pages * share))
    return list(dict.fromkeys(found))


class Sweep:
    """Rig ``rig``'s request as the grid kernel moves it: its blocks -> its slots (a store),
    its slots -> the rig's target blocks (a load), each job's tables uploaded once; its slots
    first filled by the rig's own store, which a launch's stores are checked against."""

    def __init__(self, rig: HostRig) -> None:
        self.rig = rig
        layout, host = rig.engine.layout, rig.host
        self.device = layout.device
        self.clock = Clock(self.device)
        self.address = host.memory.data_ptr()
        engine = grid.view_table(layout.views)
        self.word = 16  # what every launch's addresses may need (``Launch.word``)
        self.tables: dict[bool, tuple[torch.Tensor, list[tuple[int, int, int, int]]]] = {}
        for store, blocks in ((True, rig.request.engine), (False, rig.target)):
            grids = host.page_grids(plan_copy(blocks, rig.request.slots, host.block_size_factor))
            found = grid.tables(grids, engine, self.address, self.word)
            if found is None:
                self.word = grid.WORD
                found = grid.tables(grids, engine, self.address, self.word)
            if found is None:
                raise Unavailable("the request's pages are not in 8-byte words")
            self.tables[store] = (torch.from_numpy(found.flat).to(self.device), found.grids)
        rig.move(rig.mechanisms[0], store=True)  # the connector's own store: what is right
        self.want = [record.copy() for record in rig.records()]

    def fits(self, launch: Launch) -> bool:
        return self.word % launch.word == 0

    def move(self, launch: Launch, store: bool) -> None:
        flat, spans = self.tables[store]
        for span in spans:
            kernel.grid_copy(flat, span, self.address, store, launch)

    def intact(self, launch: Launch) -> bool:
        """Whether ``launch`` stores the request's pages into its slots and loads them back
        into the target blocks byte for byte (each side cleared first)."""
        rig, host = self.rig, self.rig.host
        host.memory_np[rig.request.slots.slots] = 0
        self.move(launch, store=True)
        self.clock.sync()
        stored = True
        for got, kept in zip(rig.records(), self.want, strict=True):
            stored = stored and bool((got == kept).all())
            got[:] = kept  # as before, whatever the store did: the next launches load it
        ids = torch.from_numpy(rig.target.block_ids).to(self.device)
        for view in {v.data_ptr(): v for v in rig.engine.layout.views}.values():
            view.index_fill_(0, ids, 0)
        self.move(launch, store=False)
        self.clock.sync()
        return stored and rig.loaded_intact()


def measure(rig: HostRig, reps: int) -> Measured:
    device = rig.engine.layout.device
    if device.type != "cuda" or not kernel.available() or not kernel.reaches_host(device):
        raise Unavailable("the grid kernel's launches are timed where it moves pages straight "
                          "between a CUDA device and pinned host memory")  # fmt: skip
    sweep = Sweep(rig)
    page = max(rig.host.records.page_bytes)
    rows: list[dict[str, Any]] = []
    for launch in candidates(page):
        row: dict[str, Any] = {"launch": launch._asdict()}
        rows.append(row)
        if not sweep.fits(launch):
            row["error"] = f"it moves {launch.word}-byte vectors: the pages are not aligned so"
            continue
        if not kernel.warm(launch, device):
            row["error"] = "Triton does not compile it here (the log says why)"
            continue
        row["intact"] = sweep.intact(launch)
        seconds: dict[str, list[float]] = {}
        for rep in range(reps):
            for side, store in (("store", True), ("load", False)):
                bound = rig.bound.store if store else rig.bound.load
                pair: list[tuple[str, Callable[[], object]]] = [
                    (f"bound_{side}", bound),
                    (side, partial(sweep.move, launch, store)),
                ]
                for name, fn in pair if rep % 2 == 0 else pair[::-1]:
                    seconds.setdefault(name, []).append(sweep.clock.device_seconds(fn))
        for side in ("store", "load"):
            row[side] = ratios(seconds[f"bound_{side}"], seconds[side])
    timed = [row for row in rows if row.get("intact")]
    fastest = {side: max(timed, key=lambda row: row[side]["median"])["launch"]
               for side in ("store", "load")} if timed else {}  # fmt: skip
    details = {"page_bytes": page, "chosen": kernel.launch_for(page)._asdict(),
               "launches": rows, "fastest": fastest}  # fmt: skip
    return Measured({}, {}, details)
