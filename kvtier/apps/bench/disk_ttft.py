"""``kvtier bench disk``, TTFT part: a prompt served from files by a restarted engine, in vLLM.

One in-process engine at a time (``ttft_engine.on_engine``); one ``max_tokens=1`` request at a
time, timed around ``LLM.generate``; a fresh prompt of ``tokens`` tokens per repetition:

    recompute    no connector, the prompt never seen
    kvtier disk  engine A (kvtier with a disk tier) serves every prompt and drains: an idle engine
                 writes its chunks to disk (write-back). A is torn down; engine B (an empty host
                 tier, the same directory) times each prompt, the page cache of the tier's files
                 dropped first. kvtier's disk counters must show >= 90% of the prompt's chunks
                 loaded from disk, else the run raises
    example      vLLM's ExampleConnector (safetensors, one folder per prompt): the same two
                 engines, the cache dropped the same way; each prompt's folder must be back in
                 the page cache after its request (``mincore``): read from its files, else the
                 run raises

Each engine B first serves a warm-up prompt that engine A stored (first-call costs, discarded).
"""

from __future__ import annotations

import copy
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

import kvtier
from kvtier.apps.bench import page_cache
from kvtier.apps.bench.report import median
from kvtier.apps.bench.ttft_engine import on_engine
from kvtier.apps.bench.ttft_setup import (
    CHUNK_TOKENS,
    ENGINE_ENV,
    ENGINE_ENV_DEFAULTS,
    HIT_FRACTION,
    Setup,
    Workload,
)
from kvtier.apps.bench.ttft_timing import OtherLoad, timed
from kvtier.apps.models import model_path
from kvtier.apps.prompts import make_prompt

if TYPE_CHECKING:
    from vllm import LLM

__all__ = ["OtherLoad", "measure"]

HOST_BYTES, DISK_BYTES = "1GiB", "4GiB"  # kvtier's tiers in the TTFT engines
WARMUP_TOKENS = 512
MEASURES = ("recompute", "kvtier_disk", "example")


@dataclass(frozen=True)
class _DiskSetup(Setup):
    tier: Path  # kvtier's disk tier (``storage`` is ExampleConnector's)

    def transfer(self, config: str) -> dict[str, Any] | None:
        if config != "kvtier_disk":
            return super().transfer(config)
        disk = {"path": str(self.tier), "bytes": DISK_BYTES}
        extra = {"cpu_bytes_to_use": HOST_BYTES, "block_size": CHUNK_TOKENS, "disk": disk}
        return {"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm",
                "kv_role": "kv_both", "kv_connector_extra_config": extra}  # fmt: skip


@dataclass
class _Results:
    seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    steps: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    checks: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    other_load: dict[str, float | None] = field(default_factory=dict)  # cores, per phase

    def record(self, measure: str, llm: LLM, prompt: list[int]) -> None:
        sample = timed(llm, prompt)
        self.seconds[measure].append(sample.seconds)
        self.steps[measure].append(sample.steps)


def measure(work: Path, tokens: int, repeats: int, model: str | Path, dtype: str) -> dict[str, Any]:
    """TTFT per configuration, in ``work`` (kvtier's tier and ExampleConnector's files).

    Sets the engine environment (in-process engines) for the whole process. Raises
    ``RuntimeError`` when a hit did not come from its files.
    """
    for name, value in ENGINE_ENV.items():
        os.environ[name] = value
    for name, value in ENGINE_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    model_dir = model if isinstance(model, Path) else model_path(model)
    setup = _DiskSetup(model_dir, dtype, (tokens,), repeats, Workload(), work / "example",
                       work / "kvtier")  # fmt: skip
    prompts = [
        make_prompt(model_dir, tokens, seed=rep * 100_003 + tokens) for rep in range(repeats)
    ]
    warmup = make_prompt(model_dir, min(tokens, WARMUP_TOKENS), seed=7)
    results = _Results()
    phases: dict[str, list[tuple[str, Callable[[LLM], object]]]] = {  # engines, in order
        "recompute": [("baseline", partial(_recompute, warmup, prompts, results))],
        "kvtier_disk": [
            ("kvtier_disk", partial(_kvtier_store, [warmup, *prompts], results)),
            ("kvtier_disk", partial(_kvtier_load, setup.tier, warmup, prompts, results)),
        ],
        "example": [
            ("example", partial(_example_store, setup.storage, [warmup, *prompts], results)),
            ("example", partial(_example_load, setup.storage, warmup, prompts, results)),
        ],
    }
    total = sum(len(engines) for engines in phases.values())
    with tqdm(total=total, desc="bench disk: TTFT", unit="engine") as progress:
        for phase, engines in phases.items():
            others = OtherLoad()
            for config, body in engines:
                on_engine(setup, config, body)
                progress.update()
            results.other_load[phase] = others.cores()
    return _summary(setup, results)


