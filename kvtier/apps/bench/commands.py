"""The ``kvtier bench`` subcommands, in the order ``kvtier bench --help`` lists them.

Each benchmark's package holds its arguments and the ``run`` that imports and drives the
benchmark (``<family>/command.py``) only when chosen. A new benchmark adds a package and a line
below; ``kvtier.apps.cli`` never names one.
"""

from __future__ import annotations

from kvtier.apps.bench import pages
from kvtier.apps.bench.chaos import command as chaos
from kvtier.apps.bench.concurrency import command as concurrency
from kvtier.apps.bench.copy import command as copy
from kvtier.apps.bench.disk import command as disk
from kvtier.apps.bench.faults import command as faults
from kvtier.apps.bench.fleet import command as fleet
from kvtier.apps.bench.gpu import command as gpu
from kvtier.apps.bench.redis import command as redis
from kvtier.apps.bench.scheduler import command as scheduler
from kvtier.apps.bench.transfer import command as transfer
from kvtier.apps.bench.ttft import command as ttft
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
    chaos.COMMAND,
    gpu.COMMAND,
    pages.COMMAND,
)
