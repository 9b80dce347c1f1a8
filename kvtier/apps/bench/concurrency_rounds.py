"""``kvtier bench concurrency``, rounds: many never-seen prompts at once, with kvtier / without.

Processes one after the other, each one engine (``ttft_process.EngineProcess``): without a
connector (``baseline``), then with kvtier (a host tier only, roomy), and again, ``pairs`` times
(A B A B A B). Every process serves ``rounds`` rounds; a round is ``prompts`` prompts never seen
(fresh each round; the same ones for the two processes of a pair) of ``tokens`` tokens, given to
the engine at once, ``max_tokens`` each; with kvtier a round counts until its stores drained.
A process's time is the median of its rounds after the first ``warmup_rounds``; a pair's ratio
is kvtier's throughput over the baseline's: the baseline's time / kvtier's.

With ``filled_host``, each pair has a third process (A B C): kvtier with a host tier that small,
filled by the warm-up round, so every later store reuses memory an eviction freed, as in an
engine that has run a while (``filled_ratios``). The first fill of a fresh host tier writes
memory never touched, which costs the kernel a fault and zeroing per page and, on a virtual
machine whose host backs guest memory lazily (this one: about 4.5 ms per MiB, some 20 x the
copy), far more: the two ratios tell that cost from kvtier's own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvtier.apps.bench.report import median
from kvtier.apps.bench.ttft_process import EngineProcess
from kvtier.apps.bench.ttft_setup import Setup, Workload, engine_env
from kvtier.apps.bench.ttft_timing import OtherLoad, Served, own_cpu_seconds
from kvtier.apps.models import make_prompt

CONFIGS = ("baseline", "kvtier")  # A, B
FILLED = "kvtier-filled"  # C, with ``Rounds.filled_host``


@dataclass(frozen=True)
class Rounds:
    """The workload of the rounds part (defaults: the full run)."""

    prompts: int = 512
    tokens: int = 96
    max_tokens: int = 32
    rounds: int = 6
    warmup_rounds: int = 1  # not counted: first-call costs of a batch this size
    pairs: int = 3
    max_num_seqs: int = 512
    chunk_tokens: int = 64  # kvtier's chunk (its block_size)
    filled_host: str | None = None  # a third process: kvtier with a host tier this small

    @property
    def configs(self) -> tuple[str, ...]:
        return CONFIGS + ((FILLED,) if self.filled_host is not None else ())

    def __post_init__(self) -> None:
        if self.rounds <= self.warmup_rounds or self.pairs < 1:
            raise ValueError(
                f"kvtier bench concurrency: rounds > warmup_rounds, pairs >= 1: {self}"
            )


def engine_args(model: Path, dtype: str, work: Rounds, config: str) -> dict[str, Any]:
    """``vllm.LLM``'s arguments, as ``kvtier bench ttft``'s engines, ``max_num_seqs`` added."""
    workload = Workload(prompts=work.prompts, tokens=work.tokens, max_tokens=work.max_tokens)
    setup = Setup(model, dtype, (work.tokens + work.max_tokens,), 1, workload, Path("unused"),
                  chunk_tokens=work.chunk_tokens)  # fmt: skip
    transfer = setup.transfer("kvtier" if config == FILLED else config)
    if config == FILLED and transfer is not None:
        transfer["kv_connector_extra_config"]["cpu_bytes_to_use"] = work.filled_host
    return setup.engine_args(transfer) | {"max_num_seqs": work.max_num_seqs}


def measure_rounds(model: Path, dtype: str, work: Rounds) -> dict[str, Any]:
    """Every process's rounds, their medians and the pairs' ratios (the JSON's ``rounds``)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    processes: list[dict[str, Any]] = []
    with tqdm(total=work.pairs * len(work.configs) * work.rounds, desc="bench concurrency: rounds",
              unit="round") as progress:  # fmt: skip
        for pair in range(work.pairs):
            batches = [
                [make_prompt(tokenizer, work.tokens, seed=_seed(pair, r, i))
                 for i in range(work.prompts)]
                for r in range(work.rounds)
            ]  # fmt: skip
            for config in work.configs:
                record = _process(engine_args(model, dtype, work, config), config, batches, work,
                                  progress)  # fmt: skip
                processes.append({"pair": pair, **record})
    return summarize(processes, work)


def _seed(pair: int, round_: int, prompt: int) -> int:
    return 5_000_011 + pair * 1_000_003 + round_ * 10_007 + prompt


def _process(
    args: dict[str, Any], config: str, batches: list[list[list[int]]], work: Rounds,
    progress: tqdm[Any],
) -> dict[str, Any]:  # fmt: skip
    """One fresh engine process serving every round; its times, drains, load and counters."""
    with EngineProcess(config, args, engine_env()) as engine:
        engine.wait_ready()
        others = OtherLoad(lambda: own_cpu_seconds() + float(engine.call("cpu_seconds")))
        served: list[Served] = []
        for batch in batches:
            served.append(engine.call("serve", batch, work.max_tokens))
            progress.update()
        other_load = others.cores()
        counters = engine.call("kvtier_stats").cpu if config != "baseline" else None
    if counters is not None and counters.hit_chunks:  # every prompt was new: nothing to find
        raise RuntimeError(f"kvtier bench concurrency: invalid run, kvtier hits: {counters}")
    return {
        "config": config,
        "round_s": [round(s.seconds, 4) for s in served],
        "drain_s": [round(s.drain_seconds, 4) for s in served],
        "other_load_cores": other_load,
        "kvtier_cpu": None if counters is None else {
            "stored_chunks": counters.stored_chunks, "hit_chunks": counters.hit_chunks,
            "skipped_stores": counters.skipped_stores, "evicted_chunks": counters.evicted_chunks,
        },
    }  # fmt: skip


def summarize(processes: list[dict[str, Any]], work: Rounds) -> dict[str, Any]:
    """Each process's median round (rounds after the warm-up), tokens/s, and the pairs' ratios
    kvtier / baseline (baseline's median time / kvtier's; ``filled_ratios``: the filled host
    tier's, with ``filled_host``)."""
    tokens = work.prompts * (work.tokens + work.max_tokens)
    for process in processes:
        counted = process["round_s"][work.warmup_rounds :]
        process["median_round_s"] = round(median(counted), 4)
        process["tokens_per_s"] = round(tokens / median(counted), 1)
    ratios: dict[str, list[float]] = {config: [] for config in work.configs[1:]}
    for pair in range(work.pairs):
        times = {p["config"]: p["median_round_s"] for p in processes if p["pair"] == pair}
        for config, pair_ratios in ratios.items():
            pair_ratios.append(round(times["baseline"] / times[config], 4))
    filled = {"filled_ratios": ratios[FILLED]} if FILLED in ratios else {}
    return {**asdict(work), "processes": processes, "ratios": ratios["kvtier"], **filled}
