"""``make test-gpu``'s imports, checked here: only what its GPU machine has (``gpu_machine.py``).

That machine has CUDA, torch, Triton, transformers, numpy and safetensors, and the wheels
``scripts/gpu-prepare`` brings; no vLLM, no registry. A module the GPU run imports that it lacks
would end the one run a GPU session gets; here, where the venv holds every package, only an
import made as that machine answers shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("KVTIER_TRITON_SITE") or Path(sys.prefix) / "triton-interpreter")


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    triton = [str(SITE)] if (SITE / "triton").is_dir() else []  # the GPU machine has it
    env = {name: os.environ[name] for name in ("PATH", "HOME")}
    env["PYTHONPATH"] = os.pathsep.join([*triton, str(TESTS.parent), str(TESTS)])
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=TESTS.parent, timeout=300)  # fmt: skip


def test_the_gpu_runs_modules_and_tests_import_with_what_the_gpu_machine_has() -> None:
    done = _run([str(TESTS / "gpu_machine.py")])
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["failed"] == {}, found["failed"]
    assert found["collected"] == 0, done.stdout[-4000:]  # tests/gpu and its conftest collected


def test_the_list_covers_the_core_what_make_runs_and_what_tests_gpu_names() -> None:
    from gpu_machine import gpu_run_modules

    modules = gpu_run_modules()
    assert {"kvtier.keys", "kvtier.pages.mover", "kvtier.tiers.host.io.copy_cuda"} <= set(modules)
    assert {"kvtier.apps.cli", "kvtier.apps.bench.gpu.markdown"} <= set(modules)  # python -m
    assert "kvtier.apps.bench.common.redis_server" in modules  # named by bench gpu
    assert not any(m.startswith("kvtier.vllm") for m in modules)


@pytest.mark.parametrize(
    ("code", "lacked"),
    [
        ("import vllm", "vllm"),
        ("import psutil", "psutil"),  # in the venv, on no list of the GPU machine's
        ("from kvtier.vllm import connector", "vllm"),  # kvtier's vLLM half needs vLLM
    ],
)
def test_a_module_the_gpu_machine_lacks_is_absent_there(code: str, lacked: str) -> None:
    check = (
        "import importlib.util, sys, gpu_machine\n"
        "gpu_machine.restrict()\n"
        "import torch, numpy, msgspec, xxhash, redis  # its own and the brought\n"
        f"assert importlib.util.find_spec({lacked!r}) is None  # as optional packages ask\n"
        f"try:\n    {code}\nexcept ModuleNotFoundError as e:\n"
        "    print(e)\nelse:\n    sys.exit('imported')\n"
    )
    done = _run(["-c", check])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not on the GPU machine" in done.stdout
