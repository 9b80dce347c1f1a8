"""Real vLLM runs on the CPU with the tiny local model and no connector."""

from __future__ import annotations

import gc
from typing import Any

import vllm
from vllm import LLM, SamplingParams

PROMPTS = [
    "The quick brown fox jumps over the lazy dog near the river.",
    "Alice carefully opened the old library door this morning and",
]


def test_greedy_generation_is_deterministic(llm_kwargs: dict[str, Any]) -> None:
    llm = LLM(**llm_kwargs)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        first = [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params)]
        second = [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params)]
    finally:
        del llm
        gc.collect()
        vllm.distributed.cleanup_dist_env_and_memory()
    assert [len(ids) for ids in first] == [8, 8]
    assert first == second
