"""``kvtier bench concurrency``: what kvtier costs where it cannot help, at high concurrency.

Two parts, each a ratio over pairs:

    rounds (``rounds.py``)              512 never-seen 96-token prompts at once (the tiny model,
                                        ``max_num_seqs`` 512), 32 tokens out: throughput with
                                        kvtier / without, the engine processes of a pair alive
                                        together and each round served by each in turn; beside
                                        them kvtier with a small host tier, full after the warm-up
                                        (what kvtier costs once its host tier is filled), and vLLM
                                        with a connector that does nothing (the bound: what vLLM
                                        costs an engine with any connector); and what kvtier
                                        costs, measured where it is spent: the time the
                                        engine's thread spent in its calls, per round, as a
                                        share of the round (and the do-nothing connector's)
    long miss (``served.py``)           never-seen ~3,000-token documents, 2 in flight, through
                                        ``kvtier serve`` / vLLM's server alone (the bench model):
                                        the mean TTFT, kvtier / alone

Each ratio is printed as the median (min, max) over its pairs with its goal and PASS/FAIL (on the
median), and written to ``concurrency.json``, ``.md`` and ``.png`` (``report.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common.ratios import Goal, spread
from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.concurrency import report
from kvtier.apps.bench.concurrency.rounds import CONFIGS, NULL, Rounds, measure_rounds
from kvtier.apps.bench.concurrency.served import LongMiss, measure_served
from kvtier.apps.models import model_path

GOALS = {
    "rounds": Goal("0%-hit throughput at high concurrency, kvtier / none", 0.97, at_least=True),
    "rounds_filled": Goal(
        "the same, kvtier's host tier full (no first fill) / none", 0.97, at_least=True
    ),
    "long_miss": Goal("never-seen long prompt, served TTFT, kvtier / vLLM alone", 1.02),
}
BOUNDS = {  # beside the goals: what vLLM itself costs an engine with any connector
    "rounds_null": "the bound: vLLM with a connector that does nothing / none",
    "rounds_over_null": "kvtier / vLLM with a connector that does nothing",
    "rounds_own_time": "kvtier's calls: time on the engine's thread / the round",
    "rounds_null_own_time": "the do-nothing connector's calls: time on its thread / the round",
}
SHARES = {CONFIGS[1]: "rounds_own_time", NULL: "rounds_null_own_time"}  # rows of time shares
MODELS = {"rounds": ("tiny", "float32"), "long_miss": ("bench", "bfloat16")}
FILLED_HOST = "64MiB"  # the filled process's host tier: about 1.3 rounds of the full run's stores
ROUNDS, LONG_MISS = Rounds(filled_host=FILLED_HOST, null=True), LongMiss()  # the full run
QUICK = Rounds(prompts=8, tokens=64, max_tokens=4, rounds=3, pairs=1, max_num_seqs=8,
               chunk_tokens=32)  # a smoke run: seconds a round  # fmt: skip


def run(
    out_dir: Path,
    rounds: Rounds | None = ROUNDS,
    long_miss: LongMiss | None = LONG_MISS,
    models: dict[str, tuple[str | Path, str]] | None = None,
) -> dict[str, Any]:
    """Measure the parts not None, print their ratios, write ``concurrency.json`` and ``.png``
    under ``out_dir``; returns the JSON document. ``models``: (a local model's name or
    directory, dtype) per part, over ``MODELS``."""
    chosen = {**MODELS, **(models or {})}
    started = time.perf_counter()
    parts: dict[str, dict[str, Any]] = {}
    if rounds is not None:
        parts["rounds"] = measure_rounds(*_model(*chosen["rounds"]), rounds)
        if long_miss is not None:  # written now: a failing long miss loses no rounds
            _report(out_dir, parts, chosen, started, quiet=True)
    if long_miss is not None:
        parts["long_miss"] = measure_served(*_model(*chosen["long_miss"]), long_miss)
    return _report(out_dir, parts, chosen, started)


def _report(
    out_dir: Path,
    parts: dict[str, dict[str, Any]],
    chosen: dict[str, tuple[str | Path, str]],
    started: float,
    quiet: bool = False,
) -> dict[str, Any]:
    """The parts measured so far: their ratios written to ``concurrency.json`` and ``.png``
    (and printed, unless ``quiet``)."""
    ratios = {key: part["ratios"] for key, part in parts.items()}
    if "filled_ratios" in parts.get("rounds", {}):
        ratios["rounds_filled"] = parts["rounds"]["filled_ratios"]
    if "null_ratios" in parts.get("rounds", {}):
        null = parts["rounds"]["null_ratios"]
        ratios["rounds_null"] = null
        ratios["rounds_over_null"] = [round(k / n, 4) for k, n in zip(ratios["rounds"], null)]
    for config, shares in parts.get("rounds", {}).get("connector_shares", {}).items():
        if config in SHARES:
            ratios[SHARES[config]] = shares
    verdicts = [verdict(key, values) for key, values in ratios.items()]
    meta = {
        "models": {key: [str(chosen[key][0]), chosen[key][1]] for key in parts},
        "method": "rounds: engines alive together, each round served by each in turn, a pair's "
        "ratio the median of its rounds'; long miss: pairs one right after the other; PASS on "
        "the median",
        "all_pass": all(v["pass"] for v in verdicts if v["pass"] is not None),
        **parts,
        "runtime_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    document = write_json(out_dir / "concurrency.json", "concurrency", verdicts, report.summary,
                          **meta)  # fmt: skip
    report.plot(verdicts, ratios, GOALS, out_dir / "concurrency.png")
    for row in [] if quiet else verdicts:
        judged = "" if row["pass"] is None else (
            f"; goal {row['goal']}: {'PASS' if row['pass'] else 'FAIL'}")  # fmt: skip
        print(
            f"{row['label']}: {row['ratio']:.3f} (min {row['min']:.3f}, max {row['max']:.3f}; "
            f"{row['pairs']} pairs, spread {row['spread']:.1%}){judged}"
        )
    return document


def _model(name: str | Path, dtype: str) -> tuple[Path, str]:
    return (name if isinstance(name, Path) else model_path(name)), dtype


def verdict(key: str, ratios: list[float]) -> dict[str, Any]:
    """One part's row: the median of its pairs' ratios, min, max, spread, against its goal
    (a bound's row: no goal, ``pass`` None)."""
    goal, middle = GOALS.get(key), round(median(ratios), 3)
    return {
        "key": key, "label": BOUNDS[key] if goal is None else goal.label, "ratio": middle,
        "min": round(min(ratios), 3), "max": round(max(ratios), 3),
        "spread": round(spread(ratios), 3), "pairs": len(ratios),
        "goal": None if goal is None else goal.text,
        "pass": None if goal is None else goal.holds(middle),
    }  # fmt: skip
