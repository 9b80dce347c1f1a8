"""An in-process engine's teardown scans the heap only inside vLLM's own shutdown: the harness
(like the benchmarks and the demo) adds no collection of its own; what is left of the engine is
gone once the next engine's start (``freeze_survivors``) collected the heap."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness import engine

from kvtier.apps.engine_heap import freeze_survivors


@contextmanager
def _whole_heap_collections() -> Iterator[list[bool]]:
    """For each whole-heap collection asked for inside (automatic ones held off): whether vLLM's
    engine shutdown (its client's ``shutdown``) asked for it."""
    asked: list[bool] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            frame = sys._getframe(1)
            callers = []
            while frame is not None:
                callers.append((frame.f_code.co_filename, frame.f_code.co_name))
                frame = frame.f_back
            asked.append(any(f.endswith("core_client.py") and n == "shutdown" for f, n in callers))

    gc.disable()
    gc.callbacks.append(record)
    try:
        yield asked
    finally:
        gc.callbacks.remove(record)
        gc.enable()


def test_an_engine_teardown_adds_no_collection_to_vllms(tiny_model: Path) -> None:
    context = engine(tiny_model)
    llm = context.__enter__()
    core = weakref.ref(llm.llm_engine.engine_core)
    del llm
    with _whole_heap_collections() as at_exit:
        context.__exit__(None, None, None)
    assert at_exit and all(at_exit), at_exit  # vLLM's shutdown collects; nothing else does
    with _whole_heap_collections() as at_start:
        freeze_survivors()
    assert at_start == [False] and core() is None
