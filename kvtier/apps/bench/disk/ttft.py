"""``kvtier bench disk``, TTFT part: a prompt served from files by a restarted engine, in vLLM.

One in-process engine at a time (``ttft.engine.on_engine``); one ``max_tokens=1`` request at a
time; a fresh prompt of ``tokens`` tokens per repetition. Phases, in order:

    recompute    no connector, the prompt never seen
    kvtier_disk  the TTFT driver on a disk tier (``ttft.tier.disk_tier``): engine A serves every
                 prompt and settles (an idle engine writes its chunks to disk); engine B (an
                 empty host tier, the same directory) times each prompt, the page cache of the
                 tier's files dropped first; kvtier's disk counters must show >= 90% of the
                 prompt's chunks loaded from disk, else the run raises
    example      vLLM's ExampleConnector (safetensors, one folder per prompt): the same two
                 engines, the cache dropped the same way; each prompt's folder must be back in
                 the page cache after its request (``mincore``): read from its files, else the
                 run raises

Each engine first serves a warm-up prompt (first-call costs, discarded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvtier.apps.bench.common import page_cache
from kvtier.apps.bench.common.connector import example_config
from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.ttft.driver import Engine, Engines, Passes, recompute, run_phases
from kvtier.apps.bench.ttft.driver import tier_engines as kvtier_engines
from kvtier.apps.bench.ttft.results import TTFTResults
from kvtier.apps.bench.ttft.setup import Setup
from kvtier.apps.bench.ttft.tier import BELOW_HOST_BYTES, disk_tier
from kvtier.apps.models import model_path
from kvtier.apps.prompts import make_prompt

WARMUP_TOKENS = 512
MEASURES = ("recompute", "kvtier_disk", "example")


def measure(work: Path, tokens: int, repeats: int, model: str | Path, dtype: str) -> dict[str, Any]:
    """TTFT per configuration, in ``work`` (kvtier's tier and ExampleConnector's files).
    ``RuntimeError`` when a hit did not come from its files."""
    model_dir = model if isinstance(model, Path) else model_path(model)
    setup = Setup(model_dir, dtype, (tokens,), repeats)
    tier = disk_tier(work / "kvtier")
    prompts = [
        make_prompt(model_dir, tokens, seed=rep * 100_003 + tokens) for rep in range(repeats)
    ]
    warmup = make_prompt(model_dir, min(tokens, WARMUP_TOKENS), seed=7)
    results, example_checks = TTFTResults(), list[dict[str, Any]]()
    phases: dict[str, Engines] = {
        "recompute": [(None, recompute(warmup, prompts, results))],
        "kvtier_disk": kvtier_engines(tier, warmup, prompts, results, Passes("kvtier_disk")),
        "example": _example(work / "example", warmup, prompts, results, example_checks),
    }
    run_phases(setup, phases, results, "bench disk: TTFT")
    checks = {"kvtier_disk": [c.as_json() for c in results.check_list("kvtier_disk")],
              "example": example_checks}  # fmt: skip
    return _summary(setup, tier.chunk_tokens or 1, results, checks)


def _example(
    storage: Path,
    warmup: list[int],
    prompts: list[list[int]],
    results: TTFTResults,
    checks: list[dict[str, Any]],
) -> Engines:
    """ExampleConnector's two engines: A saves every prompt, B reads each back from its files."""

    def saves(engine: Engine) -> None:
        for prompt in [warmup, *prompts]:
            saved = _folders(storage)
            sample = engine.ttft(prompt)
            if prompt is not warmup:
                results.record("example_first", len(prompt), sample)
            if len(_folders(storage) - saved) != 1:  # one folder per prompt, every layer's file
                raise RuntimeError("kvtier bench disk: ExampleConnector did not save a prompt")

    def reads(engine: Engine) -> None:
        engine.ttft(warmup)
        for prompt in prompts:
            before = page_cache.drop_tree(storage)
            results.record("example", len(prompt), engine.ttft(prompt))
            read = [f for f in _folders(storage)
                    if page_cache.resident(page_cache.files(f)) > 0.9]  # fmt: skip
            check = {"resident_before": round(before, 4), "folders_read": len(read)}
            checks.append(check)
            if len(read) != 1:  # its own folder, and only it, read back from the files
                raise RuntimeError(f"kvtier bench disk: invalid run, ExampleConnector read {check}")

    config = example_config(storage)
    return [(config, saves), (config, reads)]


def _folders(storage: Path) -> set[Path]:
    return {p for p in storage.iterdir() if p.is_dir()} if storage.exists() else set()


def _summary(
    setup: Setup, chunk_tokens: int, results: TTFTResults, checks: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    tokens = setup.lengths[0]
    s = {m: results.median_s(m, tokens) for m in MEASURES}
    taken = [m for m in dict.fromkeys(m for m, _ in results.samples)]
    steps = {m: [x.steps for x in results.samples[m, tokens]] for m in taken}
    return {
        "model": setup.model.name, "dtype": setup.dtype, "prompt_tokens": tokens,
        "repeats": setup.repeats, "chunk_tokens": chunk_tokens, "host_bytes": BELOW_HOST_BYTES,
        **{f"{m}_s": round(v, 4) for m, v in s.items()},
        "kvtier_disk_over_recompute": round(s["kvtier_disk"] / s["recompute"], 3),
        "example_over_recompute": round(s["example"] / s["recompute"], 3),
        "kvtier_disk_over_example": round(s["kvtier_disk"] / s["example"], 3),
        "kvtier_disk_load_s": round(median([c["load_s"] for c in checks["kvtier_disk"]]), 4),
        "kvtier_disk_steps": median([float(n) for n in steps["kvtier_disk"]]),
        "kvtier_disk_verified": True,  # else ``ttft.driver.load`` raised
        "example_verified": True,  # else the Example engine's reads raised
        "checks": checks,
        "steps": steps,
        "samples_s": {m: [round(v, 4) for v in results.seconds(m, tokens)] for m in taken},
        "other_load_cores": results.other_load,
    }  # fmt: skip
