"""Counting the calls a piece of kvtier makes, on any thread: exact where timing is noise.

Calls(*codes)       a profile hook counting the calls made inside any of ``codes``
profiled(calls)     ``calls`` hooked on this thread and on threads started meanwhile
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any


class Calls:
    """A profile hook counting the calls made inside any of ``codes``, on any thread."""

    def __init__(self, *codes: CodeType) -> None:
        self.codes = set(codes)
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "c_call"):
            return
        caller: FrameType | None = frame
        while caller is not None:
            if caller.f_code in self.codes:
                with self._lock:
                    self.count += 1
                return
            caller = caller.f_back


@contextmanager
def profiled(calls: Calls) -> Iterator[None]:
    """``calls`` hooked on this thread and on threads started meanwhile. The garbage collector
    is run before and held off meanwhile: a collection inside the hooked code would run earlier
    tests' finalizers there, counted as its calls."""
    before, before_threads = sys.getprofile(), threading.getprofile()
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    sys.setprofile(calls)
    threading.setprofile(calls)
    try:
        yield
    finally:
        sys.setprofile(before)
        threading.setprofile(before_threads)
        if collecting:
            gc.enable()
