"""``kvtier bench ttft``: time to first token of a prompt served from kvtier, in real vLLM.

One in-process vLLM engine per configuration, created once and torn down before the next; one
``max_tokens=1`` request at a time, timed by the wall clock around ``LLM.generate``. Per prompt
length and repetition, with a fresh prompt each repetition (nothing leaks between them):

    recompute   no connector, the prompt never seen: the ceiling
    engine hit  the same engine, the same prompt again: vLLM's own prefix cache, the floor
    kvtier hit  KVTierConnector: run once (stores), drain, ``reset_prefix_cache()``, run again;
                kvtier's counters must show the chunks came from its host tier, else the run raises
    example hit vLLM's in-tree ExampleConnector (safetensors files): the same sequence

and the 0%-hit overhead: the throughput of unique prompts with kvtier over without it, on fresh
engines in A/B/B/A order, median of the paired ratios. Figures are medians over repetitions.

The engine hit recomputes the block holding the prompt's last token (vLLM never serves it from
its own cache); a kvtier hit covering the whole prompt leaves vLLM only that last token. At
lengths that are multiples of the engine block, a kvtier hit can therefore beat the "floor".
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from rich.console import Console
from tqdm import tqdm

import kvtier
from kvtier.bench.report import median, write_json
from kvtier.bench.ttft_report import GOALS, MEASURES, plot, print_tables
from kvtier.models import make_prompt, model_path

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.inputs import TokensPrompt

T = TypeVar("T")

ENGINE_ENV = {  # forced: kvtier's counters and step counts need the engine in this process
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # V2 needs Triton
}
ENGINE_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "3"}  # GiB
ENGINE_BLOCK, CHUNK_TOKENS = 32, 64
HIT_FRACTION = 0.9  # of a prompt's full chunks a kvtier hit must load, else the run is invalid
CONFIGS = ("baseline", "kvtier", "example")


@dataclass(frozen=True)
class Workload:
    """The 0%-hit throughput workload: unique prompts, each decoded ``max_tokens`` tokens."""

    prompts: int = 16
    tokens: int = 1024
    max_tokens: int = 16
    rounds: int = 3  # A/B pairs, each engine fresh

    @property
    def tokens_per_round(self) -> int:
        return self.prompts * self.tokens


@dataclass(frozen=True)
class Setup:
    model: Path
    dtype: str
    lengths: tuple[int, ...]
    repeats: int
    workload: Workload
    storage: Path  # ExampleConnector's files

    def engine_args(self, transfer: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "model": str(self.model),
            "dtype": self.dtype,
            "max_model_len": max(*self.lengths, self.workload.tokens) + 64,
            "enforce_eager": True,
            "seed": 0,
            "block_size": ENGINE_BLOCK,
            "gpu_memory_utilization": 0.3,  # a fraction of host memory on the CPU
            "distributed_executor_backend": "uni",
            "kv_transfer_config": transfer,
        }

    def transfer(self, config: str) -> dict[str, Any] | None:
        if config == "kvtier":
            extra = {"cpu_bytes_to_use": "4GiB", "block_size": CHUNK_TOKENS}
            return {"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm",
                    "kv_role": "kv_both", "kv_connector_extra_config": extra}  # fmt: skip
        if config == "example":
            extra = {"shared_storage_path": str(self.storage)}
            return {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": extra}  # fmt: skip
        return None


class Sample(NamedTuple):
    seconds: float
    steps: int  # engine-core steps the request took (polls while a load is in flight included)
    forwards: int  # of those, steps that ran the model


class Served(NamedTuple):
    seconds: float  # until every request finished and, with kvtier, every store drained
    drain_seconds: float  # of which: draining kvtier's stores after the last request finished


@dataclass
class Samples:
    """Everything measured, keyed by (measure, prompt length)."""

    runs: dict[tuple[str, int], list[Sample]] = field(default_factory=lambda: defaultdict(list))
    hit_chunks: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    load_seconds: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    other_load: dict[str, float | None] = field(default_factory=dict)  # cores, per phase

    def seconds(self, measure: str, length: int) -> float:
        return median([s.seconds for s in self.runs[measure, length]])

    def steps(self, measure: str, length: int) -> tuple[float, float]:
        runs = self.runs[measure, length]
        return median([float(s.steps) for s in runs]), median([float(s.forwards) for s in runs])


# one configuration's measurements: (engine, (length, prompt) pairs, into, tick per prompt)
Phase = Callable[["LLM", list[tuple[int, list[int]]], Samples, Callable[[int], object]], None]


def run(
    out_dir: Path,
    lengths: tuple[int, ...] = (1024, 2048, 4096),
    repeats: int = 5,
    model: str | Path = "bench",
    dtype: str = "bfloat16",
    workload: Workload = Workload(),
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure, print a table, write ``ttft-cpu.json`` and ``ttft-cpu.png`` under ``out_dir``.

    Sets the engine environment (in-process engine) for the whole process. Returns the JSON
    document. Raises ``RuntimeError`` when a kvtier hit did not come from kvtier's host tier.
    """
    for name, value in ENGINE_ENV.items():
        os.environ[name] = value
    for name, value in ENGINE_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    model_dir = model if isinstance(model, Path) else model_path(model)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvtier-ttft-") as storage:
        setup = Setup(model_dir, dtype, tuple(lengths), repeats, workload, Path(storage))
        total = (
            len(CONFIGS) * repeats * sum(lengths) + 2 * workload.rounds * workload.tokens_per_round
        )
        with tqdm(total=total, desc="bench ttft", unit="tok", unit_scale=True) as progress:
            samples = _measure_ttft(setup, progress)
            others = _OtherLoad()
            throughput = _measure_throughput(setup, progress)
            samples.other_load["throughput"] = others.cores()
    rows = [_row(samples, length) for length in setup.lengths]
    meta = {
        "model": model_dir.name, "dtype": dtype, "repeats": repeats,
        "engine_block_tokens": ENGINE_BLOCK, "chunk_tokens": CHUNK_TOKENS,
        "kv_cache_gib": float(os.environ["VLLM_CPU_KVCACHE_SPACE"]), "goals": GOALS,
        "throughput": throughput, "runtime_s": round(time.perf_counter() - started, 1),
        "other_load_cores": samples.other_load,
        "samples_s": _raw(samples),
    }  # fmt: skip
    write_json(out_dir / "ttft-cpu.json", "ttft", rows, **meta)
    plot(rows, throughput, out_dir / "ttft-cpu.png")
    print_tables(rows, meta, console or Console())
    return {**meta, "rows": rows}


