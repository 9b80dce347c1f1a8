"""``kvtier bench concurrency``, rounds: many never-seen prompts at once, with kvtier / without.

Each pair starts its engine processes together (``ttft.process.EngineProcess``, one engine each,
idle while another serves): without a connector (``baseline``), with kvtier (a host tier only,
roomy), and, with ``filled_host``, kvtier with a host tier that small (``kvtier-filled``: filled by
the warm-up round, so every later store reuses memory an eviction freed, as in an engine that
has run a while), and with ``null``, vLLM with a connector that does nothing
(``null_connector.py``: what vLLM itself costs an engine with any connector, the bound no
connector beats). Every round is ``prompts`` prompts never seen (fresh each round; the same ones
for every engine) of ``tokens`` tokens, given to the engine at once, ``max_tokens`` each; with
kvtier a round counts until its stores drained. Round ``r`` is served by every engine one right
after the other, the order rotated each round, so a drift of the machine reaches all engines
alike.

A round's ratio is the baseline's time over the engine's (its throughput, relative); a pair's
is the median of its rounds' after the first ``warmup_rounds`` (each process's median round is
kept too). Beside it, what the ratio cannot tell from the machine's noise: each connector's own
time on its engine's thread per round (``common.connector_clock``), kvtier's and the do-nothing
connector's, as a share of the round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kvtier.apps.bench.common.engine_env import in_process_env
from kvtier.apps.bench.common.timing import OtherLoad, median, own_cpu_seconds
from kvtier.apps.bench.ttft.process import EngineProcess
from kvtier.apps.bench.ttft.setup import Setup, Workload
from kvtier.apps.bench.ttft.tier import host_tier
from kvtier.apps.bench.ttft.timing import Served
from kvtier.apps.prompts import make_prompt

CONFIGS = ("baseline", "kvtier")  # A, B
FILLED = "kvtier-filled"  # C, with ``Rounds.filled_host``
NULL = "null"  # D, with ``Rounds.null``: vLLM with a connector that does nothing


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
    null: bool = False  # a fourth: vLLM with a connector that does nothing (the bound)

    @property
    def configs(self) -> tuple[str, ...]:
        filled = (FILLED,) if self.filled_host is not None else ()
        return CONFIGS + filled + ((NULL,) if self.null else ())

    def __post_init__(self) -> None:
        if self.rounds <= self.warmup_rounds or self.pairs < 1:
            raise ValueError(
                f"kvtier bench concurrency: rounds > warmup_rounds, pairs >= 1: {self}"
            )


def engine_args(model: Path, dtype: str, work: Rounds, config: str) -> dict[str, Any]:
    """``vllm.LLM``'s arguments, as ``kvtier bench ttft``'s engines, ``max_num_seqs`` added;
    kvtier's host tier as ``kvtier bench ttft``'s (``ttft.tier.host_tier``), or
    ``filled_host`` for ``kvtier-filled``."""
    workload = Workload(prompts=work.prompts, tokens=work.tokens, max_tokens=work.max_tokens)
    setup = Setup(model, dtype, (work.tokens + work.max_tokens,), 1, workload)
    transfer: dict[str, Any] | None = None
    if config == NULL:
        from kvtier.apps.bench.concurrency.null_connector import CONFIG

        transfer = dict(CONFIG)
    elif config == FILLED and work.filled_host is not None:
        transfer = host_tier(work.chunk_tokens, work.filled_host).transfer()
    elif config != CONFIGS[0]:
        transfer = host_tier(work.chunk_tokens).transfer()
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
            records = _pair(model, dtype, work, batches, progress)
            processes += [{"pair": pair, **records[config]} for config in work.configs]
    return summarize(processes, work)


def _seed(pair: int, round_: int, prompt: int) -> int:
    return 5_000_011 + pair * 1_000_003 + round_ * 10_007 + prompt


def _pair(
    model: Path, dtype: str, work: Rounds, batches: list[list[list[int]]], progress: tqdm[Any]
) -> dict[str, dict[str, Any]]:
    """One pair: every configuration's engine process alive together, each serving every round,
    the rounds interleaved (round ``r`` by each engine in turn, the order rotated by ``r``);
    per configuration its times, drains, load and counters."""
    engines: dict[str, EngineProcess] = {}
    served: dict[str, list[Served]] = {config: [] for config in work.configs}
    clocked = [config for config in work.configs if config != CONFIGS[0]]  # with a connector
    connector_s: dict[str, list[float]] = {config: [] for config in clocked}
    try:
        for config in work.configs:  # one at a time: each checks the memory free as it starts
            engines[config] = EngineProcess(config, engine_args(model, dtype, work, config),
                                            in_process_env())  # fmt: skip
            engines[config].wait_ready()
            if config in clocked:
                engines[config].connector_seconds()  # its clock starts
        others = OtherLoad(
            lambda: own_cpu_seconds() + sum(e.cpu_seconds() for e in engines.values())
        )
        for r, batch in enumerate(batches):
            order = work.configs[r % len(work.configs) :] + work.configs[: r % len(work.configs)]
            for config in order:
                engine = engines[config]
                before = engine.connector_seconds() if config in clocked else 0.0
                served[config].append(engine.serve(batch, work.max_tokens))
                if config in clocked:
                    connector_s[config].append(engine.connector_seconds() - before)
                progress.update()
        other_load = others.cores()
        counters = {config: engines[config].kvtier_stats().cpu
                    for config in work.configs if config in (CONFIGS[1], FILLED)}  # fmt: skip
    finally:
        for engine in engines.values():
            engine.close()
    for found in counters.values():
        if found.hit_chunks:  # every prompt was new: nothing to find
            raise RuntimeError(f"kvtier bench concurrency: invalid run, kvtier hits: {found}")
    return {
        config: {
            "config": config,
            "round_s": [round(s.seconds, 4) for s in served[config]],
            "drain_s": [round(s.drain_seconds, 4) for s in served[config]],
            "connector_s": [round(s, 5) for s in connector_s[config]] if config in clocked
            else None,
            "other_load_cores": other_load,
            "kvtier_cpu": None if config not in counters else {
                "stored_chunks": counters[config].stored_chunks,
                "hit_chunks": counters[config].hit_chunks,
                "skipped_stores": counters[config].skipped_stores,
                "evicted_chunks": counters[config].evicted_chunks,
            },
        }
        for config in work.configs
    }  # fmt: skip


def summarize(processes: list[dict[str, Any]], work: Rounds) -> dict[str, Any]:
    """Each process's median round (rounds after the warm-up) and tokens/s; each pair's ratio
    per configuration: the median over its rounds of the baseline's time / the engine's
    (``ratios``: kvtier's; ``filled_ratios``, ``null_ratios`` with those processes); and each
    process with a connector, the median over its rounds of the time its engine's thread spent
    in the connector's calls / the round (``connector_shares``: per configuration, per pair)."""
    tokens = work.prompts * (work.tokens + work.max_tokens)
    shares: dict[str, list[float]] = {}
    for process in processes:
        counted = process["round_s"][work.warmup_rounds :]
        process["median_round_s"] = round(median(counted), 4)
        process["tokens_per_s"] = round(tokens / median(counted), 1)
        if process.get("connector_s"):
            spent = process["connector_s"][work.warmup_rounds :]
            share = round(median([c / r for c, r in zip(spent, counted, strict=True)]), 4)
            process["connector_share"] = share
            shares.setdefault(process["config"], []).append(share)
    ratios: dict[str, list[float]] = {config: [] for config in work.configs[1:]}
    for pair in range(work.pairs):
        rounds = {p["config"]: p["round_s"][work.warmup_rounds :]
                  for p in processes if p["pair"] == pair}  # fmt: skip
        for config, pair_ratios in ratios.items():
            per_round = [a / b for a, b in zip(rounds["baseline"], rounds[config], strict=True)]
            pair_ratios.append(round(median(per_round), 4))
    extra = {f"{name}_ratios": ratios[config] for name, config in (("filled", FILLED),
             ("null", NULL)) if config in ratios}  # fmt: skip
    return {**asdict(work), "processes": processes, "ratios": ratios["kvtier"], **extra,
            "connector_shares": shares}  # fmt: skip
