"""Every process's memory through a chaos run: the RSS of each server's process group, sampled.

    group_rss(proc)          -> {pgid: bytes}   the RSS of every process group now (Linux /proc)
    Sample(t_s, name, pid, rss_bytes)           one server's group at one time
    Sampler(groups, clock, every_s)             a thread: ``groups()`` (name -> leader pid)
                                                sampled every ``every_s`` until ``.stop()``
    growth(samples, warmup_s) -> {name: ratio | None}   each server's growth after its warm-up

A server is its process group (each is started in a session of its own): an engine's API server,
engine core and workers together. A server started again is a new group, measured apart: its
growth counts from its own start plus ``warmup_s``, and a server's is its largest group's.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
ENDS = 3  # samples averaged at each end of a growth


class Sample(NamedTuple):
    t_s: float
    name: str  # "engine-0", "proxy", "redis", ...
    pid: int  # its group's leader: a new one when started again
    rss_bytes: int


def group_rss(proc: Path = Path("/proc")) -> dict[int, int]:
    found: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        group, pages = int(fields[2]), int(fields[21])
        found[group] = found.get(group, 0) + pages * PAGE_BYTES
    return found


class Sampler(threading.Thread):
    def __init__(
        self, groups: Callable[[], dict[str, int]], clock: Callable[[], float], every_s: float
    ) -> None:
        super().__init__(name="chaos-memory", daemon=True)
        self.groups, self.clock, self.every_s = groups, clock, every_s
        self.samples: list[Sample] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            rss = group_rss()
            now = self.clock()
            for name, pid in self.groups().items():
                if rss.get(pid):
                    self.samples.append(Sample(round(now, 3), name, pid, rss[pid]))
            self.stopping.wait(self.every_s)

    def stop(self) -> None:
        self.stopping.set()
        self.join()


def growth(samples: Iterable[Sample], warmup_s: float) -> dict[str, float | None]:
    """(RSS at the end / RSS after warm-up) - 1, each end the mean of ``ENDS`` samples; None for a
    server none of whose groups lived past its warm-up with samples to spare."""
    series: dict[tuple[str, int], list[Sample]] = {}
    for sample in samples:
        series.setdefault((sample.name, sample.pid), []).append(sample)
    found: dict[str, float | None] = {}
    for (name, _), group in series.items():
        since = group[0].t_s + warmup_s  # the group's own start (the run's, for the first)
        measured = [s.rss_bytes for s in group if s.t_s >= since]
        ratio = None
        if len(measured) >= 2 * ENDS:
            first, last = statistics.mean(measured[:ENDS]), statistics.mean(measured[-ENDS:])
            ratio = round(last / first - 1.0, 4)
        known = found.get(name)
        found[name] = ratio if known is None else known if ratio is None else max(known, ratio)
    return found
