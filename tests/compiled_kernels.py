"""kvtier's Triton kernels compiled ahead of time for the GPUs vLLM runs on, where there is no
GPU: Triton lowers them to PTX and its own ``ptxas`` assembles them for a named architecture.

``python compiled_kernels.py`` (Triton importable) compiles both kernels of
``kvtier/pages/kernel.py`` with the argument types their launches have (tables of int64, counts
that fit 32 bits, a host address that does not), the grid kernel both ways and a page or several
a step, for each of ``ARCHS``, and prints one JSON object: per architecture and kernel, its
cubin's bytes, or the error. Then, under ``"warmup"``, what ``kernel.available()`` compiled at
its warm-up, what a mover of small pages added (``kernel.warm``), and what there was after the
mover's launches' argument types were bound (the same: a job compiles nothing), with Triton's
driver standing in for an H100's (a stand-in that compiles, never launches: ``"loaded"`` lists
the pages a step that ``kernel._load`` was asked to load).
``tests/unit/test_kernels_on_cpu.py`` runs it in a process of its own.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from typing import Any

from kvtier.pages import kernel

ARCHS = {"A100": 80, "L40S": 89, "H100 H200": 90, "B200": 100}


def _compiled(
    fn: Any, signature: dict[str, str], constants: dict[str, Any], arch: int, warps: int
) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature=signature | dict.fromkeys(constants, "constexpr"),
                       constexprs=constants)  # fmt: skip
    target = GPUTarget("cuda", arch, 32)
    return len(triton.compile(source, target=target, options={"num_warps": warps}).asm["cubin"])


def main() -> None:
    grid = {"per_view": "*i64", "per_block": "*i64", "V": "i32", "K": "i32", "host": "i64"}
    kernels: dict[str, tuple[Any, dict[str, str], dict[str, Any], int]] = {
        "copy": (kernel._kernel(), {"table": "*i64", "n": "i32"}, {"BLOCK": kernel.BLOCK_WORDS},
                 4),
    }  # fmt: skip
    for page in (kernel.LARGE_PAGE, 16 << 10, 4 << 10, 512):  # one a step, and several
        launch = kernel.launch_for(page)
        for way, store in (("store", True), ("load", False)):
            constants = {"STORE": store, "BLOCK": launch.block, "PAGES": launch.pages}
            kernels[f"grid {way} {page}"] = (kernel._grid_kernel(), grid, constants, launch.warps)
    results: dict[str, dict[str, int | str]] = {}
    for name, arch in ARCHS.items():
        results[name] = {}
        for which, (fn, signature, constants, warps) in kernels.items():
            try:
                size: int | str = _compiled(fn, signature, constants, arch, warps)
            except Exception:
                size = traceback.format_exc()
            results[name][which] = size
    results["vectors"] = _vectors(kernels)
    results["candidates"] = _candidates(grid)
    results["warmup"] = _warmed()
    json.dump(results, sys.stdout)


def _candidates(signature: dict[str, str]) -> dict[str, int | str]:
    """Each launch ``kvtier bench gpu`` times for the bench's page sizes
    (``launches.candidates``), the grid kernel compiled both ways for an H100: its cubin's
    bytes, or the error."""
    from kvtier.apps.bench.gpu.launches import candidates

    done: dict[str, int | str] = {}
    for page in (72 << 10, kernel.LARGE_PAGE, 16 << 10, 4 << 10):  # MLA, 8B, the bench's, 70B
        for launch in candidates(page):
            for way, store in (("store", True), ("load", False)):
                which = f"{way} {'-'.join(map(str, launch))}"
                if which in done:
                    continue
                constants = {"STORE": store, "BLOCK": launch.block, "PAGES": launch.pages}
                try:
                    done[which] = _compiled(kernel._grid_kernel(), signature, constants,
                                            ARCHS["H100 H200"], launch.warps)  # fmt: skip
                except Exception:
                    done[which] = traceback.format_exc()
    return done


def _vectors(kernels: dict[str, tuple[Any, dict[str, str], dict[str, Any], int]]) -> Any:
    """Per grid kernel, the width of its global loads and stores of data on an H100, as PTX
    names them (``v2.b64``: 16-byte vectors; ``b64``: one 8-byte word)."""
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    widths: dict[str, list[str]] = {}
    for which, (fn, signature, constants, warps) in kernels.items():
        if which.startswith("grid"):
            source = ASTSource(fn=fn, signature=signature | dict.fromkeys(constants, "constexpr"),
                               constexprs=constants)  # fmt: skip
            ptx = triton.compile(source, target=GPUTarget("cuda", ARCHS["H100 H200"], 32),
                                 options={"num_warps": warps}).asm["ptx"]  # fmt: skip
            widths[which] = sorted(set(re.findall(r"(?:ld|st)\.global\.v2\.b64", ptx)))
    return widths


def _warmed() -> dict[str, Any]:
    """``kernel.available()`` on an H100 that only compiles, then each kernel bound to
    arguments typed as the mover's launches type them; compiled variants after each."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Compiling:  # the driver calls a warm-up makes; a launch would fail
        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", ARCHS["H100 H200"], 32)

    driver.set_active(Compiling())
    loaded: list[int] = []  # the stand-in cannot load a kernel: each ``_load`` recorded
    kernel._load = lambda launch, device: loaded.append(launch.pages)  # type: ignore[assignment]
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.device = lambda index: contextlib.nullcontext()  # type: ignore[assignment,misc]
    copy, grid = kernel._kernel(), kernel._grid_kernel()

    def variants() -> dict[str, int]:
        caches = {f.fn.__name__: f.device_caches.values() for f in (copy, grid)}
        return {name: sum(len(c[0]) for c in each) for name, each in caches.items()}

    done: dict[str, Any] = {"available": kernel.available(), "warmed": variants()}
    small = kernel.launch_for(4096)  # a mover of 4 KiB pages, at its start
    done["warm small"] = kernel.warm(small, torch.device("cuda", 0))
    done["warmed small"] = variants()
    done["loaded"] = loaded
    table = torch.zeros(3 * 7, dtype=torch.int64)  # as ``PageMover._kernel`` uploads it
    copy.warmup(table, 7, BLOCK=kernel.BLOCK_WORDS, grid=(7,))
    flat = torch.zeros(64, dtype=torch.int64)  # as ``grid.tables`` lays a job out
    for store in (True, False):
        for launch in (kernel.LARGE, small):
            grid.warmup(flat[4:], flat[12:], 3, 5, table.data_ptr(), STORE=store,
                        BLOCK=launch.block, PAGES=launch.pages, num_warps=launch.warps,
                        grid=(15,))  # fmt: skip
    return done | {"launched": variants()}


if __name__ == "__main__":
    main()
