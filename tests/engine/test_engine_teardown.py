"""An in-process engine's start and teardown scan the heap only where vLLM asks: the harness
(like the benchmarks and the demo) adds no collection of its own, and nothing of the engine
outlives its teardown (no cycle holds it: it is freed when its last name goes, without a scan)."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import vllm
from harness import engine

VLLM = str(Path(vllm.__file__).parent)


@contextmanager
def _whole_heap_collections() -> Iterator[list[str]]:
    """For each whole-heap collection asked for inside (automatic ones held off): the file and
    function of the code that asked, and whether vLLM's engine shutdown (its client's
    ``shutdown``) is among its callers, as ``"file:function[:shutdown]"``."""
    asked: list[str] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            frame = sys._getframe(1)  # the code that called gc.collect
            asker = f"{frame.f_code.co_filename}:{frame.f_code.co_name}"
            while frame is not None:
                code = frame.f_code
                if code.co_filename.endswith("core_client.py") and code.co_name == "shutdown":
                    asker += ":shutdown"
                    break
                frame = frame.f_back
            asked.append(asker)

    gc.disable()
    gc.callbacks.append(record)
    try:
        yield asked
    finally:
        gc.callbacks.remove(record)
        gc.enable()


def test_an_engine_start_and_teardown_add_no_collection_to_vllms(tiny_model: Path) -> None:
    context = engine(tiny_model)
    with _whole_heap_collections() as at_start:
        llm = context.__enter__()
    assert all(asker.startswith(VLLM) for asker in at_start), at_start  # vLLM's own, if any
    core = weakref.ref(llm.llm_engine.engine_core)
    del llm
    with _whole_heap_collections() as at_exit:
        context.__exit__(None, None, None)
    assert at_exit and all(a.endswith(":shutdown") for a in at_exit), at_exit  # vLLM's shutdown's
    assert core() is None  # gone with its last name: no scan after vLLM's found it
