"""``kvtier bench ttft``: the time to first token of prompts served from kvtier, in real vLLM,
and the rows that prove kvtier costs nothing where it cannot help ("no regret").

One run, one set of engines alive together, each in its own process (``ttft_process``): the
same model with no connector (``baseline``), with kvtier and with vLLM's ExampleConnector.
Requests interleave between them, so slow drift of the machine reaches every configuration
alike, and every ratio is taken over pairs measured one right after the other:

    hits (``ttft_hits``)              per prompt length, fresh prompts: recompute, the engine's own
                                      hit with kvtier off and on, a kvtier hit, an Example hit
    throughput (``ttft_throughput``)  never-seen prompts with kvtier / without, in pairs until the
                                      ratio's spread is below its goal

The no-regret rows (``ttft_ratios.GOALS``): the engine's own hit, kvtier on / off (<= 1.1); a
kvtier hit / the engine's own hit (<= 1.0), at lengths that are multiples of the chunk and not;
the 0%-hit throughput, kvtier / none (>= 0.98). Tables: ``ttft_report``; the PNG: ``ttft_plot``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from tqdm import tqdm

from kvtier.apps.bench.report import median, write_json
from kvtier.apps.bench.ttft_hits import MEASURES, HitSamples, measure_hits
from kvtier.apps.bench.ttft_plot import plot
from kvtier.apps.bench.ttft_process import EngineProcess
from kvtier.apps.bench.ttft_ratios import GOALS, INFO, Ratio, paired, verdict
from kvtier.apps.bench.ttft_report import print_tables
from kvtier.apps.bench.ttft_setup import (
    CHUNK_TOKENS,
    CONFIGS,
    ENGINE_BLOCK,
    KVTIER_HOST_BYTES,
    Setup,
    Workload,
    engine_env,
    loadable_chunks,
)
from kvtier.apps.bench.ttft_throughput import measure_throughput
from kvtier.apps.bench.ttft_timing import OtherLoad, own_cpu_seconds
from kvtier.apps.models import model_path

FULL: dict[str, Any] = {
    "lengths": (1024, 2048, 4096), "unaligned": (1000, 2000, 4000), "repeats": 5,
    "pairs": Workload.pairs, "max_pairs": Workload.max_pairs,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "lengths": (1024,), "unaligned": (1000,), "repeats": 3, "pairs": 4, "max_pairs": 4
}  # fmt: skip


def options(quick: bool, **given: Any) -> dict[str, Any]:
    """``run``'s keyword arguments: the ``QUICK`` or ``FULL`` sizes, overridden by each given
    value that is not None; ``pairs`` and ``max_pairs`` go into the workload."""
    chosen = {**(QUICK if quick else FULL), **{k: v for k, v in given.items() if v is not None}}
    workload = Workload(pairs=chosen.pop("pairs"), max_pairs=chosen.pop("max_pairs"))
    for key in ("lengths", "unaligned"):
        chosen[key] = tuple(chosen[key])
    return {**chosen, "workload": workload}


def run(
    out_dir: Path,
    lengths: tuple[int, ...] = FULL["lengths"],
    unaligned: tuple[int, ...] = FULL["unaligned"],
    repeats: int = 5,
    model: str | Path = "bench",
    dtype: str = "bfloat16",
    chunk_tokens: int = CHUNK_TOKENS,
    workload: Workload | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure, print the tables, write ``ttft-cpu.json`` and ``ttft-cpu.png`` under ``out_dir``.

    ``lengths`` are the prompt lengths of every row (ExampleConnector's too), ``unaligned``
    more lengths for the kvtier-hit rows. Returns the JSON document. ``RuntimeError`` when a
    request was not served as its row says (``ttft_hits``) or an engine failed.
    """
    workload = workload or Workload()
    model_dir = model if isinstance(model, Path) else model_path(model)
    all_lengths = tuple(dict.fromkeys((*lengths, *unaligned)))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvtier-ttft-") as storage, ExitStack() as stack:
        setup = Setup(model_dir, dtype, all_lengths, repeats, workload, Path(storage),
                      chunk_tokens=chunk_tokens)  # fmt: skip
        engines = _start(setup, stack)
        total = repeats * sum(all_lengths) + workload.pairs * workload.tokens_per_pair
        with tqdm(total=total, desc="bench ttft: hits", unit="tok", unit_scale=True) as progress:
            others = OtherLoad(_cpu_seconds(list(engines.values())))
            samples = measure_hits(engines, setup, tuple(lengths), progress)
            other_load = {"hits": others.cores()}
            engines.pop("example").close()
            progress.set_description("bench ttft: throughput")
            others = OtherLoad(_cpu_seconds(list(engines.values())))
            throughput, throughput_record = measure_throughput(engines, setup, progress)
            other_load["throughput"] = others.cores()
    ratios = {length: _ratios(samples, length) for length in all_lengths}
    rows = [_row(samples, length, chunk_tokens, ratios[length])
            for length in all_lengths]  # fmt: skip
    no_regret = [
        *(verdict(key, ratios[length][key], length) for key in GOALS
          for length in all_lengths if key in ratios[length]),
        verdict("throughput_ratio", throughput, None),
    ]  # fmt: skip
    meta = {
        "model": model_dir.name, "dtype": dtype, "repeats": repeats,
        "engine_block_tokens": ENGINE_BLOCK, "chunk_tokens": chunk_tokens,
        "kvtier_host_bytes": KVTIER_HOST_BYTES,
        "kv_cache_gib": float(engine_env()["VLLM_CPU_KVCACHE_SPACE"]),
        "method": "engines alive together, one process each; requests interleaved; "
                  "ratios: median of per-pair ratios, spread: 95% CI half-width / median",
        "goals": {key: goal.text for key, goal in GOALS.items()}, "info": INFO,
        "no_regret": no_regret, "all_pass": all(row["pass"] for row in no_regret),
        "throughput": throughput_record, "runtime_s": round(time.perf_counter() - started, 1),
        "other_load_cores": other_load, "samples_s": _raw(samples),
    }  # fmt: skip
    write_json(out_dir / "ttft-cpu.json", "ttft", rows, **meta)
    plot(rows, meta, out_dir / "ttft-cpu.png")
    print_tables(rows, meta, console or Console())
    return {**meta, "rows": rows}


