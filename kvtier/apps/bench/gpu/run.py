"""Running ``kvtier bench gpu``: every shape's measures in turn, each on its own, each kept.

    Options(...)             what to run (``command.py`` fills it from the command line)
    run(options, console)    measure; write ``gpu.json`` (after every measure), ``gpu.png`` and
                             ``gpu.md``; print the table; return the JSON document

Per shape, in order: ``host`` (host_store_ratio, host_load_ratio), ``prefill``
(hit_over_prefill), ``beside`` (beside_compute_store, _load; on the host measure's rig),
``launches`` (no figure: the grid kernel's launches, timed on that rig, ``launches.py``),
``disk``, ``redis``, ``pull``; then ``pinning`` once. A measure that raises records its error
in the JSON and the rest go on; one past ``limit_s`` is interrupted (``deadline.py``), and none
starts once ``budget_s`` is spent (each is given at most what is left of it).
"""

from __future__ import annotations

import faulthandler
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from tqdm import tqdm

from kvtier.apps.bench.common.machine import cpu
from kvtier.apps.bench.gpu import (
    beside_compute,
    disk_load,
    host_copy,
    launches,
    markdown,
    peer_pull,
    pinning_rate,
    prefill,
    redis_load,
    report,
)
from kvtier.apps.bench.gpu.advice import advise
from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.deadline import deadline
from kvtier.apps.bench.gpu.figures import GOALS, Measured, Results, Unavailable
from kvtier.apps.bench.gpu.shapes import SHAPES
from kvtier.pages.mechanism import gpu_mechanisms

MEASURES = ("host", "prefill", "beside", "launches", "disk", "redis", "pull", "pinning")


@dataclass(frozen=True)
class Options:
    out: Path
    shapes: tuple[str, ...]
    reps: int
    quick: bool = False
    device: str | None = None  # None: cuda when there is one
    tokens: int = 4096
    measures: tuple[str, ...] = MEASURES
    disk_dir: Path | None = None  # None: ``out/tmp``
    redis_url: str | None = None  # None: start a redis-server
    limit_s: float = 240.0  # per measure
    budget_s: float | None = None  # the whole run: measures past it are not started