# ---- TTFT ------------------------------------------------------------------------------------


def _measure_ttft(setup: Setup, progress: tqdm[Any]) -> Samples:
    samples = Samples()
    prompts = [  # repetition-major, so slow drift of the machine spreads over every length
        (length, make_prompt(setup.model, length, seed=rep * 100_003 + length))
        for rep in range(setup.repeats)
        for length in setup.lengths
    ]
    warmup = [(min(setup.lengths), make_prompt(setup.model, min(setup.lengths), seed=7))]
    phases: dict[str, Phase] = {
        "baseline": _baseline, "kvtier": _kvtier, "example": partial(_example, setup.storage)
    }  # fmt: skip
    for config, phase in phases.items():
        progress.set_description(f"bench ttft: {config}")
        others = _OtherLoad()
        _on_engine(
            setup, config, partial(_measure, phase, warmup, prompts, samples, progress.update)
        )
        samples.other_load[config] = others.cores()
    return samples


def _measure(
    phase: Phase,
    warmup: list[tuple[int, list[int]]],
    prompts: list[tuple[int, list[int]]],
    samples: Samples,
    tick: Callable[[int], object],
    llm: LLM,
) -> None:
    phase(llm, warmup, Samples(), lambda tokens: None)  # first-call costs, discarded
    phase(llm, prompts, samples, tick)


def _baseline(
    llm: LLM, prompts: list[tuple[int, list[int]]], samples: Samples, tick: Callable[[int], object]
) -> None:
    for length, prompt in prompts:
        samples.runs["recompute", length].append(_timed(llm, prompt))
        samples.runs["engine_hit", length].append(_timed(llm, prompt))
        tick(length)


