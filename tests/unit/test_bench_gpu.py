"""``kvtier bench gpu`` run here on CPU tensors: its orchestration, its files, its failures.

The GPU session that runs it for real has one try: these check, on the CPU, that every measure
runs and lands in the JSON with finite figures, that one measure's failure (or hang) costs only
its own figures, that the Markdown renders, and that it needs nothing the GPU machine lacks (no
vLLM: ``gpu_machine.py``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvtier.apps.bench.common.redis_server import redis_server_binary
from kvtier.apps.bench.gpu.deadline import deadline
from kvtier.apps.bench.gpu.figures import FIGURES, Measured, Results, Unavailable, rows, summary
from kvtier.apps.bench.gpu.launches import candidates
from kvtier.apps.bench.gpu.markdown import pytest_summary, render
from kvtier.pages.kernel import MAX_PAGES, Launch, launch_for

ROOT = Path(__file__).resolve().parents[2]
VLLM_LOADED = "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))"


def _python(code: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # as ``make test-gpu`` runs it: a fresh shell's PATH and HOME, the source tree, no hub
    env = {**{k: os.environ[k] for k in ("PATH", "HOME")}, "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1"}  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)  # fmt: skip


def _need_redis() -> None:
    if redis_server_binary() is not None:
        return
    if os.environ.get("KVTIER_TEST_REQUIRE_REDIS") == "1":
        pytest.fail("redis-server is not on PATH, and KVTIER_TEST_REQUIRE_REDIS=1 requires it")
    pytest.skip("redis-server is not on PATH (scripts/install-test-servers)")


def _finite(value: Any) -> bool:
    parts = value.values() if "median" not in value else [value]
    return all(math.isfinite(p[k]) for p in parts for k in ("min", "median", "max"))


def test_a_quick_cpu_run_measures_every_figure_with_the_gpu_machines_modules(
    tmp_path: Path,
) -> None:
    _need_redis()
    argv = ["bench", "gpu", "--device", "cpu", "--quick", "--shapes", "tiny", "--tokens", "2048",
            "--out", str(tmp_path)]  # fmt: skip
    done = _python(f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import gpu_machine; "
                   "gpu_machine.restrict(); "  # no vLLM, as there
                   f"from kvtier.apps.cli import main; sys.exit(main({argv!r}))")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((tmp_path / "gpu.json").read_text())
    assert document["errors"] == []
    assert document["device_type"] == "cpu" and document["quick"] and document["reps"] == 3
    shape = document["shapes"]["tiny"]
    assert set(FIGURES) <= set(shape)
    for figure in FIGURES:
        assert shape[figure] is not None, (figure, shape["why_null"].get(figure))
        assert _finite(shape[figure]), (figure, shape[figure])
    assert set(shape["host_store_ratio"]) == {"cpu"}  # no dma/kernel without CUDA
    profiled = shape["details"]["host"]["submit_profile"]  # what a job's time is made of
    assert set(profiled) == {"store_cpu", "load_cpu"}
    assert all(row["ms_per_job"] >= 0 and row["function"] for row in profiled["store_cpu"])
    assert shape["details"]["host"]["call_us"] == {}  # CUDA's calls, timed on CUDA only
    queued = shape["details"]["host"]["submit_ms_queued"]  # submits back to back, beside
    assert set(queued) == {"cpu"} and queued["cpu"]["min"] > 0 and len(queued["cpu"]["values"]) == 3
    planned = shape["details"]["host"]["plan_ms"]  # the engine thread's planning, per mechanism
    assert set(planned) == {"dma", "kernel"} and all(p["min"] > 0 for p in planned.values())
    disk = shape["details"]["disk"]  # cold reads were cold, warm reads warm, for both sides
    assert disk["resident_after_drop"] < 0.05 and disk["resident_before_warm"] > 0.95, disk
    for figure in ("checksum_ceiling", "checked_ratio", "reads_ratio"):  # where the time goes
        assert all(disk[figure][t]["min"] > 0 for t in ("warm", "cold")), disk[figure]
    assert "CUDA" in shape["details"]["launches"]["unavailable"]  # timed on a GPU only
    pulled = shape["details"]["pull"]["pull_profile"]  # and a pull's
    assert any("recv" in row["function"] for row in pulled), pulled  # the socket's receive
    assert shape["why_null"] == {}
    assert document["pinning_rate_bytes_s"] is None
    assert "CPU" in document["why_null"]["pinning_rate_bytes_s"]
    markdown = (tmp_path / "gpu.md").read_text()
    assert "| tiny | host_load_ratio | cpu |" in markdown
    assert (tmp_path / "gpu.png").stat().st_size > 0
    assert "host_store_ratio" in done.stdout  # the table


def test_the_bench_modules_import_no_vllm() -> None:
    modules = ["kvtier.apps.cli", "kvtier.apps.bench.commands", "kvtier.apps.bench.gpu.run"]
    done = _python(f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
                   f"{VLLM_LOADED}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_a_measure_that_fails_records_its_error_and_the_rest_go_on(tmp_path: Path) -> None:
    results = Results(tmp_path / "gpu.json", {"device": "test"})
    results.shape("tiny")

    def broken() -> Measured:
        raise RuntimeError("the device fell over")

    def absent() -> Measured:
        raise Unavailable("no redis-server on PATH")

    def fine() -> Measured:
        return Measured({"pull_ratio": summary([0.9, 1.0, 1.1])}, {}, {"bytes": 1})

    assert results.attempt("tiny", "host", ("host_store_ratio", "host_load_ratio"), broken) is None
    assert results.attempt("tiny", "redis", ("redis_ratio",), absent) is None
    assert results.attempt("tiny", "pull", ("pull_ratio",), fine) is not None
    saved = json.loads((tmp_path / "gpu.json").read_text())  # written after every measure
    shape = saved["shapes"]["tiny"]
    assert shape["host_store_ratio"] is None and shape["host_load_ratio"] is None
    assert shape["why_null"]["host_load_ratio"] == "error: RuntimeError: the device fell over"
    assert shape["why_null"]["redis_ratio"] == "no redis-server on PATH"
    assert shape["pull_ratio"]["median"] == 1.0 and "pull_ratio" not in shape["why_null"]
    assert shape["details"]["pull"] == {"bytes": 1}
    assert [(e["measure"], e["error"]) for e in saved["errors"]] == [
        ("host", "error: RuntimeError: the device fell over")
    ]
    table = {(r["figure"], r["median"], r["met"]) for r in rows(saved)}
    assert ("pull_ratio", 1.0, True) in table and ("redis_ratio", None, None) in table


def test_a_measure_past_its_limit_is_interrupted(tmp_path: Path) -> None:
    results = Results(tmp_path / "gpu.json", {})
    stuck: list[bool] = []

    def hangs() -> Measured:
        time.sleep(30)
        return Measured()

    started = time.monotonic()
    with deadline(0.2, lambda: stuck.append(True)):
        results.attempt("tiny", "disk", ("disk_warm_ratio",), hangs)
    assert time.monotonic() - started < 5 and not stuck
    why = results.document["shapes"]["tiny"]["why_null"]["disk_warm_ratio"]
    assert why.startswith("error: MeasureTimeout: still running after 0 s")


def test_measures_past_the_runs_budget_are_cut_short_or_not_started(tmp_path: Path) -> None:
    """``--budget-s``: a measure gets at most what is left of it, and none starts once it is
    spent; each one's figures are null with the reason, and the run goes on to write."""
    import torch
    from tqdm import tqdm

    from kvtier.apps.bench.gpu.run import Options, _Bench

    options = Options(out=tmp_path, shapes=("tiny",), reps=1, limit_s=60.0, budget_s=0.3)
    results = Results(tmp_path / "gpu.json", {})
    results.shape("tiny")

    def hangs() -> Measured:
        time.sleep(30)
        return Measured()

    with tqdm(total=2, disable=True) as bar:
        bench = _Bench(options, torch.device("cpu"), results, bar)
        started = time.monotonic()
        assert bench.attempt("tiny", "disk", ("disk_warm_ratio",), hangs) is None
        assert time.monotonic() - started < 5  # the budget's 0.3 s, not --limit-s's 60
        assert bench.attempt("tiny", "pull", ("pull_ratio",), hangs) is None
    why = json.loads((tmp_path / "gpu.json").read_text())["shapes"]["tiny"]["why_null"]
    assert why["disk_warm_ratio"].startswith("error: MeasureTimeout: still running after 0 s")
    assert why["pull_ratio"] == "not run: the run's --budget-s was spent"


