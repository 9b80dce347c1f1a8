"""What each CUDA, torch and Triton call of a host job's submit costs the engine's thread here.

    measure(device) -> {call: microseconds}   each call made ``CALLS`` times back to back on an
                                              idle stream (CUDA only: {} elsewhere)

A host job's submit (``submit_ms``) is kvtier's planning (``plan_ms``) and a dozen calls into
CUDA through torch and Triton, and the device waits for the launch at its end. On the H200's
host the calls took most of the submit, each tens of microseconds; ``submit_profile`` names the
functions, this times each call alone, so that a run shows which are worth avoiding:

    event_record      an event, made once, recorded on a stream given
    event_made        an event made and recorded (what a job paid per event before they were reused)
    current_stream    ``torch.cuda.current_stream()``: the general device lookup (torch's stream
                      context makes two, and an event recorded with no stream given one)
    stream_by_index   ``torch.cuda.current_stream(index)``, as kvtier asks for it
    stream_context    ``with torch.cuda.stream(side)``, entered and left
    on_stream         the same as kvtier enters it (``pages/streams.py``: the current stream
                      asked for by index, ``side`` set, then the former set again)
    wait_event        a stream made to wait for an event
    pin_and_upload    a 1,024-entry table to the device the plain way (``pin_memory().to()``)
    uploads_put       the same through ``pages/uploads.py``, and its event
    grid_launch       the grid kernel launched for one 32 KiB page (Triton's launch)
    mover_store       a one-page store through ``PageMover``, tables to launch
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from kvtier.pages import PageMover, grid, kernel
from kvtier.pages.grid import record_grid
from kvtier.pages.streams import on_stream
from kvtier.pages.uploads import Uploads

CALLS = 200  # per call timed
TABLE = 1024  # int64 entries of a table uploaded (an 8B-class job's: 1,024)
PAGE = 32 << 10  # bytes of the page a launch moves (an 8B-class model's)


def measure(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    table = np.arange(TABLE, dtype=np.int64)
    uploads = Uploads(device)
    view = torch.zeros(4, PAGE // 8, dtype=torch.int64, device=device)  # four blocks of a page
    host = torch.zeros(PAGE, dtype=torch.uint8, pin_memory=True)
    mover = PageMover([view])  # its launch: ``kernel.LARGE``, compiled at the engine's start
    one = [record_grid([0], [0], np.array([1]), np.array([0]), 1, PAGE)]
    found = grid.tables(one, grid.view_table([view]), host.data_ptr(), mover.launch.word)
    assert found is not None
    flat, span = torch.from_numpy(found.flat).to(device), found.grids[0]

    stream, index = torch.cuda.current_stream(device), side.device_index

    def stream_context() -> None:
        with torch.cuda.stream(side):
            pass

    def switched() -> None:
        with on_stream(side):
            pass

    def pin_and_upload() -> None:
        torch.from_numpy(table).pin_memory().to(device, non_blocking=True)

    def uploads_put() -> None:
        uploads.put(table)
        uploads.queued()

    calls: dict[str, Callable[[], object]] = {
        "event_record": lambda: event.record(stream),
        "event_made": lambda: torch.cuda.Event().record(stream),  # type: ignore[no-untyped-call]
        "current_stream": torch.cuda.current_stream,
        "stream_by_index": lambda: torch.cuda.current_stream(index),
        "stream_context": stream_context,
        "on_stream": switched,
        "wait_event": lambda: side.wait_event(event),
        "pin_and_upload": pin_and_upload,
        "uploads_put": uploads_put,
        "grid_launch": lambda: kernel.grid_copy(flat, span, host.data_ptr(), True, mover.launch),
        "mover_store": lambda: mover.store(one, host),
    }
    return {name: _microseconds(call, device) for name, call in calls.items()}


def _microseconds(call: Callable[[], object], device: torch.device) -> float:
    """Per call, the least of three runs of ``CALLS`` (the first run of all a warm-up)."""
    runs = []
    for _ in range(4):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(CALLS):
            call()
        runs.append(time.perf_counter() - started)
    torch.cuda.synchronize(device)
    return round(min(runs[1:]) / CALLS * 1e6, 2)
