"""kvtier's benchmarks: each reports ratios against a bound measured in the same run, and writes
``<name>.json``, ``<name>.md`` and ``<name>.png`` (``bench/results/`` by default).

One package per family, each with ``command.py`` (its ``kvtier bench`` arguments), ``run.py``
(the benchmark) and ``report.py`` (its table, PNG and Markdown page); ``common/`` holds what
they share; ``commands.py`` lists the commands; ``pages.py`` is ``kvtier bench report``.

    common/       engine environment, connector configs, ports, servers, Redis servers, page
                  cache, timing, ratios, results (JSON + Markdown), plots, loopback, jobs
    copy/         host-tier copies / a plain torch copy
    ttft/         TTFT of kvtier hits, no regret; the TTFT driver every tier's TTFT bench uses
    disk/         disk tier / raw sequential I/O; TTFT from disk
    redis/        Redis tier / redis-py and a raw stream; TTFT from Redis
    transfer/     prefill→decode pulls / raw TCP; TTFT through kvtier proxy
    faults/       the randomized fault campaign
    scheduler/    the scheduler half's cost per step
    concurrency/  0%-hit throughput at high concurrency; a served long miss
    fleet/        kvtier proxy's policies: real/ (two engines), sim/ (simulated fleets)
    chaos/        a fleet under load while engines, Redis and the proxy fail (issue 39)
    gpu/          the CUDA paths, each against its bound
"""
