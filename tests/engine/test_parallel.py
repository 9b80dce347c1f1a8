"""kvtier across processes and ranks: the default multi-process engine, TP=2 and PP=2.

Each worker rank moves its own share of every chunk; a load or store is done only when all ranks
reported it. These tests read every rank's own counters (``collective_rpc``) to show each rank
loaded from kvtier, and compare outputs with the same parallel layout without a connector.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from disk_helpers import chunk_files
from harness import engine, full_chunks, generate, kvtier_transfer, prompts

from kvtier.vllm import rank_counters

LENGTHS = [300, 200, 450]
CHUNK = 64
TP2: dict[str, Any] = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


@pytest.fixture
def multiprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")  # one core per rank (VLLM_CPU.md)


def _reset_when_drained(llm: Any) -> None:
    """reset_prefix_cache() refuses while finished requests still hold blocks for their stores;
    the engine process keeps stepping until they drained, so ask until it succeeds."""
    for _ in range(10_000):
        if llm.reset_prefix_cache():
            return
    raise AssertionError("the engine's prefix cache could not be reset: blocks still held")


def _loads_on_every_rank(llm: Any, token_prompts: list[list[int]], ranks: int) -> None:
    counters = llm.collective_rpc(rank_counters)
    assert len(counters) == ranks
    expected = full_chunks(token_prompts, CHUNK)
    for rank in counters:
        assert rank["failed_loads"] == 0 and rank["failed_stores"] == 0
        assert rank["stores"] > 0 and rank["loads"] > 0
        assert rank["loaded_bytes"] > 0
    # every rank loaded the same share: the second pass came from kvtier on all of them
    assert len({rank["loaded_bytes"] for rank in counters}) == 1, counters
    assert expected > 0


def _tp2_references(model: Path, reference: Any) -> list[list[list[int]]]:
    """Both TP=2 tests' references (seeds 61 and 62) from one TP=2 engine without kvtier,
    whichever test asks first: a multi-process engine takes ~30 s to start."""
    sets = [(prompts(model, LENGTHS, seed=seed), 8) for seed in (61, 62)]
    outputs: list[list[list[int]]] = reference.many(model, sets, **TP2)
    return outputs


def _reset_and_regenerate(model: Path, reference: Any, ranks: int, **overrides: Any) -> None:
    token_prompts = prompts(model, LENGTHS, seed=61)
    if overrides == TP2:
        _tp2_references(model, reference)
    expected = reference(model, token_prompts, **overrides)
    with engine(model, kv_transfer_config=kvtier_transfer(block_size=CHUNK), **overrides) as llm:
        assert generate(llm, token_prompts) == expected
        _reset_when_drained(llm)
        assert generate(llm, token_prompts) == expected
        _loads_on_every_rank(llm, token_prompts, ranks)


def test_default_multiprocess_engine(
    tiny_model: Path, reference: Any, multiprocess: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's default mode: the scheduler half in the engine-core process, the worker half in
    its worker process; both import kvtier.vllm from the installed package."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    _reset_and_regenerate(tiny_model, reference, 1, distributed_executor_backend="mp")


def test_tensor_parallel_two_ranks(tiny_model: Path, reference: Any, multiprocess: None) -> None:
    _reset_and_regenerate(tiny_model, reference, 2, **TP2)


def test_pipeline_parallel_two_ranks(tiny_model: Path, reference: Any, multiprocess: None) -> None:
    # PP on the CPU needs compiled (eager-backend) graphs instead of enforce_eager (VLLM_CPU.md)
    _reset_and_regenerate(
        tiny_model,
        reference,
        2,
        pipeline_parallel_size=2,
        distributed_executor_backend="mp",
        enforce_eager=False,
        compilation_config={"backend": "eager"},
    )


def test_tensor_parallel_restarts_from_disk(
    tiny_model: Path,
    reference: Any,
    multiprocess: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """vLLM's default multi-process mode, TP=2: each rank writes its own share of every chunk
    (at idle or at shutdown), and a new engine loads every rank's share back from disk."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    token_prompts = prompts(tiny_model, LENGTHS, seed=62)
    parallel = TP2
    expected = _tp2_references(tiny_model, reference)[1]  # seed 62's
    disk = {"path": str(tmp_path / "tier"), "bytes": "256MiB"}
    transfer = kvtier_transfer(block_size=CHUNK, disk=disk)
    with engine(tiny_model, kv_transfer_config=transfer, **parallel) as llm:
        assert generate(llm, token_prompts) == expected
    files = chunk_files(tmp_path / "tier")
    assert {f.name.split(".")[-2] for f in files} == {"0", "1"}  # both ranks' shares
    assert len(files) >= 2 * full_chunks(token_prompts, CHUNK)
    with engine(tiny_model, kv_transfer_config=transfer, **parallel) as llm:
        assert generate(llm, token_prompts) == expected
        counters = llm.collective_rpc(rank_counters)
    assert len(counters) == 2
    for rank in counters:  # a new engine: every load came from disk
        assert rank["loads"] > 0 and rank["failed_loads"] == 0 and rank["bad_chunks"] == 0
    assert len({rank["loaded_bytes"] for rank in counters}) == 1, counters
