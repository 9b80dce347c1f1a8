"""Timing requests in an in-process vLLM engine.

Sample, Served              what a timed request and a served batch measured
timed(llm, prompt)         one ``max_tokens=1`` request: seconds, engine steps, cached tokens
served(llm, prompts, ...)  a batch served together (and, with kvtier, its stores drained)
reset_prefix_cache(llm)    empty the engine's own prefix cache, or raise
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.inputs import TokensPrompt


class Sample(NamedTuple):
    seconds: float  # wall clock around ``LLM.generate`` (or around a request to a server)
    steps: int = 0  # engine-core steps the request took (polls while a load is in flight too)
    forwards: int = 0  # of those, steps that ran the model
    cached_tokens: int = 0  # prompt tokens the engine did not compute: its own hit + a connector's


class Served(NamedTuple):
    seconds: float  # until every request finished and, with kvtier, every store drained
    drain_seconds: float  # of which: draining kvtier's stores after the last request finished


def timed(llm: LLM, prompt: list[int]) -> Sample:
    """One ``max_tokens=1`` request (prefill + first token), alone in the engine."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1)
    request: TokensPrompt = {"prompt_token_ids": prompt}
    with _StepCounter(llm) as counter:
        started = time.perf_counter()
        outputs = llm.generate([request], params, use_tqdm=False)
        seconds = time.perf_counter() - started
    return Sample(seconds, counter.steps, counter.forwards, outputs[0].num_cached_tokens or 0)


def served(llm: LLM, prompts: list[list[int]], max_tokens: int, drain: bool) -> Served:
    """Serve ``prompts`` together, ``max_tokens`` each; with ``drain``, also wait for kvtier's
    stores (``kvtier.vllm.settle``)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    requests: list[TokensPrompt] = [{"prompt_token_ids": p} for p in prompts]
    started = time.perf_counter()
    llm.generate(requests, params, use_tqdm=False)
    finished = time.perf_counter()
    if drain:
        from kvtier.vllm import settle

        settle(llm)
    ended = time.perf_counter()
    return Served(ended - started, ended - finished)


def reset_prefix_cache(llm: LLM) -> None:
    """Empty the engine's own prefix cache; ``RuntimeError`` when vLLM refuses (blocks in use)."""
    if not llm.reset_prefix_cache():
        raise RuntimeError("kvtier bench ttft: reset_prefix_cache() refused (blocks in use)")


class _StepCounter:
    """Counts the engine-core steps of an in-process engine while entered (wraps ``step_fn``)."""

    def __init__(self, llm: LLM) -> None:
        client: Any = llm.llm_engine.engine_core  # vLLM's InprocClient
        self.core = client.engine_core
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