def _start(setup: Setup, stack: ExitStack) -> dict[str, EngineProcess]:
    """Every engine of ``CONFIGS``, started together, closed by ``stack``."""
    env = engine_env()
    engines = {
        config: stack.enter_context(
            EngineProcess(config, setup.engine_args(setup.transfer(config)), env)
        )
        for config in CONFIGS
    }
    for engine in tqdm(engines.values(), desc="bench ttft: starting engines", unit="engine"):
        engine.wait_ready()
    return engines


def _cpu_seconds(engines: list[EngineProcess]) -> Callable[[], float]:
    """CPU seconds of this process and ``engines``' processes: the work being measured."""
    return lambda: own_cpu_seconds() + sum(e.call("cpu_seconds") for e in engines)


def _ratios(samples: HitSamples, length: int) -> dict[str, Ratio]:
    """One prompt length's paired ratios, by key (``GOALS``, ``INFO`` and more)."""
    seconds = {m: samples.seconds(m, length) for m in MEASURES if samples.runs[m, length]}
    ratios = {
        "engine_hit_on_over_off": paired(seconds["engine_hit_on"], seconds["engine_hit"]),
        "kvtier_over_engine_hit": paired(seconds["kvtier_hit"], seconds["engine_hit"]),
        "kvtier_miss_over_recompute": paired(seconds["kvtier_miss"], seconds["recompute"]),
        "kvtier_over_recompute": paired(seconds["kvtier_hit"], seconds["recompute"]),
    }
    if "example_hit" in seconds:
        ratios["example_over_engine_hit"] = paired(seconds["example_hit"], seconds["engine_hit"])
        ratios["kvtier_over_example"] = paired(seconds["kvtier_hit"], seconds["example_hit"])
    return ratios


def _row(
    samples: HitSamples, length: int, chunk_tokens: int, ratios: dict[str, Ratio]
) -> dict[str, Any]:
    """One prompt length: median seconds per measure, paired ratios, the kvtier hits' checks."""
    runs = {m: samples.runs[m, length] for m in MEASURES if samples.runs[m, length]}
    return {
        "prompt_tokens": length, "aligned": length % chunk_tokens == 0,  # to the chunk
        **{f"{m}_s": round(median([s.seconds for s in r]), 4) for m, r in runs.items()},
        **{key: round(ratio.median, 3) for key, ratio in ratios.items()},
        **{f"{key}_spread": round(ratio.spread, 3) for key, ratio in ratios.items()},
        "kvtier_hit_verified": True,  # else ttft_hits raised
        "kvtier_hit_chunks": median([float(n) for n in samples.kvtier_chunks[length]]),
        "full_chunks": length // chunk_tokens,
        "loadable_chunks": loadable_chunks(length, chunk_tokens),
        "kvtier_load_s": round(median(samples.kvtier_load_s[length]), 4),
        "engine_hit_on_kvtier_chunks": max(samples.own_hit_kvtier_chunks[length]),
        **{f"{m}_cached_tokens": median([float(s.cached_tokens) for s in r])
           for m, r in runs.items() if m.endswith("hit") or m.endswith("hit_on")},
        **{f"{m}_steps": median([float(s.steps) for s in r])
           for m, r in runs.items() if m.endswith("hit") or m.endswith("hit_on")},
    }  # fmt: skip


def _raw(samples: HitSamples) -> dict[str, dict[int, list[float]]]:
    raw: dict[str, dict[int, list[float]]] = {}
    for (measure, length), runs in sorted(samples.runs.items()):
        raw.setdefault(measure, {})[length] = [round(s.seconds, 4) for s in runs]
    return raw