def run(options: Options, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if device.index is None:  # torch.cuda.set_device refuses a device without an index
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    started = time.perf_counter()
    results = Results(options.out / "gpu.json", _meta(options, device))
    steps = len(options.shapes) * (len(MEASURES) - 1) + 1
    with tqdm(total=steps, desc="bench gpu", unit="measure") as bar:
        bench = _Bench(options, device, results, bar)
        for name in options.shapes:
            bench.shape(name)
        gib = 2.0 if options.quick else 4.0
        bench.attempt(None, "pinning", pinning_rate.FIGURES,
                      lambda: pinning_rate.measure(device, gib))  # fmt: skip
    document = results.document
    document["runtime_s"] = round(time.perf_counter() - started, 1)
    advice = advise(document)  # each direction's mechanism on this GPU
    if advice is not None:
        document["advice"] = advice.as_json()
    png = options.out / "gpu.png"
    why_no_png = report.plot(document, png)
    if why_no_png is not None:
        document["png"] = why_no_png
    results.write()
    markdown.write(results.path, document)
    report.print_table(document, console)
    written = ", ".join(p.name for p in (results.path, png, options.out / "gpu.md") if p.exists())
    console.print(f"wrote {written} in {options.out}")
    return document


class _Bench:
    """One run's state: where results go, the progress bar, the matmul loop (made once)."""

    def __init__(self, options: Options, device: torch.device, results: Results, bar: Any) -> None:
        self.options = options
        self.device = device
        self.clock = Clock(device)
        self.results = results
        self.bar = bar
        self.loop_settings = _loop_settings(device, options.quick)
        self.loop: beside_compute.Loop | None = None
        budget = options.budget_s
        self.ends = time.monotonic() + (budget if budget is not None else float("inf"))

    def attempt(
        self, shape: str | None, name: str, figures: tuple[str, ...], fn: Callable[[], Measured]
    ) -> Measured | None:
        self.bar.set_description(f"bench gpu: {shape or 'all'} {name}")
        left = self.ends - time.monotonic()
        try:
            if name not in self.options.measures:
                return self.results.attempt(shape, name, figures, _skipped)
            if left <= 0:
                return self.results.attempt(shape, name, figures, _past_budget)

            def bounded() -> Measured:  # the measure alone: its recording is never interrupted
                limit = min(self.options.limit_s, left)
                with deadline(limit, lambda: _stuck(self.results, shape, name)):
                    return fn()

            return self.results.attempt(shape, name, figures, bounded)
        finally:
            _release(self.device)
            self.bar.update()

    def shape(self, name: str) -> None:
        shape, device, clock = SHAPES[name], self.device, self.clock
        reps, tokens = self.options.reps, self.options.tokens
        about = {"about": shape.about, "tokens": tokens, "block_tokens": shape.block_tokens}
        self.results.shape(name, **about, chunk_tokens=shape.chunk_tokens)
        rigs: list[host_copy.HostRig] = []

        def host() -> Measured:
            rigs.append(host_copy.HostRig(shape, tokens, device))
            return host_copy.measure(rigs[0], reps, clock)

        hosted = self.attempt(name, "host", ("host_store_ratio", "host_load_ratio"), host)

        def hit() -> Measured:
            if hosted is None:
                raise Unavailable("no host load times (see host_load_ratio)")
            measured = prefill.measure(shape, tokens, device, reps, clock)
            seconds = measured.details["seconds"]["values"]
            loads = host_copy.load_seconds(hosted)
            measured.figures["hit_over_prefill"] = prefill.hit_over_prefill(loads, seconds)
            return measured

        def beside() -> Measured:
            if not rigs:
                raise Unavailable("no host rig (see host_store_ratio)")
            if self.loop is None:
                self.loop = beside_compute.Loop(device, *self.loop_settings[:2])
            return beside_compute.measure(rigs[0], self.loop, reps, self.loop_settings[2])

        def launched() -> Measured:
            if not rigs:
                raise Unavailable("no host rig (see host_store_ratio)")
            return launches.measure(rigs[0], reps)

        try:
            self.attempt(name, "prefill", ("hit_over_prefill",), hit)
            self.attempt(name, "beside", ("beside_compute_store", "beside_compute_load"), beside)
            self.attempt(name, "launches", (), launched)
        finally:
            for rig in rigs:
                rig.close()
        disk_dir = self.options.disk_dir or self.options.out / "tmp"
        redis_url = self.options.redis_url
        self.attempt(
            name,
            "disk",
            ("disk_warm_ratio", "disk_cold_ratio"),
            lambda: disk_load.measure(shape, tokens, device, reps, clock, disk_dir),
        )
        self.attempt(
            name,
            "redis",
            ("redis_ratio",),
            lambda: redis_load.measure(shape, tokens, device, reps, clock, redis_url),
        )
        self.attempt(name, "pull", ("pull_ratio",),
                     lambda: peer_pull.measure(shape, tokens, device, reps, clock))  # fmt: skip


def _skipped() -> Measured:
    raise Unavailable("not run (--measures)")


def _past_budget() -> Measured:
    raise Unavailable("not run: the run's --budget-s was spent")


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _stuck(results: Results, shape: str | None, name: str) -> None:
    """A measure that no signal could interrupt: keep what was measured, then end."""
    faulthandler.dump_traceback(all_threads=True)
    results.document["errors"].append({"shape": shape, "measure": name,
                                       "error": "stuck: the process was ended"})  # fmt: skip
    results.write()
    os._exit(3)


def _loop_settings(device: torch.device, quick: bool) -> tuple[int, float, int]:
    """The matmul loop: (matrix size, seconds per iteration, iterations per run)."""
    if device.type != "cuda":
        return 256, 0.01, 3
    return (4096, 0.03, 4) if quick else (8192, 0.1, 4)


def _meta(options: Options, device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else f"cpu: {cpu().get('model')}"
    return {
        "benchmark": "gpu", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": name, "device_type": device.type, "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None, "python": platform.python_version(),
        "machine": {"platform": platform.platform(), "cpu": cpu(), "cpus": os.cpu_count()},
        "argv": sys.argv[1:], "quick": options.quick, "reps": options.reps,
        "tokens": options.tokens, "goals": {k: list(v) for k, v in GOALS.items()},
        "default_mechanism": str(gpu_mechanisms()) if cuda else None,  # what an engine uses
    }  # fmt: skip
