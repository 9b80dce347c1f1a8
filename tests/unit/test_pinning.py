"""Pinning a GPU's host tier as the engine serves (``kvtier/tiers/host/pinning.py``), on the CPU:
the driver's calls are a recording ``Driver`` (there is no CUDA here), the faulting is the real
kernel's ``madvise``, and what is in memory is read back with ``mincore``."""

from __future__ import annotations

import ctypes
import errno
import logging
import sys
import time
from collections.abc import Callable

import pytest
import torch
from resident import PAGE, fresh, resident_bytes

from kvtier.tiers.host.commit import BACKGROUND_STEP, MADV_POPULATE_WRITE, Populator
from kvtier.tiers.host.pinning import BATCH_PIECES, YIELD_S, Pinning

PIECE = 64 * PAGE
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's madvise")


class Recorder:
    """Records each registration with the bytes of its piece in memory at that moment."""

    def __init__(self, refuse: int | None = None, stop_at: int | None = None) -> None:
        self.refuse = refuse  # the piece it refuses (None: none)
        self.stop_at = stop_at  # the piece during whose registration pinning is stopped
        self.pinning: Pinning | None = None  # the one to stop (``stop_at``)
        self.registered: list[tuple[int, int, int]] = []  # (address, size, resident bytes)
        self.unregistered: list[int] = []
        self.calls: list[tuple[float, float]] = []  # each registration's start and end

    def register(self, address: int, size: int) -> int:
        started = time.perf_counter()
        if len(self.registered) == self.refuse:
            return 1  # as cudaErrorInvalidValue
        self.registered.append((address, size, resident_bytes(address, size)))
        if len(self.registered) - 1 == self.stop_at:
            assert self.pinning is not None
            self.pinning.stop()  # as the tier closing while the driver registers
        self.calls.append((started, time.perf_counter()))
        return 0

    def unregister(self, address: int) -> None:
        self.unregistered.append(address)


def _pinned(memory: torch.Tensor, driver: Recorder, **kwargs: object) -> Pinning:
    pinning = Pinning(memory, torch.device("cpu"), PIECE, driver, **kwargs)  # type: ignore[arg-type]
    assert pinning.wait(60)
    return pinning


def test_each_piece_is_in_memory_before_the_driver_registers_it() -> None:
    """The driver's lock, which the engine's CUDA calls wait for, is held for pinning only: the
    pages were faulted in before, by threads, and no byte of them was written."""
    memory = fresh(3 * BATCH_PIECES * PIECE + 5 * PAGE)  # three batches and a short last piece
    memory[: 2 * PAGE] = 7  # a store that got there first
    driver = Recorder()
    pinning = _pinned(memory, driver)
    base, total = memory.data_ptr(), memory.numel()
    pieces = [(base + at, min(PIECE, total - at)) for at in range(0, total, PIECE)]
    assert [(a, s) for a, s, _ in driver.registered] == pieces
    assert all(resident == size for _, size, resident in driver.registered)
    assert pinning.pinned_bytes == total and pinning.rate() is not None
    assert bool((memory[: 2 * PAGE] == 7).all()) and not bool(memory[2 * PAGE :].any())
    pinning.close()
    assert driver.unregistered == [a for a, _ in reversed(pieces)]


def test_a_piece_the_driver_refuses_leaves_the_rest_pageable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = fresh(4 * PIECE)
    driver = Recorder(refuse=2)
    with caplog.at_level(logging.WARNING):
        pinning = _pinned(memory, driver)
    assert pinning.pinned_bytes == 2 * PIECE
    assert "refused the host tier" in caplog.text
    pinning.close()
    assert driver.unregistered == [memory.data_ptr() + PIECE, memory.data_ptr()]


def _without_memory() -> Callable[[int, int, int], int]:
    def madvise(address: int, size: int, advice: int) -> int:
        ctypes.set_errno(errno.ENOMEM)
        return -1

    return madvise


def test_memory_that_is_not_there_is_never_registered(caplog: pytest.LogCaptureFixture) -> None:
    memory = fresh(4 * PIECE)
    driver = Recorder()
    with caplog.at_level(logging.WARNING):
        pinning = _pinned(memory, driver, madvise=_without_memory())
    assert driver.registered == [] and pinning.pinned_bytes == 0
    assert "cpu_bytes_to_use" in caplog.text
    pinning.close()
    assert driver.unregistered == []


