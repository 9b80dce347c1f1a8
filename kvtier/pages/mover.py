"""``PageMover``: the one way kvtier moves engine pages to and from host memory.

    PageMover(views, mechanism, host_piece=0)
                                  for a rank's block views (``layout.py``), on their device;
                                  no host copy over a multiple of ``host_piece`` bytes (where
                                  the host memory's separately pinned pieces meet, ``plan.py``)
    .store(pages, host, pinned)   engine pages -> ``host`` (bytes, CPU memory); ``pages``:
                                  ``Pages``, or ``PageGrid``s (``grid.py``), which the
                                  ``KERNEL`` mechanism moves without a per-page table
    .load(pages, host, pinned)    ``host`` -> engine pages
    .pieces(pages, host, store)   on the CPU: the copies, in pieces for copy lanes

On a GPU a job goes one of two ways, chosen per direction (``mechanism.py``; by default
``gpu_mechanisms()``: what ``KVTIER_GPU_COPY`` names, else ``KERNEL`` both ways):

- ``KERNEL``: the kernel copies every page straight between the engine and pinned host memory
  (unified addressing), no staging and no copy engine: for host memory not pinned yet, and on a
  GPU that cannot address it at its host addresses (``kernel.reaches_host``), DMA.
  Given grids, the grid kernel computes each page's addresses on the device from a table of
  ``V + K`` entries per grid: the engine's thread does ``O(blocks)`` work per job, where a
  page table is ``3 * V * K`` entries planned and uploaded (16,384 pages for a 4,096-token
  job of an 8B model): a job costs it under 0.1 ms on a CPU core.
- ``DMA``: each batch (up to ``stage_bytes``) is one gather on the device into a staging area
  laid out as host memory is, then one copy per run of adjacent host bytes on the copy engine (a
  store), or the mirror image (a load). A 4,096-token job of an 8B-class model (64 views of
  32 KiB pages, 64-token chunks) is a gather and a copy per chunk, where copying page by page
  took 16,384 copies. It takes no SM for the bus's part of the work. Given grids where Triton
  runs, the gather is the grid kernel into staged records (``staged_grids.py``: planned in
  ``O(V * chunks)``, 0.44 ms for that job on a CPU core where planning every page took 1.08 ms,
  0.36 against 1.70 ms at 160 views of 4 KiB pages); else each page is planned (``plan.py``)
  and gathered by the descriptor kernel, or by torch's ``index_select`` / ``index_copy_``.

Work is queued on the caller's current stream and returns without waiting for it; the caller
records an event to know when it is done. The staging area is reused in stream order. Host
memory must stay as it is (a load) or unread (a store) until then; it is fastest pinned, and
correct if not (CUDA stages pageable memory itself). With views on the CPU there is no staging:
each host run is one numpy call straight between the engine's rows and host memory
(``direct.py``), in pieces that copy lanes run side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from kvtier.pages import grid, kernel
from kvtier.pages.direct import direct_pieces
from kvtier.pages.mechanism import Mechanism, Mechanisms, gpu_mechanisms
from kvtier.pages.plan import Batch, Gather, Pages, iter_batches, joined, plan_batches
from kvtier.pages.spaces import Spaces
from kvtier.pages.staged_grids import StagedBatch, staged_batches
from kvtier.pages.uploads import Uploads

STAGE_BYTES = 64 << 20  # the most one batch stages on the device
Grids = Sequence[grid.PageGrid]


class PageMover:
    def __init__(
        self,
        views: Sequence[torch.Tensor],
        stage_bytes: int = STAGE_BYTES,
        mechanism: Mechanism | Mechanisms | None = None,
        programs: int | None = None,
        staged: bool | None = None,
        host_piece: int = 0,
        triton: bool | None = None,
        grids: bool = True,
    ) -> None:
        """``mechanism``: both directions', or each one's (None: ``gpu_mechanisms()``,
        ``mechanism.py``). ``staged``: move through the staging area
        (None: on a GPU only; the tests stage on the CPU too, to run the GPU's steps where there
        is no GPU). ``triton``: move with the kernels of ``kernel.py`` (None: on a GPU where
        Triton runs; the tests run them on the CPU under Triton's interpreter). ``grids``: jobs
        may come as grids (their kernel is then compiled now, not in the first job).
        ``programs``: per launch of either kernel (None: ``kernel.launch_for`` the pages', the
        copy kernel's ``kernel.PROGRAMS``)."""
        if not views:
            raise ValueError("kvtier: PageMover needs at least one view")
        self.device = views[0].device
        self._engine_table = grid.view_table(views)  # for the grid kernel
        self.spaces = Spaces.of(views)
        self.page_bytes = np.array([v.shape[1] * v.element_size() for v in views], dtype=np.int64)
        self.stage_bytes = max(stage_bytes, int(self.page_bytes.max()))
        if mechanism is None:
            mechanism = gpu_mechanisms()
        elif not isinstance(mechanism, Mechanisms):
            mechanism = Mechanisms(Mechanism(mechanism), Mechanism(mechanism))
        self.mechanisms = mechanism
        self.programs = programs or kernel.PROGRAMS  # the copy kernel's
        self.host_piece = host_piece
        if triton is None:
            triton = self.device.type == "cuda" and kernel.available()
        self.kernel = triton
        # the kernel may address host memory (always under the interpreter: the CPU's addresses)
        self.to_host = triton and (self.device.type != "cuda" or kernel.reaches_host(self.device))
        launch = kernel.launch_for(int(self.page_bytes.max()))  # the grid kernel's
        warmed = not (triton and grids and self.device.type == "cuda") or kernel.warm(
            launch, self.device
        )
        self.launch = launch if warmed else kernel.LARGE  # compiled by ``kernel.available``
        if programs:
            self.launch = self.launch._replace(programs=programs)
        self.staged = self.device.type != "cpu" if staged is None else staged
        self._stage = torch.empty(0, dtype=torch.uint8, device=self.device)
        self._word = self.spaces.tensors[0].dtype
        self.uploads = Uploads(self.device)  # each job's tables, through memory kept for them

    def batches(self, pages: Pages) -> list[Batch]:
        return list(self._batches(pages))

    def _batches(self, pages: Pages) -> Iterator[Batch]:
        """Each batch planned as it is asked for (``_move``: while the device copies the one
        before)."""
        return iter_batches(pages, self.spaces, self.page_bytes, self.stage_bytes, self.host_piece)

    def pieces(
        self, pages: Pages, host: torch.Tensor, store: bool, piece_bytes: int
    ) -> list[Callable[[], None]]:
        """Views on the CPU: the copies of ``pages`` straight between the engine and ``host``
        (1-D bytes, no staging), as pieces of about ``piece_bytes`` that copy lanes may run in
        any order and side by side (``direct.py``)."""
        if self.staged:
            raise ValueError(f"kvtier: direct copies need the engine on the CPU, not {self.device}")
        if not len(pages.views):
            return []
        (batch,) = plan_batches(pages, self.spaces, self.page_bytes, 1 << 62)
        return direct_pieces(batch, self.spaces, host, store, piece_bytes)

    def store(self, pages: Pages | Grids, host: torch.Tensor, pinned: bool = True) -> int:
        """Queue the copies of ``pages`` into ``host`` (1-D bytes; ``pinned``: all of it is,
        which the ``KERNEL`` mechanism needs); the bytes moved."""
        return self._move(pages, host, pinned, store=True)

    def load(self, pages: Pages | Grids, host: torch.Tensor, pinned: bool = True) -> int:
        """Queue the copies of ``host`` (1-D bytes) into ``pages``; the bytes moved."""
        return self._move(pages, host, pinned, store=False)

    def _move(self, pages: Pages | Grids, host: torch.Tensor, pinned: bool, store: bool) -> int:
        try:
            return self._queue(pages, host, pinned, store)
        finally:  # what it uploaded is read by what it queued, however far it got
            self.uploads.queued()

    def _queue(self, pages: Pages | Grids, host: torch.Tensor, pinned: bool, store: bool) -> int:
        mechanism = self.mechanisms.store if store else self.mechanisms.load
        straight = mechanism is Mechanism.KERNEL and self.to_host and pinned
        if not isinstance(pages, Pages):
            moved = None
            if self.staged and straight:
                moved = self._grids(pages, host, store)
            elif self.staged and self.kernel:
                moved = self._staged_grids(pages, host, store)
            if moved is not None:
                return moved
            pages = Pages.join([g.pages(self.page_bytes) for g in pages])
        if not self.staged:
            for piece in self.pieces(pages, host, store, 1 << 62):
                piece()
            return int(self.page_bytes[pages.views].sum())
        if straight and self._straight(pages, host, store):
            return int(self.page_bytes[pages.views].sum())
        moved = 0
        for batch in self._batches(pages):
            stage, rows = self._area(batch.nbytes)
            if not store:
                _host_copies(batch.copies, host, stage, store)
            for gather in batch.gathers:
                self._gather(gather, stage, rows, store)
            if store:
                _host_copies(batch.copies, host, stage, store)
            moved += batch.nbytes
        return moved

    def _gather(self, gather: Gather, stage: torch.Tensor, rows: torch.Tensor, store: bool) -> None:
        """One space's rows of a batch: engine -> staging (``store``), or staging -> engine."""
        space, index, staged = gather
        tensor = self.spaces.tensors[space]
        unit = self.spaces.unit
        if self.kernel:
            order = np.arange(len(index)) if staged is None else staged
            engine = tensor.data_ptr() + index * unit
            area = stage.data_ptr() + order * unit
            src, dst = (engine, area) if store else (area, engine)
            if kernel.fits(src, dst, np.full(1, unit, dtype=np.int64)):
                self._kernel(src, dst, np.full(len(index), unit, dtype=np.int64))
                return
        ids = self._upload(index)
        if staged is None and store:
            torch.index_select(tensor, 0, ids, out=rows[: len(index)])
        elif staged is None:
            tensor.index_copy_(0, ids, rows[: len(index)])
        elif store:
            rows.index_copy_(0, self._upload(staged), tensor.index_select(0, ids))
        else:
            tensor.index_copy_(0, ids, rows[self._upload(staged)])

    def _straight(self, pages: Pages, host: torch.Tensor, store: bool) -> bool:
        """The ``KERNEL`` mechanism: every page straight between the engine and pinned host
        memory; False (nothing queued) where the kernel cannot move them."""
        space, first = self.spaces.rows_of(pages.views, pages.blocks)
        bases = np.array([t.data_ptr() for t in self.spaces.tensors], dtype=np.int64)
        engine = bases[space] + first * self.spaces.unit
        at = host.data_ptr() + pages.host
        size = self.page_bytes[pages.views]
        src, dst = (engine, at) if store else (at, engine)
        if not kernel.fits(src, dst, size):
            return False
        self._kernel(src, dst, size)
        return True

    def _grids(self, grids: Grids, host: torch.Tensor, store: bool) -> int | None:
        """The ``KERNEL`` mechanism on grids: one launch per grid over one uploaded table;
        None (nothing queued) where the kernel cannot move them."""
        found = grid.tables(grids, self._engine_table, host.data_ptr(), self.launch.word)
        if found is None:
            return None
        flat = self._upload(found.flat)
        for span in found.grids:
            kernel.grid_copy(flat, span, host.data_ptr(), store, self.launch)
        return sum(int(self.page_bytes[g.views].sum()) * len(g.blocks) for g in grids)

    def _staged_grids(self, grids: Grids, host: torch.Tensor, store: bool) -> int | None:
        """The ``DMA`` mechanism on grids (``staged_grids.py``): per batch, the grid kernel
        between the engine and the staging area and a copy per run of host bytes, over one
        uploaded table; None (nothing queued) where the kernel cannot address the pages."""
        batches = self.staged_batches(grids)
        if not batches:
            return 0
        stage, _ = self._area(max(b.nbytes for b in batches))
        found = grid.tables([g for b in batches for g in b.grids], self._engine_table,
                            stage.data_ptr(), self.launch.word)  # fmt: skip
        if found is None:
            return None
        flat = self._upload(found.flat)
        spans = iter(found.grids)
        for batch in batches:
            if not store:
                _host_copies(batch.copies, host, stage, store)
            for span in [next(spans) for _ in batch.grids]:
                kernel.grid_copy(flat, span, stage.data_ptr(), store, self.launch)
            if store:
                _host_copies(batch.copies, host, stage, store)
        return sum(int(self.page_bytes[g.views].sum()) * len(g.blocks) for g in grids)

    def staged_batches(self, grids: Grids) -> list[StagedBatch]:
        """How the ``DMA`` mechanism stages ``grids`` (``staged_grids.py``)."""
        return staged_batches(grids, self.page_bytes, self.stage_bytes, self.host_piece)

    def _kernel(self, src: np.ndarray, dst: np.ndarray, size: np.ndarray) -> None:
        """Queue the copies on the current stream, joined where both sides are adjacent."""
        src, dst, size = _joined(src, dst, size)
        table = self._upload(np.concatenate([src, dst, size]))
        kernel.copy(table, len(size), self.programs)

    def _area(self, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The staging area's first ``nbytes`` as bytes, and all of it as rows of the unit;
        grown (in stream order) when a batch needs more."""
        if self._stage.numel() < nbytes:
            self._stage = torch.empty(
                max(nbytes, min(self.stage_bytes, 2 * self._stage.numel())),
                dtype=torch.uint8,
                device=self.device,
            )
        unit = self.spaces.unit
        usable = self._stage.numel() // unit * unit
        rows = self._stage[:usable].view(self._word).view(usable // unit, -1)
        return self._stage[:nbytes], rows

    def _upload(self, index: np.ndarray) -> torch.Tensor:
        """``index`` on the device, through pinned memory kept for it (``uploads.py``; a
        pageable source would make the copy wait for the stream's earlier work)."""
        return self.uploads.put(index)


def _host_copies(copies: np.ndarray, host: torch.Tensor, stage: torch.Tensor, store: bool) -> None:
    """Queue ``copies`` (``(host offset, staging offset, bytes)`` rows): stage -> host when
    ``store``, else host -> stage."""
    for at, offset, size in copies.tolist():
        there, here = host[at : at + size], stage[offset : offset + size]
        (there if store else here).copy_(here if store else there, non_blocking=True)


def _joined(
    src: np.ndarray, dst: np.ndarray, size: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copies ``i`` and ``i + 1`` joined where both sides continue one another."""
    order = np.argsort(dst, kind="stable")
    src, dst, size = joined(np.stack([src, dst, size], axis=1)[order]).T
    return src, dst, size
