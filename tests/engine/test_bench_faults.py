"""``kvtier bench faults`` as the README runs it, from a user's fresh shell (only PATH and HOME):
it sets the in-process engine's environment itself, runs its engines and Redis, compares their
outputs with the engine without kvtier, and writes its JSON, PNG and Markdown page."""

from __future__ import annotations

import json
from pathlib import Path

from fresh_shell import run_kvtier


def test_bench_faults_runs_from_a_fresh_shell(tmp_path: Path) -> None:
    done = run_kvtier("bench", "faults", "--minutes", "0.3", "--quick", "--out", str(tmp_path),
                   timeout=600)  # fmt: skip

    assert "0 wrong (goal: 0)" in done.stdout
    document = json.loads((tmp_path / "faults.json").read_text())
    assert document["minutes"] == 0.3 and document["examples"] == 1 and document["steps"] == 3
    assert sum(row["engines"] for row in document["rows"]) >= 1
    assert sum(row["outputs_compared"] for row in document["rows"]) > 0
    assert all(row["wrong_outputs"] == 0 for row in document["rows"])
    assert (tmp_path / "faults.png").stat().st_size > 0
    page = (tmp_path / "faults.md").read_text()
    assert "`kvtier bench faults --minutes 0.3 --seed 0 --quick`" in page