@pytest.mark.parametrize("stop_at", [2, BATCH_PIECES - 1], ids=["mid-batch", "batch-end"])
def test_a_stop_registers_no_further_piece_and_faults_no_further_batch(stop_at: int) -> None:
    memory = fresh(2 * BATCH_PIECES * PIECE)
    driver = Recorder(stop_at=stop_at)
    pinning = Pinning(memory, torch.device("cpu"), PIECE, driver, start=False)  # type: ignore[arg-type]
    driver.pinning = pinning
    pinning.start()
    assert pinning.wait(60)
    base = memory.data_ptr()
    assert [a for a, _, _ in driver.registered] == [base + k * PIECE for k in range(stop_at + 1)]
    assert pinning.pinned_bytes == (stop_at + 1) * PIECE
    second = BATCH_PIECES * PIECE
    assert resident_bytes(base + second, second) == 0  # the next batch was never faulted in
    pinning.close()
    assert driver.unregistered == [a for a, _, _ in reversed(driver.registered)]


def test_a_pinning_not_started_registers_nothing_until_it_is() -> None:
    """Built at ``register_kv_caches``, begun at the engine's first step (vLLM captures its CUDA
    graphs between the two): nothing is faulted in or registered before ``start``, and a
    second ``start`` begins nothing more."""
    memory = fresh(2 * PIECE)
    driver = Recorder()
    pinning = Pinning(memory, torch.device("cpu"), PIECE, driver, start=False)  # type: ignore[arg-type]
    assert not pinning.begun and not pinning.wait(0)
    assert driver.registered == [] and resident_bytes(memory.data_ptr(), 2 * PIECE) == 0
    pinning.start()
    pinning.start()
    assert pinning.begun and pinning.wait(60)
    assert [a for a, _, _ in driver.registered] == [memory.data_ptr(), memory.data_ptr() + PIECE]
    pinning.close()
    assert len(driver.unregistered) == 2


def test_a_pinning_closed_before_it_started_never_starts() -> None:
    memory = fresh(2 * PIECE)
    driver = Recorder()
    pinning = Pinning(memory, torch.device("cpu"), PIECE, driver, start=False)  # type: ignore[arg-type]
    pinning.close()  # returns: no thread to wait for
    pinning.start()
    assert not pinning.begun and driver.registered == []
    assert resident_bytes(memory.data_ptr(), 2 * PIECE) == 0


def test_the_driver_is_free_for_a_while_between_two_registrations() -> None:
    """The driver's lock is not fair: taken again at once, the engine's CUDA calls waited out
    eight registrations in a row on an H200. A pause after each lets a waiting call in."""
    memory = fresh(BATCH_PIECES * PIECE)
    driver = Recorder()
    _pinned(memory, driver).close()
    gaps = [after[0] - before[1] for before, after in zip(driver.calls, driver.calls[1:])]
    assert len(gaps) == BATCH_PIECES - 1 and min(gaps) >= YIELD_S


def test_in_the_background_each_call_faults_a_short_step_in() -> None:
    """Pinning's populator (the engine already serves) faults each piece in ``BACKGROUND_STEP``
    at a time: a call holds the process's memory map for as long as it faults, and an engine
    thread that allocates waits behind it. At start-up a piece is one call."""
    calls: list[tuple[int, int]] = []

    def madvise(address: int, size: int, advice: int) -> int:
        assert advice == MADV_POPULATE_WRITE
        calls.append((address, size))
        return 0

    base, size, piece = 1 << 30, 5 * BACKGROUND_STEP + PAGE, 2 * BACKGROUND_STEP
    for background, most in ((True, BACKGROUND_STEP), (False, piece)):
        calls.clear()
        populator = Populator(madvise, background=background)
        assert populator.populate(base, size, piece) == [0, 0, 0]
        populator.close()
        assert max(s for _, s in calls) == most and sum(s for _, s in calls) == size
        covered = sorted(calls)
        assert all(a + s == b for (a, s), (b, _) in zip(covered, covered[1:]))
