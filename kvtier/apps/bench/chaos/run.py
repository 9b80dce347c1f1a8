"""``kvtier bench chaos``: the cluster under load while the faults come, then the reference.

    run(out, settings, logs=None) -> int   0 when every correctness goal passed, else 1; writes
                                           ``chaos.json``, ``chaos.md`` and ``chaos.png`` in
                                           ``out`` (``logs``: keep the servers' logs there)

In order: the cluster (``cluster.py``); the load (``load.py``), the faults (``faults.py``) and
the memory sampler (``memory.py``) together, on one clock, for ``settings.duration_s``; the
cluster stopped; every distinct prompt answered by one engine without kvtier (``reference.py``);
the document (``summarize.py``), printed and written (``report.py``).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from kvtier.apps.bench.chaos import report
from kvtier.apps.bench.chaos.cluster import proxy_reuses_ports, started_cluster
from kvtier.apps.bench.chaos.faults import Injector
from kvtier.apps.bench.chaos.load import drive
from kvtier.apps.bench.chaos.memory import Sampler
from kvtier.apps.bench.chaos.reference import compare, reference_answers
from kvtier.apps.bench.chaos.schedule import plan
from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.bench.chaos.summarize import passed, summarize
from kvtier.apps.bench.chaos.workload import Workload
from kvtier.apps.bench.common.models import model_dir
from kvtier.apps.bench.common.results import write


def run(out: Path, settings: ChaosSettings, logs: Path | None = None) -> int:
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        return _run(out, settings, logs)
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-chaos-") as temporary:
        return _run(out, settings, Path(temporary))


def _run(out: Path, settings: ChaosSettings, logs: Path) -> int:
    model = model_dir(settings.model)
    reuse_port = proxy_reuses_ports()
    print(f"kvtier bench chaos: starting Redis, {settings.engines} engines"
          f"{', a prefill→decode pair' if settings.pd else ''} and the proxies (logs: {logs})",
          flush=True)  # fmt: skip
    with started_cluster(settings, logs, reuse_port) as cluster:
        urls = {"fleet": cluster.proxy.url}
        if cluster.pd_proxy is not None:
            urls["pd"] = cluster.pd_proxy.url
        began = time.monotonic()

        def clock() -> float:
            return time.monotonic() - began

        sampler = Sampler(cluster.groups, clock, settings.sample_s)
        injector = Injector(cluster, plan(settings), settings, clock, reuse_port)
        print(f"kvtier bench chaos: {settings.minutes:g} minutes of load at {settings.rate:g} "
              "requests/s, faults seeded", flush=True)  # fmt: skip
        sampler.start()
        injector.start()
        try:
            driven = asyncio.run(drive(Workload(model, settings), urls, settings, clock))
        finally:
            injector.stop()
            sampler.stop()
    answered = [tuple(driven.asks[r.id].prompt) for r in driven.records if r.ok]
    print(f"kvtier bench chaos: {len(set(answered))} distinct prompts asked of one engine "
          "without kvtier", flush=True)  # fmt: skip
    reference = reference_answers(model, answered, settings.max_tokens, logs)
    comparison = compare(driven.records, driven.asks, reference)
    found = summarize(settings, driven, injector.events, sampler.samples, comparison, reuse_port)
    write(out / "chaos.json", found, report.summary, indent=1)
    report.plot(found, out / "chaos.png")
    report.report(found)
    return 0 if passed(found) else 1