def test_the_disk_bound_reads_the_same_bytes_by_one_thread_or_several(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the engine's disk tier reads files side by side (4 readers on a 16-core GPU host),
    its bound reads side by side too, and the read that hashes as kvtier does: the same bytes
    land every way."""
    import numpy as np
    import torch

    from kvtier.apps.bench.gpu import disk_load

    monkeypatch.setattr(disk_load, "RAW_IO", 1000)  # several calls per range
    rng = np.random.default_rng(0)
    records = [rng.integers(0, 256, n, dtype=np.uint8) for n in (5000, 12345, 7)]
    raw = disk_load._RawFile(tmp_path / "raw.bin", records, torch.device("cpu"), 3)
    try:
        for read in (raw.read, raw.read_parallel, raw.read_checked):
            raw.host.zero_()
            raw.engine.zero_()
            read()
            assert raw.engine.numpy().tobytes() == b"".join(r.tobytes() for r in records)
    finally:
        raw.close()


def test_the_markdown_names_the_device_the_tests_and_every_figure() -> None:
    document = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-01-01T00:00:00Z",
                "quick": True, "reps": 3, "tokens": 4096, "runtime_s": 100.0, "torch": "2.x",
                "default_mechanism": "kernel",
                "shapes": {"8b": {"host_store_ratio": {"dma": summary([0.95]),
                                                       "kernel": summary([0.85])},
                                  "why_null": {},
                                  "details": {"disk": {"readers": 4, "one_reader_ratio": {
                                      "warm": summary([0.71]), "cold": summary([0.52])},
                                      "checksum_ceiling": {"warm": summary([0.8]),
                                                           "cold": summary([0.97])},
                                      "checked_ratio": {"warm": summary([0.6]),
                                                        "cold": summary([1.01])},
                                      "reads_ratio": {"warm": summary([0.7]),
                                                      "cold": summary([0.9])},
                                      "variants": {"kvtier_more_readers": {
                                          "readers": 8, "stage_bytes": 64 << 20, "ratio": {
                                              "warm": summary([1.3]), "cold": summary([1.0])}}}},
                                              "launches": _swept()}}},
                "why_null": {"pinning_rate_bytes_s": "not measured"}, "errors": []}  # fmt: skip
    text = render(document, tests="40 passed, 2 skipped in 30.1s")
    assert "- device: NVIDIA H100 80GB HBM3" in text and "40 passed, 2 skipped" in text
    assert "| 8b | host_store_ratio | dma | 0.95 | 0.95 | 0.95 | >= 0.9 | yes |" in text
    assert "| 8b | host_store_ratio | kernel | 0.85 | 0.85 | 0.85 | >= 0.9 | **no** |" in text
    assert "- 8b hit_over_prefill: not measured" in text  # a figure never measured says so
    assert "- an engine's mechanism (`KVTIER_GPU_COPY`): kernel" in text
    assert (
        "- 8b disk: 4 files read at once; one at a time, median ratio warm 0.71, cold 0.52" in text
    )
    assert ("- 8b disk: reads that hash every piece reach, median, warm 0.8, cold 0.97 of the "
            "bound; kvtier's loads 0.6, 1.01 of those") in text  # fmt: skip
    assert "- 8b disk: kvtier's reads alone, nothing moved, median ratio warm 0.7, cold 0.9" in text
    assert ("- 8b disk: kvtier_more_readers (8 readers, halves of 64 MiB): kvtier's time over its "
            "own, median, warm 1.3, cold 1") in text  # fmt: skip
    assert ("- 8b grid kernel, pages of 32768 bytes, on the device alone, median: 1 page(s) a "
            "step of 4096 words, 8 warps, 32 programs (chosen) store 0.93, load 0.92; fastest: "
            "store 1 page(s) a step of 8192 words, 16 warps, 32 programs 0.95; load 1 page(s) a "
            "step of 4096 words, 8 warps, 32 programs 0.92") in text  # fmt: skip
    assert ("- 8b grid kernel: 1 page(s) a step of 4096 words, 8 warps, 64 programs moved other "
            "bytes than the request's") in text  # fmt: skip


def _swept() -> dict[str, Any]:
    """``launches.measure``'s details: the chosen launch, a faster store, one that failed."""
    chosen, wide = Launch(1, 4096, 8, 32), Launch(1, 8192, 16, 32)
    return {"page_bytes": 32768, "chosen": chosen._asdict(),
            "launches": [{"launch": chosen._asdict(), "intact": True,
                          "store": summary([0.93]), "load": summary([0.92])},
                         {"launch": wide._asdict(), "intact": True,
                          "store": summary([0.95]), "load": summary([0.9])},
                         {"launch": chosen._replace(programs=64)._asdict(), "intact": False,
                          "store": summary([0.99]), "load": summary([0.99])}],
            "fastest": {"store": wide._asdict(), "load": chosen._asdict()}}  # fmt: skip


def test_the_launches_timed_start_with_the_chosen_one_and_reach_one_step_a_page() -> None:
    """An MLA page (72 KiB) is 2.25 of ``launch_for``'s steps: a step of the whole page is
    among those timed. Small pages: several a step, each page the same share of a step."""
    for page in (64 * 576 * 2, 32 << 10, 16 << 10, 4 << 10, 2 << 10, 512):
        found = candidates(page)
        assert found[0] == launch_for(page) and len(set(found)) == len(found) >= 4, page
        for launch in found:
            assert launch.block & (launch.block - 1) == 0 and launch.block % launch.pages == 0
            assert 1 <= launch.pages <= MAX_PAGES and launch.programs >= 1
            if launch.pages > 1:  # each page the share launch_for gives it
                chosen = launch_for(page)
                assert launch.block // launch.pages == chosen.block // chosen.pages
    assert Launch(1, 16384, 16, 32) in candidates(64 * 576 * 2)  # 9,216 words a page, one step
    assert Launch(1, 8192, 16, 32) in candidates(32 << 10)


@pytest.mark.parametrize(
    ("log", "summary_line"),
    [
        ("....\n40 passed, 2 skipped, 1 warning in 30.12s\n", "40 passed, 2 skipped in 30.12s"),
        ("== 1 failed, 3 passed in 2.00s ==\n", "1 failed, 3 passed in 2.00s"),
        ("\n52 skipped in 1.50s\n", "52 skipped in 1.50s"),
        ("Traceback ...\nImportError: no module named redis\n", "no summary line"),
    ],
)
def test_the_pytest_summary_is_read_from_its_last_line(log: str, summary_line: str) -> None:
    assert pytest_summary(log).startswith(summary_line)


def test_bad_arguments_are_refused_with_the_valid_names(capsys: pytest.CaptureFixture[str]) -> None:
    from kvtier.apps.cli import main

    assert main(["bench", "gpu", "--shapes", "8b,9b"]) == 2
    assert "valid: 8b, 70b-tp8, mla, hybrid, bench, tiny" in capsys.readouterr().out
    assert main(["bench", "gpu", "--measures", "host,gpu"]) == 2
    assert "valid: host, prefill, beside" in capsys.readouterr().out
    assert main(["bench", "gpu", "--budget-s", "0"]) == 2
    assert "--budget-s must be positive, got 0.0" in capsys.readouterr().out


def test_the_loader_that_reads_ahead_has_files_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the engine reads several files at once, the loader timed beside it that reads one
    at a time asks the kernel to read files ahead, which leaves them in the page cache in small
    pages that every later read copies slower: it reads a copy of the files, so that kvtier's
    warm reads find the pages its own reads brought."""
    import threading

    import torch

    from kvtier.apps.bench.gpu import disk_load
    from kvtier.apps.bench.gpu.clock import Clock
    from kvtier.apps.bench.gpu.shapes import SHAPES
    from kvtier.tiers.disk.files import DiskTier

    monkeypatch.setattr(disk_load, "default_readers", lambda device: 2)
    ahead: set[Path] = set()  # the roots of the files asked to be read ahead
    beside: set[Path] = set()  # and of those read by readers beside each other
    prefetch, read = DiskTier.prefetch, DiskTier.read

    def asked(tier: DiskTier, key: bytes) -> None:
        ahead.add(tier.root)
        prefetch(tier, key)

    def reading(tier: DiskTier, key: bytes, out: Any) -> None:
        if "-read" in threading.current_thread().name:
            beside.add(tier.root)
        read(tier, key, out)

    monkeypatch.setattr(DiskTier, "prefetch", asked)
    monkeypatch.setattr(DiskTier, "read", reading)
    cpu = torch.device("cpu")
    measured = disk_load.measure(SHAPES["tiny"], 1024, cpu, 1, Clock(cpu), tmp_path)
    assert ahead and beside and not ahead & beside, (ahead, beside)
    assert {"warm", "cold"} <= set(measured.details["one_reader_ratio"])
    # and kvtier's loads with the next defaults to weigh: larger halves, more readers
    variants = measured.details["variants"]
    assert [v["readers"] for v in variants.values()] == [2, 4]
    assert all(v["ratio"]["warm"]["min"] > 0 for v in variants.values())
