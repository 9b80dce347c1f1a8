"""SIGTERM ends a command as Ctrl-C does, so that what it started is stopped.

    exit_on_sigterm()   from now on, SIGTERM raises ``SystemExit(143)`` in the main thread

A benchmark starts servers (vLLM engines, Redis, proxies) in sessions of their own: a signal
sent to the command (``timeout``, a CI job cancelled, ``kill``) does not reach them.
Python's default SIGTERM ends the process without running its ``finally`` blocks, leaving them
running; with this, the blocks that stop them run, within their own bounded waits. A second
SIGTERM while they run is ignored (SIGKILL still ends the command at once).
"""

from __future__ import annotations

import signal
from types import FrameType

EXIT_STATUS = 128 + signal.SIGTERM


def exit_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _exit)


def _exit(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up is not interrupted
    raise SystemExit(EXIT_STATUS)
