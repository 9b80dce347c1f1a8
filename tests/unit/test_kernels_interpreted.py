"""kvtier's two Triton kernels (``kvtier/pages/kernel.py``) run where no GPU is: every KV layout
moved both ways through ``PageMover`` with the kernels on, under Triton's interpreter, on CPU
memory (``tests/interpreted_kernels.py``, in a process of its own). What this checks is the
kernels' arithmetic — which bytes each program moves where, the grid kernel's page addresses
computed from its tables — byte for byte; what only a GPU shows (compiling, unified addressing
of pinned host memory, speed) is ``tests/gpu``'s.

``make venv`` installs Triton for the interpreter into ``.venv/triton-interpreter``, outside the
environment's packages (Triton installed there breaks vLLM on the CPU), and ``make test`` names
it (``KVTIER_TRITON_SITE``); run elsewhere without it, skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from interpreted_kernels import CASES, Case

TESTS = Path(__file__).resolve().parents[1]
GIVEN = os.environ.get("KVTIER_TRITON_SITE")  # make test names it: there, it must be
SITE = Path(GIVEN or Path(sys.prefix) / "triton-interpreter")


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    if not (SITE / "triton").is_dir():
        assert not GIVEN, f"KVTIER_TRITON_SITE={GIVEN} holds no Triton"
        pytest.skip(f"no Triton for the interpreter in {SITE} (make venv installs it)")
    path = os.pathsep.join([str(SITE), str(TESTS.parent), str(TESTS)])
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, str(TESTS / "interpreted_kernels.py")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    results: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return results


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_kernels_move_every_layout_byte_exact_both_ways(
    interpreted: dict[str, dict[str, Any]], case: Case
) -> None:
    done = interpreted[case.id]
    assert done["error"] is None, done["error"]
    if case.mechanism == "kernel" and case.pinned and case.grids:
        # the grid kernel: one launch per grid of the job, no page table
        assert (done["grid"], done["copy"]) == (2 * done["grids"], 0)
    elif case.mechanism == "kernel" and case.pinned:
        assert (done["grid"], done["copy"]) == (0, 2)  # every page straight, one launch a move
    else:  # through the staging area: the copy kernel is each space's gather
        assert (done["grid"], done["copy"]) == (0, 2 * done["gathers"])
