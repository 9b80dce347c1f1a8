"""kvtier's Triton kernels compiled ahead of time for the GPUs vLLM runs on, where there is no
GPU: Triton lowers them to PTX and its own ``ptxas`` assembles them for a named architecture.

``python compiled_kernels.py`` (Triton importable) compiles both kernels of
``kvtier/pages/kernel.py`` with the argument types their launches have (tables of int64, counts
that fit 32 bits, a host address that does not), the grid kernel both ways, for each of
``ARCHS``, and prints one JSON object: per architecture and kernel, its cubin's bytes, or the
error. ``tests/unit/test_kernels_on_cpu.py`` runs it in a process of its own.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from kvtier.pages import kernel

ARCHS = {"A100": 80, "L40S": 89, "H100 H200": 90, "B200": 100}


def _compiled(fn: Any, signature: dict[str, str], constants: dict[str, Any], arch: int) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature=signature | dict.fromkeys(constants, "constexpr"),
                       constexprs=constants)  # fmt: skip
    return len(triton.compile(source, target=GPUTarget("cuda", arch, 32)).asm["cubin"])


def main() -> None:
    grid = {"per_view": "*i64", "per_block": "*i64", "V": "i32", "K": "i32", "host": "i64"}
    block = {"BLOCK": kernel.BLOCK_WORDS}
    kernels: dict[str, tuple[Any, dict[str, str], dict[str, Any]]] = {
        "copy": (kernel._kernel(), {"table": "*i64", "n": "i32"}, block),
        "grid store": (kernel._grid_kernel(), grid, block | {"STORE": True}),
        "grid load": (kernel._grid_kernel(), grid, block | {"STORE": False}),
    }
    results: dict[str, dict[str, int | str]] = {}
    for name, arch in ARCHS.items():
        results[name] = {}
        for which, (fn, signature, constants) in kernels.items():
            try:
                size: int | str = _compiled(fn, signature, constants, arch)
            except Exception:
                size = traceback.format_exc()
            results[name][which] = size
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
