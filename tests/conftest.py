"""Test-suite wide rules: a marker per folder, GPU tests skipped without CUDA, long files first.

tests/unit    no engine, fast
tests/engine  real vLLM on the CPU (marker ``engine``)
tests/gpu     needs CUDA (marker ``gpu``; skipped when ``torch.cuda.is_available()`` is False)

``make test`` runs two pytest-xdist workers, each taking a whole file at a time (``--dist
loadfile``: a module's engines and servers are started once). Files are handed out in collection
order, so the longest (seconds on this 2-core machine, measured) come first: a long file left for
last would run alone while the other worker idles. xdist would sort them by their number of tests
instead (``--loadscope-reorder``, its default: a 1-test engine file of 90 s came after every unit
file); ``pytest_configure`` turns that off. The chaos run comes first, beside files that keep
their core busy: two of its four minutes are a light load, and beside ``test_pd.py`` (whose tests
wait out a hold three times) both cores were idle a third of the time.

Each process runs torch on one OpenMP thread (``OMP_NUM_THREADS=1``, unless already set), as
vLLM's own server does: an in-process engine on the CPU keeps torch's default of a thread per
core, so two workers' engines would oversubscribe the two cores, and OpenMP's spin-waits burn
the difference (two engine-test files side by side here: 88 s with the default, 68 s with one
thread each). It is set before anything imports torch: libgomp reads it when it is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported (docstring)

pytest_plugins = ["redis_fixtures"]

_TESTS = Path(__file__).resolve().parent
_FOLDER_MARKERS = {"engine": pytest.mark.engine, "gpu": pytest.mark.gpu}
_LONGEST_FIRST = [  # tests/engine files as handed out: longest first, the chaos run's neighbours
    # busy (docstring); the rest keep their order, after these
    "test_bench_chaos.py", "test_parallel.py", "test_redis.py", "test_fault_campaign.py",
    "test_pd.py", "test_fleet.py", "test_bench_ttft.py", "test_pd_hybrid.py",
    "test_fault_scenario.py", "test_bench_transfer.py", "test_disk.py", "test_redis_writes.py",
    "test_block_tables.py", "test_hybrid.py", "test_connector.py", "test_connector_pressure.py",
    "test_disk_limits.py", "test_bench_disk.py", "test_bench_faults.py",
    "test_bench_concurrency.py", "test_hit_cost.py", "test_outside_tier.py", "test_kv_events.py",
    "test_disk_healing.py", "test_serve.py", "test_no_regret.py", "test_observability.py",
    "test_demo.py", "test_bench_redis_ttft.py", "test_readme_commands.py", "test_copy_lanes.py",
    "test_engine_smoke.py",
]  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the collection order
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file
    for item in items:
        path = item.path.resolve()
        if path.is_relative_to(_TESTS) and path.relative_to(_TESTS).parts[0] in _FOLDER_MARKERS:
            item.add_marker(_FOLDER_MARKERS[path.relative_to(_TESTS).parts[0]])
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())
