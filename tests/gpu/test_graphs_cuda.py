"""The host tier's pinning beside the engine's CUDA graphs (needs CUDA). vLLM captures its graphs
after ``register_kv_caches``, in CUDA's ``global`` capture mode, under which another thread's
``cudaHostRegister`` is refused and may end the capture (vllm-project/vllm#46933): the worker
begins pinning at its first step, and the pinning thread is exempt from other threads' captures
(``kvtier/tiers/host/pin_driver.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvtier.step_plan import StepPlan
from kvtier.worker.connector import WorkerConnector

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent


def test_the_worker_begins_pinning_at_its_first_step() -> None:
    """Not at ``register_kv_caches``, after which vLLM captures its graphs."""
    worker = WorkerConnector(256 << 20, block_size_factor=4, world_size=1)
    kv = torch.zeros(2, 64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    worker.register({"a": kv}, [["a"]], 64)
    host = worker.host
    assert host is not None and host.pinning is not None
    try:
        assert not host.pinning.begun and host.pinning.pinned_bytes == 0
        worker.begin_step(StepPlan(num_chunks=host.num_chunks))
        assert host.pinning.begun and host.pinning.wait(60) and host.pinned
    finally:
        worker.shutdown()


def test_graphs_captured_while_the_tier_is_pinned_are_whole_and_so_is_the_tier() -> None:
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(HERE.parents[1])]))
    done = subprocess.run([sys.executable, str(HERE / "capture_beside_pinning.py")],
                          env=os.environ | {"PYTHONPATH": path}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["error"] is None, result
    assert result["captures"] >= 10, f"pinned within {result['captures']} captures: {result}"
    assert result["wrong"] == 0 and result["finished"] and result["pinned"], result
