"""kvtier's two Triton kernels (``kvtier/pages/kernel.py``) checked where no GPU is, each way in
a process of its own:

- interpreted (``tests/interpreted_kernels.py``): every KV layout moved both ways through
  ``PageMover`` with the kernels on, under Triton's interpreter, on CPU memory — the kernels'
  arithmetic, which bytes each program moves where and the grid kernel's page addresses, byte
  for byte;
- compiled (``tests/compiled_kernels.py``): both kernels lowered and assembled for the GPUs vLLM
  runs on, as their launches type them; and compiled once by ``kernel.available()`` at the
  engine's start, for the argument types the mover's jobs bind.

What only a GPU shows (unified addressing of pinned host memory, streams, speed) is
``tests/gpu``'s. ``make venv`` installs Triton into ``.venv/triton-interpreter``, outside the
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
from compiled_kernels import ARCHS
from interpreted_kernels import CASES, Case

from kvtier.pages.kernel import LARGE_PAGE, launch_for

TESTS = Path(__file__).resolve().parents[1]
GIVEN = os.environ.get("KVTIER_TRITON_SITE")  # make test names it: there, it must be
SITE = Path(GIVEN or Path(sys.prefix) / "triton-interpreter")
Results = dict[str, dict[str, Any]]


def _run(script: str, tmp: Path, **env: str) -> Results:
    """``script`` (in tests/) run with Triton importable; the JSON it prints."""
    if not (SITE / "triton").is_dir():
        assert not GIVEN, f"KVTIER_TRITON_SITE={GIVEN} holds no Triton"
        pytest.skip(f"no Triton in {SITE} (make venv installs it)")
    path = os.pathsep.join([str(SITE), str(TESTS.parent), str(TESTS)])
    env = os.environ | {"PYTHONPATH": path, "TRITON_CACHE_DIR": str(tmp)} | env
    done = subprocess.run([sys.executable, str(TESTS / script)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    results: Results = json.loads(done.stdout)
    return results


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return _run("interpreted_kernels.py", tmp_path_factory.mktemp("triton"), TRITON_INTERPRET="1")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return _run("compiled_kernels.py", tmp_path_factory.mktemp("triton"))


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_the_kernels_move_every_layout_byte_exact_both_ways(
    interpreted: Results, case: Case
) -> None:
    done = interpreted[case.id]
    assert done["error"] is None, done["error"]
    if case.mechanism == "store=dma,load=kernel":  # each direction its own way
        assert (done["grid"], done["copy"]) == (done["staged_grids"] + done["grids"], 0)
    elif case.mechanism == "kernel" and case.pinned and case.grids:
        # the grid kernel: one launch per grid of the job, no page table
        assert (done["grid"], done["copy"]) == (2 * done["grids"], 0)
    elif case.mechanism == "kernel" and case.pinned:
        assert (done["grid"], done["copy"]) == (0, 2)  # every page straight, one launch a move
    elif case.grids:  # staged: the grid kernel into each batch's records, no page table
        assert done["staged_batches"] >= 1
        assert (done["grid"], done["copy"]) == (2 * done["staged_grids"], 0)
    else:  # staged page by page: the copy kernel is each space's gather
        assert (done["grid"], done["copy"]) == (0, 2 * done["gathers"])


def test_the_engine_compiles_the_kernels_at_its_start_and_no_job_compiles_again(
    compiled: Results,
) -> None:
    warmup = compiled["warmup"]
    assert warmup["available"] is True
    assert warmup["warmed"] == {"copy_kernel": 1, "grid_kernel": 2}  # the grid kernel both ways
    # a mover of 4 KiB pages: its pages a step, both ways, at its start
    assert warmup["warm small"] is True
    assert warmup["warmed small"] == {"copy_kernel": 1, "grid_kernel": 4}
    assert warmup["launched"] == warmup["warmed small"]
    # each loaded onto the GPU as it is compiled, before any job: a page a step, then the small
    assert warmup["loaded"] == [1, launch_for(4096).pages]


def test_the_kernels_are_launched_with_nothing_to_move_at_the_start(interpreted: Results) -> None:
    """``kernel._load``'s launches, which load each kernel onto the GPU before any job (two
    threads' first launches of one kernel race in Triton), run: their arguments are the
    kernels' own."""
    assert interpreted["load"] == {"1": None, "4": None, "16": None}


def test_every_launch_the_gpu_bench_times_moves_the_request_byte_exact(
    interpreted: Results,
) -> None:
    """``kvtier bench gpu`` times launches of the grid kernel other than ``launch_for``'s
    (``launches.py``), to find a faster one: each must move the right bytes, both ways, for a
    page 2.25 steps long and for small pages several a step."""
    done = interpreted["launches"]
    assert set(done) == {str(64 * 576 * 2), "2048"}
    for page, launches in done.items():
        assert len(launches) >= 4, page
        assert all(error is None for error in launches.values()), (page, launches)


def test_every_launch_the_gpu_bench_times_compiles_for_an_h100(compiled: Results) -> None:
    candidates = compiled["candidates"]
    assert {"store 1-16384-16-32", "load 1-16384-16-32"} <= set(candidates)  # MLA: one step
    for which, size in candidates.items():
        assert isinstance(size, int) and size > 0, (which, size)


def test_several_small_pages_a_step_move_in_16_byte_vectors(compiled: Results) -> None:
    """Small pages go several a step, their addresses multiples of 16 bytes (``grid.tables``
    checks): Triton, told so, moves 16-byte vectors each way (measured on an H200, 4 KiB pages:
    0.85-0.89 of one contiguous copy, 0.82-0.83 in 8-byte words). A large page a step keeps
    words: there, 16-byte stores to host memory ran at an eighth of the speed."""
    vectors = ["ld.global.v2.b64", "st.global.v2.b64"]
    for way in ("store", "load"):
        for page in (16 << 10, 4 << 10, 512):
            assert compiled["vectors"][f"grid {way} {page}"] == vectors, (way, page)
        assert compiled["vectors"][f"grid {way} {LARGE_PAGE}"] == [], way


@pytest.mark.parametrize("gpu", list(ARCHS))
def test_the_kernels_compile_for_the_gpus_vllm_runs_on(compiled: Results, gpu: str) -> None:
    for which, size in compiled[gpu].items():
        assert isinstance(size, int) and size > 0, (which, size)
