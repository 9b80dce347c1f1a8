"""The garbage collector's heap around vLLM: its import, and an in-process engine's life.

    frozen_imports()     a ``with`` block for a large import: no automatic collection inside,
                         then one collection and what survived frozen (``freeze_survivors``)
    freeze_heap()        freeze what the collector tracks now (``gc.freeze``): no scan
    freeze_survivors()   collect, then freeze what survived

Importing vLLM's server makes hundreds of thousands of tracked objects; on the way, the
collector's automatic passes scan the growing heap whole several times, and later passes scan it
again. Imported inside ``frozen_imports()``, the heap is scanned once, and what the import made
(modules, classes, functions: alive for the process's life) is frozen, as vLLM freezes its
server's heap once the server started.

vLLM collects the whole heap several times while an engine starts and freezes it once started;
its in-process shutdown (``engine_core.shutdown()``) unfreezes it and collects it twice (once in
the model runner's teardown, once in ``cleanup_dist_env_and_memory``). Frozen objects are skipped
by every collection, so an engine started on a frozen heap starts sooner, and a process that
starts engines one after another (a benchmark, the demo, the tests) gains that each time.

Before an engine starts, ``freeze_heap()``: a whole-heap scan there would find only what was
dropped since the last engine's shutdown scanned it (no cycle holds a shut-down engine); that
garbage is frozen with the rest and collected at the next engine's shutdown, which unfreezes the
heap. After an engine was shut down and dropped, where its memory must come back at once (a
benchmark that checks nothing of it is left), ``freeze_survivors()``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_heap() -> None:
    """Freeze every object the collector tracks, garbage included, without scanning the heap."""
    gc.freeze()


def freeze_survivors() -> None:
    """Collect what is not frozen, then freeze what is left of it."""
    gc.collect()
    gc.freeze()


@contextmanager
def frozen_imports() -> Iterator[None]:
    """Inside, no automatic collection; at the end (unless the body raised), one collection and
    what survived frozen, before automatic collections resume (the first would else scan all
    the import made, as young objects). The collector is left as it was, also on an error."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        freeze_survivors()
    finally:
        if was_enabled:
            gc.enable()
