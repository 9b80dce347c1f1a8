"""kvtier across processes and ranks: TP=2 and PP=2 (vLLM's default multi-process mode with one
rank is ``kvtier serve``'s: ``test_serve.py``).

The two TP=2 tests share one kvtier engine (``tp2_engine``), started after the others'
engines are gone, and one reference engine (``_tp2_references``).

Each worker rank moves its own share of every chunk; a load or store is done only when all ranks
reported it. These tests read every rank's own counters (``collective_rpc``) to show each rank
loaded from kvtier, and compare outputs with the same parallel layout without a connector.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from disk_helpers import chunk_files
from harness import PARALLEL_ENV, engine, full_chunks, generate, kvtier_transfer, prompts
from vllm.config import CompilationMode

from kvtier.vllm import rank_counters

LENGTHS = [300, 200, 450]
CHUNK = 64
TP2: dict[str, Any] = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


@pytest.fixture
def multiprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    for name, value in PARALLEL_ENV.items():
        monkeypatch.setenv(name, value)


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


def _reset_and_regenerate(
    llm: Any, token_prompts: list[list[int]], expected: Any, ranks: int
) -> None:
    assert generate(llm, token_prompts) == expected
    _reset_when_drained(llm)
    assert generate(llm, token_prompts) == expected
    _loads_on_every_rank(llm, token_prompts, ranks)


def test_pipeline_parallel_two_ranks(tiny_model: Path, reference: Any, multiprocess: None) -> None:
    """Each rank computes its own layers as one engine computes them: the reference is the
    in-process one (started in seconds)."""
    # PP on the CPU needs a compilation mode instead of enforce_eager (VLLM_CPU.md: only then
    # does the CPU runner warm up, allocating the later rank's buffer). Naming the mode keeps the
    # eager backend, where the default mode has the CPU platform swap in inductor (its first
    # compile on a fresh machine builds a precompiled header); PARALLEL_ENV skips the trace.
    parallel: dict[str, Any] = {
        "pipeline_parallel_size": 2, "distributed_executor_backend": "mp", "enforce_eager": False,
        "compilation_config": {"mode": CompilationMode.DYNAMO_TRACE_ONCE, "backend": "eager"},
    }  # fmt: skip
    token_prompts = prompts(tiny_model, LENGTHS, seed=61)
    expected = reference(tiny_model, token_prompts)
    transfer = kvtier_transfer(block_size=CHUNK)
    with engine(tiny_model, kv_transfer_config=transfer, **parallel) as llm:
        _reset_and_regenerate(llm, token_prompts, expected, 2)


class _SharedEngine:
    """A TP=2 engine with kvtier and a disk tier, started at first use and closed once."""

    def __init__(self, model: Path, directory: Path) -> None:
        self.directory = directory
        self.transfer = kvtier_transfer(block_size=CHUNK, disk={"path": str(directory),
                                                                "bytes": "256MiB"})  # fmt: skip
        self._model = model
        self._stack = ExitStack()
        self._llm: Any = None

    @property
    def llm(self) -> Any:
        if self._llm is None:
            self._llm = self._stack.enter_context(
                engine(self._model, kv_transfer_config=self.transfer, **TP2)
            )
        return self._llm

    def close(self) -> None:
        """Shut the engine down (its ranks write what the disk lacks); idempotent."""
        self._stack.close()


@pytest.fixture(scope="module")
def tp2_engine(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_SharedEngine]:
    """One TP=2 kvtier engine for both TP=2 tests (a multi-process engine takes ~30 s to start):
    the first regenerates on it, the second shuts it down and restarts from its disk tier."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        for name, value in PARALLEL_ENV.items():
            patch.setenv(name, value)
        shared = _SharedEngine(tiny_model, tmp_path_factory.mktemp("tp2") / "tier")
        try:
            yield shared
        finally:
            shared.close()


def test_tensor_parallel_two_ranks(
    tiny_model: Path, reference: Any, multiprocess: None, tp2_engine: _SharedEngine
) -> None:
    token_prompts = prompts(tiny_model, LENGTHS, seed=61)
    expected = _tp2_references(tiny_model, reference)[0]  # seed 61's
    _reset_and_regenerate(tp2_engine.llm, token_prompts, expected, 2)


def test_tensor_parallel_restarts_from_disk(
    tiny_model: Path, reference: Any, multiprocess: None, tp2_engine: _SharedEngine
) -> None:
    """TP=2: each rank writes its own share of every chunk (at idle or at shutdown), and a new
    engine loads every rank's share back from disk."""
    token_prompts = prompts(tiny_model, LENGTHS, seed=62)
    expected = _tp2_references(tiny_model, reference)[1]  # seed 62's
    assert generate(tp2_engine.llm, token_prompts) == expected
    tp2_engine.close()
    files = chunk_files(tp2_engine.directory)
    assert {f.name.split(".")[-2] for f in files} == {"0", "1"}  # both ranks' shares
    assert len(files) >= 2 * full_chunks(token_prompts, CHUNK)
    with engine(tiny_model, kv_transfer_config=tp2_engine.transfer, **TP2) as llm:
        assert generate(llm, token_prompts) == expected
        counters = llm.collective_rpc(rank_counters)
    assert len(counters) == 2
    for rank in counters:  # a new engine: every load came from disk
        assert rank["loads"] > 0 and rank["failed_loads"] == 0 and rank["bad_chunks"] == 0
    assert len({rank["loaded_bytes"] for rank in counters}) == 1, counters
