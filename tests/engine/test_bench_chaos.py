"""``kvtier bench chaos --quick`` as a user runs it from a fresh shell (only PATH and HOME): two
engines behind the fleet proxy, a prefill→decode pair, Redis, every fault kind once (seeded)
under a steady load; no client error but answers already streaming when their engine was
killed, every answer identical to one engine's without kvtier, every request ended within its
timeout, and its JSON, PNG and Markdown page written (issue 39)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kvtier.apps.bench.common.servers import KVTIER


def test_a_short_chaos_run_costs_no_client_error_and_no_different_answer(tmp_path: Path) -> None:
    env = {name: os.environ[name] for name in ("PATH", "HOME")}
    done = subprocess.run([KVTIER, "bench", "chaos", "--quick", "--seed", "0", "--out",
                           str(tmp_path), "--logs", str(tmp_path / "logs")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr[-5000:]
    document = json.loads((tmp_path / "chaos.json").read_text())
    counts, answers = document["counts"], document["answers"]
    assert counts["client_errors"] == 0, (counts["failures"], done.stdout[-3000:])
    assert counts["failed_streaming_at_kill"] <= counts["in_flight_at_kills"]
    assert answers["compared"] == counts["answered"] > 0
    assert answers["different"] == 0, answers
    assert counts["past_timeout"] == 0
    assert all(r["end_s"] - r["start_s"] <= document["settings"]["timeout_s"] + 1.0
               for r in document["rows"])  # fmt: skip
    assert len(document["faults"]) >= 3 and all(f["done"] for f in document["faults"])
    assert done.returncode == 0, done.stdout[-3000:]
    assert "kvtier bench chaos: 1.0 of 2 min: " in done.stdout  # progress while it runs
    assert (tmp_path / "chaos.png").stat().st_size > 0
    page = (tmp_path / "chaos.md").read_text()
    assert "`kvtier bench chaos --engines 2 --minutes 2 --seed 0 --rate 2 --quick`" in page
