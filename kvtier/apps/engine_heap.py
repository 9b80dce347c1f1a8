"""The garbage collector's heap before an in-process vLLM engine starts.

    freeze_survivors()   collect, then freeze what survived (``gc.freeze``)

vLLM collects the whole heap several times while an engine starts and freezes it once started;
its in-process shutdown (``engine_core.shutdown()``) unfreezes it, collects it and tears down
its process-wide state (``cleanup_dist_env_and_memory``, which collects it again: calling that
once more after the shutdown only scans the heap a third time). Frozen objects are skipped by
every collection, so an engine started after ``freeze_survivors()`` starts sooner, and a process
that starts engines one after another (a benchmark, the demo, the tests) gains that each time.
Call it before an engine starts, and after one was shut down and dropped where its memory must
come back at once: what is already frozen stays so (the call is then cheap), garbage outside it
is collected first. An engine a caller still holds when it is called is frozen with the rest,
and collected after the next unfreeze (the next engine's shutdown): at most one old engine's
memory outlives its use.
"""

from __future__ import annotations

import gc


def freeze_survivors() -> None:
    """Collect what is not frozen, then freeze what is left of it."""
    gc.collect()
    gc.freeze()
