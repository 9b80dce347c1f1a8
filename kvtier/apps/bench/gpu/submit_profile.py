"""Where a job's submission spends the engine thread's time: the functions of a few jobs.

    top(fn, jobs, count) -> [{"function", "ms_per_job", "calls_per_job"}]
                            ``fn`` (one job, submitted and finished) run ``jobs`` times under
                            cProfile; the ``count`` functions with the most time of their own

A host hit costs its submission plus its copies; ``kvtier bench gpu`` times both together and
the submission alone (``submit_ms``). This says what the submission is made of, so that a GPU
run shows what to make cheaper without a second run.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any


def top(fn: Callable[[], object], jobs: int = 3, count: int = 12) -> list[dict[str, Any]]:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(jobs):
        fn()
    profile.disable()
    table = pstats.Stats(profile)
    stats: dict[tuple[str, int, str], tuple[Any, ...]] = table.stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:count]
    return [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "ms_per_job": round(own * 1e3 / jobs, 4),
            "calls_per_job": round(calls / jobs, 1),
        }
        for (file, line, name), (_, calls, own, _, _) in rows
    ]
