"""Test-suite wide rules: a marker per folder, and GPU tests skipped without CUDA.

tests/unit    no engine, fast
tests/engine  real vLLM on the CPU (marker ``engine``)
tests/gpu     needs CUDA (marker ``gpu``; skipped when ``torch.cuda.is_available()`` is False)
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["redis_fixtures"]

_TESTS = Path(__file__).resolve().parent
_FOLDER_MARKERS = {"engine": pytest.mark.engine, "gpu": pytest.mark.gpu}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
