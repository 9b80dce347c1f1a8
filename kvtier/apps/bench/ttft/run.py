"""``kvtier bench ttft``: the time to first token of prompts served from kvtier, in real vLLM,
and the rows that prove kvtier costs nothing where it cannot help ("no regret").

One run, one set of engines alive together, each in its own process (``process``): the same
model with no connector (``baseline``), with kvtier (its host tier: ``tier.host_tier``) and
with vLLM's ExampleConnector.
Requests interleave between them, so slow drift of the machine reaches every configuration
alike, and every ratio is taken over pairs measured one right after the other:

    hits (``hits``)              per prompt length, fresh prompts: recompute, the engine's own
                                 hit with kvtier off and on, a kvtier hit (``driver.load``), an
                                 Example hit
    throughput (``throughput``)  never-seen prompts with kvtier / without, in pairs until the
                                 ratio's spread is below its goal

The no-regret rows (``ratios.GOALS``): the engine's own hit, kvtier on / off (<= 1.1); a
kvtier hit / the engine's own hit (<= 1.0), at lengths that are multiples of the chunk and not;
the 0%-hit throughput, kvtier / none (>= 0.98). Tables and the Markdown: ``report``; the PNG:
``plot``.
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

from kvtier.apps.bench.common.engine_env import in_process_env
from kvtier.apps.bench.common.ratios import Ratio, paired
from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.common.timing import OtherLoad, median, own_cpu_seconds
from kvtier.apps.bench.ttft import report
from kvtier.apps.bench.ttft.hits import MEASURES, measure_hits
from kvtier.apps.bench.ttft.plot import plot
from kvtier.apps.bench.ttft.process import EngineProcess
from kvtier.apps.bench.ttft.ratios import GOALS, INFO, verdict
from kvtier.apps.bench.ttft.results import TTFTResults
from kvtier.apps.bench.ttft.setup import ENGINE_BLOCK, Setup, Workload, loadable_chunks
from kvtier.apps.bench.ttft.throughput import measure_throughput
from kvtier.apps.bench.ttft.tier import CHUNK_TOKENS, HOST_BYTES, TierTTFT, host_tier
from kvtier.apps.models import model_path

CONFIGS = ("baseline", "kvtier", "example")  # the engines: no connector, kvtier, ExampleConnector
FULL: dict[str, Any] = {
    "lengths": (1024, 2048, 4096), "unaligned": (1000, 2000, 4000), "repeats": 5,
    "pairs": Workload.pairs, "max_pairs": Workload.max_pairs,
}  # fmt: skip
QUICK: dict[str, Any] = {
    "lengths": (1024,), "unaligned": (1000,), "repeats": 3, "pairs": 4, "max_pairs": 4
}  # fmt: skip
WORKLOAD_KEYS = ("pairs", "max_pairs", "prompts", "tokens", "max_tokens")  # given: the workload's


def options(quick: bool, **given: Any) -> dict[str, Any]:
    """``run``'s keyword arguments: the ``QUICK`` or ``FULL`` sizes, overridden by each given
    value that is not None; ``pairs``, ``max_pairs``, ``prompts``, ``tokens`` and
    ``max_tokens`` go into the workload."""
    chosen = {**(QUICK if quick else FULL), **{k: v for k, v in given.items() if v is not None}}
    workload = Workload(**{key: chosen.pop(key) for key in WORKLOAD_KEYS if key in chosen})
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
    """Measure, print the tables, write ``ttft-cpu.json``, ``.md`` and ``.png`` under
    ``out_dir``.

    ``lengths`` are the prompt lengths of every row (ExampleConnector's too), ``unaligned``
    more lengths for the kvtier-hit rows. Returns the JSON document. ``RuntimeError`` when a
    request was not served as its row says (``hits``) or an engine failed.
    """
    workload = workload or Workload()
    model_dir = model if isinstance(model, Path) else model_path(model)
    all_lengths = tuple(dict.fromkeys((*lengths, *unaligned)))
    tier = host_tier(chunk_tokens)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvtier-ttft-") as storage, ExitStack() as stack:
        setup = Setup(model_dir, dtype, all_lengths, repeats, workload)
        engines = _start(setup, tier, Path(storage), stack)
        total = repeats * sum(all_lengths) + workload.pairs * workload.tokens_per_pair
        with tqdm(total=total, desc="bench ttft: hits", unit="tok", unit_scale=True) as progress:
            others = OtherLoad(_cpu_seconds(list(engines.values())))
            results = measure_hits(engines, setup, tier, Path(storage), tuple(lengths), progress)
            results.other_load["hits"] = others.cores()
            engines.pop("example").close()
            progress.set_description("bench ttft: throughput")
            others = OtherLoad(_cpu_seconds(list(engines.values())))
            throughput, throughput_record = measure_throughput(engines, setup, progress)
            results.other_load["throughput"] = others.cores()
    ratios = {length: _ratios(results, length) for length in all_lengths}
    rows = [_row(results, length, chunk_tokens, ratios[length])
            for length in all_lengths]  # fmt: skip
    no_regret = [
        *(verdict(key, ratios[length][key], length) for key in GOALS
          for length in all_lengths if key in ratios[length]),
        verdict("throughput_ratio", throughput, None),
    ]  # fmt: skip
    meta = {
        "model": model_dir.name, "dtype": dtype, "repeats": repeats,
        "engine_block_tokens": ENGINE_BLOCK, "chunk_tokens": chunk_tokens,
        "kvtier_host_bytes": HOST_BYTES,
        "kv_cache_gib": float(in_process_env()["VLLM_CPU_KVCACHE_SPACE"]),
        "method": "engines alive together, one process each; requests interleaved; "
                  "ratios: median of per-pair ratios, spread: 95% CI half-width / median",
        "goals": {key: goal.text for key, goal in GOALS.items()}, "info": INFO,
        "no_regret": no_regret, "all_pass": all(row["pass"] for row in no_regret),
        "throughput": throughput_record, "runtime_s": round(time.perf_counter() - started, 1),
        "other_load_cores": results.other_load, "samples_s": results.raw_seconds(),
    }  # fmt: skip
    document = write_json(out_dir / "ttft-cpu.json", "ttft", rows, report.summary, **meta)
    plot(rows, meta, out_dir / "ttft-cpu.png")
    report.print_tables(rows, meta, console or Console())
    return document


def _start(
    setup: Setup, tier: TierTTFT, storage: Path, stack: ExitStack
) -> dict[str, EngineProcess]:
    """Every engine of ``CONFIGS``, started together, closed by ``stack``."""
    from kvtier.apps.bench.common.connector import example_config

    transfers = {"baseline": None, "kvtier": tier.transfer(), "example": example_config(storage)}
    env = in_process_env()
    engines = {
        config: stack.enter_context(
            EngineProcess(config, setup.engine_args(transfers[config]), env)
        )
        for config in CONFIGS
    }
    for engine in tqdm(engines.values(), desc="bench ttft: starting engines", unit="engine"):
        engine.wait_ready()
    return engines


def _cpu_seconds(engines: list[EngineProcess]) -> Callable[[], float]:
    """CPU seconds of this process and ``engines``' processes: the work being measured."""
    return lambda: own_cpu_seconds() + sum(e.cpu_seconds() for e in engines)


def _ratios(results: TTFTResults, length: int) -> dict[str, Ratio]:
    """One prompt length's paired ratios, by key (``GOALS``, ``INFO`` and more)."""
    seconds = {m: results.seconds(m, length) for m in results.measured(length)}
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
    results: TTFTResults, length: int, chunk_tokens: int, ratios: dict[str, Ratio]
) -> dict[str, Any]:
    """One prompt length: median seconds per measure, paired ratios, the kvtier hits' checks."""
    runs = {m: results.samples[m, length] for m in MEASURES if m in results.measured(length)}
    hits, own = results.checks["kvtier_hit", length], results.checks["engine_hit_on", length]
    return {
        "prompt_tokens": length, "aligned": length % chunk_tokens == 0,  # to the chunk
        **{f"{m}_s": round(median([s.seconds for s in r]), 4) for m, r in runs.items()},
        **{key: round(ratio.median, 3) for key, ratio in ratios.items()},
        **{f"{key}_spread": round(ratio.spread, 3) for key, ratio in ratios.items()},
        "kvtier_hit_verified": True,  # else ``driver.load`` raised
        "kvtier_hit_chunks": median([float(c.loaded_chunks) for c in hits]),
        "full_chunks": length // chunk_tokens,
        "loadable_chunks": loadable_chunks(length, chunk_tokens),
        "kvtier_load_s": round(median([c.load_s for c in hits]), 4),
        "engine_hit_on_kvtier_chunks": max(c.loaded_chunks for c in own),
        **{f"{m}_cached_tokens": median([float(s.cached_tokens) for s in r])
           for m, r in runs.items() if m.endswith("hit") or m.endswith("hit_on")},
        **{f"{m}_steps": median([float(s.steps) for s in r])
           for m, r in runs.items() if m.endswith("hit") or m.endswith("hit_on")},
    }  # fmt: skip
