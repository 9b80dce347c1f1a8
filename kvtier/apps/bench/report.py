"""Shared by the benchmarks: timing a call, medians, and the JSON of the results."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvtier.apps.bench.machine import cpu


def write_json(path: Path, name: str, rows: list[dict[str, Any]], **meta: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": torch.get_num_threads(),
            "platform": platform.platform(),
            "cpu": cpu(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        **meta,
        "rows": rows,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def time_call(fn: Callable[[], None]) -> float:
    """Seconds ``fn`` takes, device work included."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - started
