"""The pinning thread's CUDA driver calls (``kvtier/tiers/host/pin_driver.py``) where there is no
CUDA driver: asking for the thread-local capture mode says it could not, and raises nothing (the
GPU tests capture a graph while a tier is pinned)."""

from __future__ import annotations

import ctypes.util

import pytest

from kvtier.tiers.host.pin_driver import capture_checks_own_thread


def test_no_driver_library_is_a_no() -> None:
    assert capture_checks_own_thread("libkvtier-no-such-driver.so.1") is False


def test_a_library_without_the_call_is_a_no() -> None:
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library found by name")
    assert capture_checks_own_thread(libc) is False
