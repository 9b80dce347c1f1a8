"""``kvtier bench scheduler`` end to end, on a few small requests, run as a user's fresh shell runs
it (only PATH and HOME): its files and its figures."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvtier.apps.bench.common.servers import KVTIER
from kvtier.apps.cli import main


def test_bench_scheduler_writes_json_and_png_with_min_median_max_and_ratios(
    tmp_path: Path,
) -> None:
    env = {name: os.environ[name] for name in ("PATH", "HOME")}
    args = ["bench", "scheduler", "--running", "4", "16", "--steps", "8", "--warmup", "4",
            "--context", "256", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run([KVTIER, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-5000:]
    assert (tmp_path / "scheduler.png").stat().st_size > 0
    rows = json.loads((tmp_path / "scheduler.json").read_text())["rows"]
    assert [(r["running"], r["mode"]) for r in rows] == [
        (4, "incremental"), (4, "whole-table"), (16, "incremental"), (16, "whole-table"),
    ]  # fmt: skip
    for row in rows:
        assert 0 < row["ms_min"] <= row["ms_median"] <= row["ms_p90"] <= row["ms_max"]
        assert row["ratio_to_bound"] is None or row["ratio_to_bound"] > 1
    assert "median" in done.stdout
    page = (tmp_path / "scheduler.md").read_text()
    assert "--running 4 16 --steps 8 --warmup 4 --context 256" in page and "| 16 |" in page


def test_bench_scheduler_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "scheduler", "--help"])
    assert done.value.code == 0
    assert "--running" in capsys.readouterr().out