def _kvtier(
    llm: LLM, prompts: list[tuple[int, list[int]]], samples: Samples, tick: Callable[[int], object]
) -> None:
    from kvtier.vllm import settle

    for length, prompt in prompts:
        samples.runs["kvtier_miss", length].append(_timed(llm, prompt))
        settle(llm)
        _reset_prefix_cache(llm)
        before = kvtier.stats(llm).cpu
        hits, load_s = before.hit_chunks, before.load_seconds
        samples.runs["kvtier_hit", length].append(_timed(llm, prompt))
        settle(llm)
        after = kvtier.stats(llm).cpu
        hit_chunks = after.hit_chunks - hits
        if hit_chunks < HIT_FRACTION * (length // CHUNK_TOKENS) or after.failed_loads:
            raise RuntimeError(
                f"kvtier bench ttft: invalid run, a {length}-token prompt hit {hit_chunks} of "
                f"{length // CHUNK_TOKENS} chunks in kvtier ({after.failed_loads} failed loads)"
            )
        samples.hit_chunks[length].append(hit_chunks)
        samples.load_seconds[length].append(after.load_seconds - load_s)
        tick(length)


def _example(
    storage: Path,
    llm: LLM,
    prompts: list[tuple[int, list[int]]],
    samples: Samples,
    tick: Callable[[int], object],
) -> None:
    for length, prompt in prompts:
        saved = _count(storage)
        samples.runs["example_miss", length].append(_timed(llm, prompt))
        if _count(storage) != saved + 1:  # one folder per prompt, holding every layer's file
            raise RuntimeError(f"kvtier bench ttft: ExampleConnector did not save {length} tokens")
        _reset_prefix_cache(llm)
        samples.runs["example_hit", length].append(_timed(llm, prompt))
        tick(length)


def _count(storage: Path) -> int:
    return sum(1 for _ in storage.iterdir()) if storage.exists() else 0


def _timed(llm: LLM, prompt: list[int]) -> Sample:
    """Wall-clock seconds of one ``max_tokens=1`` request (prefill + first token)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1)
    request: TokensPrompt = {"prompt_token_ids": prompt}
    with _StepCounter(llm) as counter:
        started = time.perf_counter()
        llm.generate([request], params, use_tqdm=False)
        seconds = time.perf_counter() - started
    return Sample(seconds, counter.steps, counter.forwards)


class _StepCounter:
    """Counts the engine-core steps of an in-process engine while entered (wraps ``step_fn``)."""

    def __init__(self, llm: LLM) -> None:
        self.core = _engine_core(llm)
        self.steps = self.forwards = 0

    def __enter__(self) -> _StepCounter:
        step = self.core.step_fn

        def counted() -> tuple[Any, bool]:
            outputs, executed = step()
            self.steps += 1
            self.forwards += bool(executed)
            return outputs, executed

        self.original, self.core.step_fn = step, counted
        return self

    def __exit__(self, *exc: object) -> None:
        self.core.step_fn = self.original


def _engine_core(llm: LLM) -> Any:
    """The ``EngineCore`` of an in-process engine (behind vLLM's ``InprocClient``)."""
    client: Any = llm.llm_engine.engine_core
    return client.engine_core


def _reset_prefix_cache(llm: LLM) -> None:
    if not llm.reset_prefix_cache():
        raise RuntimeError("kvtier bench ttft: reset_prefix_cache() refused (blocks in use)")


def _on_engine(setup: Setup, config: str, body: Callable[[LLM], T]) -> T:
    """``body`` on a fresh engine of ``config``, the only one alive; torn down after it.

    ``body`` must not keep the engine: an old engine collected later would tear down the
    process-wide distributed state of the next one.
    """
    import vllm

    llm = vllm.LLM(**setup.engine_args(setup.transfer(config)))
    try:
        result = body(llm)
    finally:
        engine = weakref.ref(llm)
        del llm
        gc.unfreeze()  # the in-process EngineCore froze its startup heap (KV cache included)
        gc.collect()
        vllm.distributed.cleanup_dist_env_and_memory()
    if engine() is not None:
        raise RuntimeError(f"kvtier bench ttft: the {config} engine is still referenced")
    return result


class _OtherLoad:
    """CPU time taken on this machine by anything but this process (other processes, hypervisor
    steal) since construction, in cores (Linux ``/proc/stat``; None elsewhere). Above ~0.1 on a
    2-core machine the timings are disturbed."""

    def __init__(self) -> None:
        self.start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        """(machine busy seconds, this process's CPU seconds, monotonic time)."""
        try:
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        except OSError:
            return None
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        own = os.times()
        return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.monotonic()

    def cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        busy, own, wall = (e - s for s, e in zip(self.start, end, strict=True))
        return round(max(0.0, busy - own) / wall, 2)


# ---- 0%-hit throughput -------------------------------------------------------------------------


def _measure_throughput(setup: Setup, progress: tqdm[Any]) -> dict[str, Any]:
    work = setup.workload
    tokens: dict[str, list[float]] = {"baseline": [], "kvtier": []}
    drains: list[float] = []
    warmup = [make_prompt(setup.model, work.tokens // 4, seed=11 + i) for i in range(2)]
    for round_ in range(work.rounds):
        prompts = [
            make_prompt(setup.model, work.tokens, seed=1_000_003 + round_ * 1000 + i)
            for i in range(work.prompts)
        ]
        order = ("baseline", "kvtier") if round_ % 2 == 0 else ("kvtier", "baseline")
        for config in order:
            progress.set_description(f"bench ttft: throughput {config}")
            batch = partial(_warm_then_batch, warmup, prompts, work.max_tokens, config)
            served = _on_engine(setup, config, batch)
            tokens[config].append(work.prompts * (work.tokens + work.max_tokens) / served.seconds)
            drains += [served.drain_seconds] if config == "kvtier" else []
            progress.update(work.tokens_per_round)
    ratios = [k / b for k, b in zip(tokens["kvtier"], tokens["baseline"], strict=True)]
    return {
        "prompts": work.prompts, "prompt_tokens": work.tokens, "max_tokens": work.max_tokens,
        "rounds": work.rounds, "order": "A/B, B/A alternating; fresh engine each",
        "baseline_tokens_per_s": round(median(tokens["baseline"]), 1),
        "kvtier_tokens_per_s": round(median(tokens["kvtier"]), 1),
        "ratio": round(median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
        "kvtier_drain_s": round(median(drains), 4),
    }  # fmt: skip


def _warm_then_batch(
    warmup: list[list[int]], prompts: list[list[int]], max_tokens: int, config: str, llm: LLM
) -> Served:
    _batch(llm, warmup, 2, config)  # first-call costs, discarded
    return _batch(llm, prompts, max_tokens, config)


def _batch(llm: LLM, prompts: list[list[int]], max_tokens: int, config: str) -> Served:
    """Serve ``prompts`` together; with kvtier, wait for its stores to drain too."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    requests: list[TokensPrompt] = [{"prompt_token_ids": p} for p in prompts]
    started = time.perf_counter()
    llm.generate(requests, params, use_tqdm=False)
    finished = time.perf_counter()
    if config == "kvtier":
        from kvtier.vllm import settle

        settle(llm)
    ended = time.perf_counter()
    return Served(ended - started, ended - finished)


# ---- report ------------------------------------------------------------------------------------


def _row(samples: Samples, length: int) -> dict[str, Any]:
    s = {measure: samples.seconds(measure, length) for measure in MEASURES}
    kv_steps, kv_forwards = samples.steps("kvtier_hit", length)
    return {
        "prompt_tokens": length,
        **{f"{measure}_s": round(value, 4) for measure, value in s.items()},
        "kvtier_miss_s": round(samples.seconds("kvtier_miss", length), 4),
        "example_miss_s": round(samples.seconds("example_miss", length), 4),
        "kvtier_over_engine_hit": round(s["kvtier_hit"] / s["engine_hit"], 3),
        "example_over_engine_hit": round(s["example_hit"] / s["engine_hit"], 3),
        "kvtier_over_recompute": round(s["kvtier_hit"] / s["recompute"], 3),
        "kvtier_over_example": round(s["kvtier_hit"] / s["example_hit"], 3),
        "kvtier_hit_verified": True,  # else _kvtier raised
        "kvtier_hit_chunks": median([float(n) for n in samples.hit_chunks[length]]),
        "full_chunks": length // CHUNK_TOKENS,
        "kvtier_load_s": round(median(samples.load_seconds[length]), 4),
        "kvtier_hit_steps": kv_steps,
        "kvtier_hit_forwards": kv_forwards,
        "engine_hit_steps": samples.steps("engine_hit", length)[0],
        "example_hit_steps": samples.steps("example_hit", length)[0],
    }


def _raw(samples: Samples) -> dict[str, dict[int, list[float]]]:
    raw: dict[str, dict[int, list[float]]] = defaultdict(dict)
    for (measure, length), runs in sorted(samples.runs.items()):
        raw[measure][length] = [round(s.seconds, 4) for s in runs]
    return dict(raw)


# public names of the helpers ``kvtier bench disk`` (``disk_ttft.py``) shares
on_engine = _on_engine
timed = _timed
reset_prefix_cache = _reset_prefix_cache
OtherLoad = _OtherLoad
