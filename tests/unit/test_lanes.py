"""Copy lanes: every piece runs once, on several threads at once, and a job never waits for a
piece nobody started (no stall, even with the helpers gone)."""

from __future__ import annotations

import threading
from collections import Counter
from functools import partial

import pytest
import torch

from kvtier.tiers.host.io.copy_lanes import CopyLanes

CPU = torch.device("cpu")
BOUND_S = 10.0  # a barrier that is not met within this fails the test instead of hanging it


def test_every_piece_runs_exactly_once() -> None:
    lanes = CopyLanes("t", helpers=2, device=CPU)
    ran: Counter[int] = Counter()
    lock = threading.Lock()

    def piece(i: int) -> None:
        with lock:
            ran[i] += 1

    for _ in range(20):  # many jobs on the same lanes
        ran.clear()
        lanes.run([partial(piece, i) for i in range(50)])
        assert ran == Counter(range(50))
    lanes.shutdown()


def test_a_helper_runs_pieces_beside_the_caller() -> None:
    """Two pieces that each wait for the other can only finish on two threads at once."""
    lanes = CopyLanes("t", helpers=1, device=CPU)
    both = threading.Barrier(2, timeout=BOUND_S)
    names: list[str] = []

    def piece() -> None:
        names.append(threading.current_thread().name)
        both.wait()

    lanes.run([piece, piece])
    assert sorted(names) == sorted([threading.current_thread().name, "t-lane1"])
    lanes.shutdown()


def test_an_error_is_raised_once_every_lane_stopped() -> None:
    lanes = CopyLanes("t", helpers=1, device=CPU)
    both = threading.Barrier(2, timeout=BOUND_S)
    finished: list[str] = []

    def slow() -> None:
        both.wait()
        finished.append("slow")

    def broken() -> None:
        both.wait()
        raise OSError("injected")

    with pytest.raises(OSError, match="injected"):
        lanes.run([slow, broken])
    assert finished == ["slow"]  # run() returned only after the other lane's piece finished
    lanes.run([lambda: finished.append("next")])  # the lanes keep working
    assert finished == ["slow", "next"]
    lanes.shutdown()


def test_after_shutdown_the_caller_runs_every_piece() -> None:
    """A job never waits for a helper that is gone: it copies alone."""
    lanes = CopyLanes("t", helpers=2, device=CPU)
    lanes.shutdown()
    assert lanes.lanes == 1
    names: list[str] = []
    lanes.run([lambda: names.append(threading.current_thread().name) for _ in range(8)])
    assert names == [threading.current_thread().name] * 8


def test_no_helper_threads_outlive_shutdown() -> None:
    lanes = CopyLanes("kvtier-shutdown-probe", helpers=3, device=CPU)
    lanes.run([lambda: None] * 4)
    lanes.shutdown()
    alive = [t.name for t in threading.enumerate() if t.name.startswith("kvtier-shutdown-probe")]
    assert alive == []
