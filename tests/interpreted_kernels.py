"""kvtier's Triton kernels run on the CPU: every KV layout's round trip (``kv_layouts.py``)
through ``PageMover`` with the kernels on, under Triton's interpreter, which runs a kernel's
programs one after the other in numpy over the raw addresses it is given (CPU memory here).

``python interpreted_kernels.py`` runs every case of ``CASES`` in this process (Triton
importable, ``TRITON_INTERPRET=1`` set before it is imported) and prints one JSON object: per
case id, its error (None: byte-exact both ways), its kernel launches and what the plan did.
Under ``"load"``, each of ``kernel._load``'s launches with nothing to move, which load the
kernels onto a GPU at its start. Under ``"launches"``, per page size, each launch ``kvtier bench
gpu`` times (``launches.candidates``): whether it stores and loads a request byte for byte, as
the bench checks it. ``tests/unit/test_kernels_on_cpu.py`` runs it in a process of
its own: Triton must not be importable where vLLM runs on the CPU.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from kv_layouts import LAYOUTS, round_trip

PIECE = 3 * 4096  # the host tier pinned in pieces of 3 OS pages: no copy over a piece's end
STAGE = 64 << 20  # a staging area no job here fills


class Case(NamedTuple):
    layout: str
    mechanism: str  # "dma": the kernel gathers into the staging area; "kernel": straight;
    # or each direction's: "store=dma,load=kernel"
    grids: bool  # pages given as the host tier's handlers give them
    host_piece: int = 0
    stage_bytes: int = STAGE
    pinned: bool = True
    programs: int | None = None  # a launch's (None: the kernels')

    @property
    def id(self) -> str:
        given = "grids" if self.grids else "pages"
        extra = [f"piece{self.host_piece}"] if self.host_piece else []
        extra += [f"stage{self.stage_bytes}"] if self.stage_bytes != STAGE else []
        extra += [] if self.pinned else ["unpinned"]
        extra += [f"programs{self.programs}"] if self.programs else []
        return "-".join([self.layout, self.mechanism, given, *extra])


CASES = [
    Case(name, mechanism, grids, piece)
    for name in LAYOUTS
    for mechanism in ("dma", "kernel")
    for grids in (False, True)
    for piece in (0, PIECE)
]
CASES += [
    Case(name, "dma", grids, stage_bytes=PIECE)
    for name in ("flash_attn", "mla", "separate", "hybrid")
    for grids in (False, True)
]
CASES += [Case("flash_attn", "kernel", True, pinned=False)]
CASES += [Case(name, "store=dma,load=kernel", True) for name in ("flash_attn", "hybrid")]
CASES += [  # each program many steps (of several small pages, or one large)
    Case(name, mechanism, True, programs=3)
    for name in ("flash_attn", "fp8", "mla", "hybrid")
    for mechanism in ("kernel", "dma")
]


def _counting(launches: Counter[str]) -> None:
    """Count each kernel launch, by kernel, as the mover makes it."""
    from kvtier.pages import kernel

    def counted(name: str, launch: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any, **kwargs: Any) -> None:
            launches[name] += 1
            launch(*args, **kwargs)

        return run

    kernel.copy = counted("copy", kernel.copy)  # type: ignore[assignment]
    kernel.grid_copy = counted("grid", kernel.grid_copy)  # type: ignore[assignment]


def main() -> None:
    launches: Counter[str] = Counter()
    _counting(launches)
    results: dict[str, dict[str, Any]] = {}
    for case in CASES:
        launches.clear()
        try:
            done: dict[str, Any] = round_trip(
                case.layout, torch.device("cpu"), case.stage_bytes, staged=True,
                mechanism=case.mechanism, pinned=case.pinned, host_piece=case.host_piece,
                grids=case.grids, triton=True, programs=case.programs,
            )  # fmt: skip
            done["error"] = None
        except Exception:
            done = {"error": traceback.format_exc()}
        results[case.id] = done | {"copy": launches["copy"], "grid": launches["grid"]}
    results["load"] = _loaded()
    results["launches"] = _launches()
    json.dump(results, sys.stdout)


def _loaded() -> dict[str, Any]:
    """``kernel._load``'s launches with nothing to move, for one page a step and several: per
    count, the error (None: launched)."""
    from kvtier.pages import kernel

    done: dict[str, Any] = {}
    for page in (kernel.LARGE_PAGE, 4096, 512):  # 1, 4 and 16 pages a step
        launch = kernel.launch_for(page)
        try:
            kernel._load(launch, torch.device("cpu"))
            done[str(launch.pages)] = None
        except Exception:
            done[str(launch.pages)] = traceback.format_exc()
    return done


def _launches() -> dict[str, Any]:
    """Per shape (its pages' bytes), each candidate launch: None where ``Sweep.intact`` held,
    else why not. MLA's 72 KiB pages (a page is 2.25 of ``launch_for``'s steps) and the tests'
    2 KiB pages (several a step), both groups of a hybrid included."""
    from kvtier.apps.bench.gpu.host_copy import HostRig
    from kvtier.apps.bench.gpu.launches import Sweep, candidates
    from kvtier.apps.bench.gpu.shapes import SHAPES, Shape

    mla = Shape("mla-2", "two MLA layers", 2, (64, 576), False)
    done: dict[str, Any] = {}
    for shape, tokens in ((mla, 192), (SHAPES["tiny"], 1024)):
        rig = HostRig(shape, tokens, torch.device("cpu"))
        try:
            sweep = Sweep(rig)
            page = max(rig.host.records.page_bytes)
            done[str(page)] = {
                "-".join(map(str, launch)): _intact(sweep, launch) for launch in candidates(page)
            }
        finally:
            rig.close()
    return done


def _intact(sweep: Any, launch: Any) -> str | None:
    try:
        return None if sweep.intact(launch) else "moved other bytes"
    except Exception:
        return traceback.format_exc()


if __name__ == "__main__":
    main()
