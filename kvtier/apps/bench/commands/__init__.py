"""The ``kvtier bench`` subcommands, in the order ``kvtier bench --help`` lists them.

Each module here holds one benchmark's arguments and the ``run`` that imports and drives the
benchmark itself (``kvtier.apps.bench.<name>``) only when chosen. A new benchmark adds a module
and a line below; ``kvtier.apps.cli`` never names one.
"""

from __future__ import annotations

from kvtier.apps.bench.commands import (
    concurrency,
    copy,
    disk,
    faults,
    fleet,
    gpu,
    redis,
    scheduler,
    transfer,
    ttft,
)
from kvtier.apps.command import Command

BENCHES: tuple[Command, ...] = (
    copy.COMMAND,
    ttft.COMMAND,
    disk.COMMAND,
    transfer.COMMAND,
    redis.COMMAND,
    faults.COMMAND,
    scheduler.COMMAND,
    concurrency.COMMAND,
    fleet.COMMAND,
    gpu.COMMAND,
)