def _recompute(warmup: list[int], prompts: list[list[int]], results: _Results, llm: LLM) -> None:
    timed(llm, warmup)
    for prompt in prompts:
        results.record("recompute", llm, prompt)


def _kvtier_store(prompts: list[list[int]], results: _Results, llm: LLM) -> None:
    from kvtier.vllm import settle

    for prompt in prompts:
        results.record("kvtier_first", llm, prompt)
        settle(llm)  # the engine is idle: its dirty chunks go to disk
    stored = kvtier.stats(llm).tiers["disk"].stored_chunks
    wanted = sum(len(p) // CHUNK_TOKENS for p in prompts)
    if stored < wanted:
        raise RuntimeError(f"kvtier bench disk: engine A wrote {stored} of {wanted} chunks")


def _kvtier_load(
    tier: Path, warmup: list[int], prompts: list[list[int]], results: _Results, llm: LLM
) -> None:
    from kvtier.vllm import settle

    timed(llm, warmup)
    settle(llm)
    for prompt in prompts:
        files = _dropped(tier)
        before = copy.deepcopy(kvtier.stats(llm))  # the engine's counters change in place
        results.record("kvtier_disk", llm, prompt)
        settle(llm)
        after = kvtier.stats(llm)
        disk, was = after.tiers["disk"], before.tiers["disk"]
        check = {
            "full_chunks": len(prompt) // CHUNK_TOKENS,
            "disk_hit_chunks": disk.hit_chunks - was.hit_chunks,
            "disk_loaded_chunks": disk.loaded_chunks - was.loaded_chunks,
            "cpu_hit_chunks": after.cpu.hit_chunks - before.cpu.hit_chunks,
            "bad_chunks": disk.bad_chunks - was.bad_chunks,
            "failed_loads": disk.failed_loads - was.failed_loads,
            "load_s": round(disk.load_seconds - was.load_seconds, 4),
            "resident_before": round(files, 4),
        }
        results.checks["kvtier_disk"].append(check)
        wanted = HIT_FRACTION * check["full_chunks"]
        if check["disk_loaded_chunks"] < wanted or check["bad_chunks"] or check["failed_loads"]:
            raise RuntimeError(f"kvtier bench disk: invalid run, not a hit from disk: {check}")


def _example_store(storage: Path, prompts: list[list[int]], results: _Results, llm: LLM) -> None:
    for prompt in prompts:
        saved = _folders(storage)
        results.record("example_first", llm, prompt)
        if len(_folders(storage) - saved) != 1:  # one folder per prompt, every layer's file
            raise RuntimeError("kvtier bench disk: ExampleConnector did not save a prompt")


def _example_load(
    storage: Path, warmup: list[int], prompts: list[list[int]], results: _Results, llm: LLM
) -> None:
    timed(llm, warmup)
    for prompt in prompts:
        before = _dropped(storage)
        results.record("example", llm, prompt)
        read = [f for f in _folders(storage) if page_cache.resident(page_cache.files(f)) > 0.9]
        check = {"resident_before": round(before, 4), "folders_read": len(read)}
        results.checks["example"].append(check)
        if len(read) != 1:  # its own folder, and only it, read back from the files
            raise RuntimeError(f"kvtier bench disk: invalid run, ExampleConnector read {check}")


def _dropped(root: Path) -> float:
    """Drop the page cache of every file under ``root``; what stays resident (~0)."""
    os.sync()
    files = page_cache.files(root)
    page_cache.drop(files)
    return page_cache.resident(files)


def _folders(storage: Path) -> set[Path]:
    return {p for p in storage.iterdir() if p.is_dir()} if storage.exists() else set()


def _summary(setup: _DiskSetup, results: _Results) -> dict[str, Any]:
    s = {m: median(results.seconds[m]) for m in MEASURES}
    load_s = median([check["load_s"] for check in results.checks["kvtier_disk"]])
    return {
        "model": setup.model.name, "dtype": setup.dtype, "prompt_tokens": setup.lengths[0],
        "repeats": setup.repeats, "chunk_tokens": CHUNK_TOKENS, "host_bytes": HOST_BYTES,
        **{f"{m}_s": round(v, 4) for m, v in s.items()},
        "kvtier_disk_over_recompute": round(s["kvtier_disk"] / s["recompute"], 3),
        "example_over_recompute": round(s["example"] / s["recompute"], 3),
        "kvtier_disk_over_example": round(s["kvtier_disk"] / s["example"], 3),
        "kvtier_disk_load_s": round(load_s, 4),
        "kvtier_disk_steps": median([float(n) for n in results.steps["kvtier_disk"]]),
        "kvtier_disk_verified": True,  # else _kvtier_load raised
        "example_verified": True,  # else _example_load raised
        "checks": dict(results.checks),
        "steps": dict(results.steps),
        "samples_s": {m: [round(v, 4) for v in values] for m, values in results.seconds.items()},
        "other_load_cores": results.other_load,
    }  # fmt: skip
