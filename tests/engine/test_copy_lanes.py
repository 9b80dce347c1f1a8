"""Multi-lane CPU copies in real vLLM: two engines, one after another in one process, each storing
and loading through the copy lanes, finish in bounded time with the reference outputs.

This is the scenario in which the earlier two-lane copy pool stalled (see ``copy_cpu.py``). Pieces
are forced down to 16 KiB so the tiny model's jobs are split; the first multi-piece job of each
handler has two pieces that can only finish together, so a helper lane must take part.
"""

from __future__ import annotations

import faulthandler
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from harness import engine, full_chunks, generate, kvtier_transfer, prompts, settle

import kvtier
from kvtier.tiers.host.io import copy_cpu, handlers
from kvtier.tiers.host.io.copy_lanes import CopyLanes

WATCHDOG_S = 600  # a hang dumps every thread's stack and ends the run instead of blocking it
SETTLE_S = 120.0
GATE_S = 60.0
CHUNK = 64


def test_two_engines_in_one_process_store_and_load_through_the_lanes(
    tiny_model: Path, reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_prompts = prompts(tiny_model, [500, 300, 420, 260, 130], seed=51)
    expected = reference(tiny_model, token_prompts)
    monkeypatch.setattr(copy_cpu, "MIN_PIECE_BYTES", 16 << 10)
    monkeypatch.setattr(handlers, "copy_lanes", lambda: 2)
    together = _gate_first_split_job(monkeypatch)
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    try:
        for _ in range(2):
            with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=CHUNK)) as llm:
                assert generate(llm, token_prompts) == expected
                settle(llm, timeout_s=SETTLE_S)
                assert kvtier.stats(llm).cpu.failed_stores == 0
                first_hits = kvtier.stats(llm).cpu.hit_chunks
                llm.reset_prefix_cache()  # the second pass comes from kvtier
                assert generate(llm, token_prompts) == expected
                settle(llm, timeout_s=SETTLE_S)
                stats = kvtier.stats(llm).cpu
                assert stats.hit_chunks - first_hits >= full_chunks(token_prompts, CHUNK)
                assert stats.failed_loads == 0
            assert _lane_threads() == []  # the engine's shutdown stopped its lanes
    finally:
        faulthandler.cancel_dump_traceback_later()
    # per engine, the store and the load lanes each ran a job on two threads at once
    assert sorted(together) == ["kvtier-load", "kvtier-load", "kvtier-store", "kvtier-store"]


def _gate_first_split_job(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the first job of >= 2 pieces on each ``CopyLanes`` wait until its first two pieces
    run at once (bounded by ``GATE_S``); returns the lanes' names as each gate opens."""
    opened: list[str] = []
    gated: weakref.WeakSet[CopyLanes] = weakref.WeakSet()
    run = CopyLanes.run

    def gated_run(self: CopyLanes, pieces: Sequence[Callable[[], None]]) -> None:
        if len(pieces) >= 2 and self not in gated:
            gated.add(self)
            both = threading.Barrier(2, timeout=GATE_S, action=lambda: opened.append(_name(self)))
            pieces = [_after(both, pieces[0]), _after(both, pieces[1]), *pieces[2:]]
        run(self, pieces)

    monkeypatch.setattr(CopyLanes, "run", gated_run)
    return opened


def _after(barrier: threading.Barrier, piece: Callable[[], None]) -> Callable[[], None]:
    def gated() -> None:
        barrier.wait()
        piece()

    return gated


def _name(lanes: CopyLanes) -> str:
    return lanes._threads[0].name.removesuffix("-lane1")


def _lane_threads() -> list[str]:
    return [
        t.name for t in threading.enumerate() if t.name.startswith("kvtier-") and "-lane" in t.name
    ]
