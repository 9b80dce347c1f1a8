"""Timing requests in an in-process vLLM engine, and how busy the machine was meanwhile.

timed(llm, prompt)         one ``max_tokens=1`` request: seconds, engine steps, cached tokens
served(llm, prompts, ...)  a batch served together (and, with kvtier, its stores drained)
reset_prefix_cache(llm)    empty the engine's own prefix cache, or raise
OtherLoad                  CPU cores taken by other work since construction
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.inputs import TokensPrompt


class Sample(NamedTuple):
    seconds: float  # wall clock around ``LLM.generate``
    steps: int  # engine-core steps the request took (polls while a load is in flight included)
    forwards: int  # of those, steps that ran the model
    cached_tokens: int  # prompt tokens the engine did not compute: its own hit + a connector's


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


def own_cpu_seconds() -> float:
    """CPU seconds this process used (user + system)."""
    own = os.times()
    return own.user + own.system


class OtherLoad:
    """CPU time taken on this machine by anything but ``own`` (default: this process) — other
    processes, hypervisor steal — since construction, in cores (Linux ``/proc/stat``; None
    elsewhere). Above ~0.1 on a 2-core machine the timings are disturbed.

    ``own`` returns the CPU seconds of the work being measured (e.g. this process and the
    engine processes it drives)."""

    def __init__(self, own: Callable[[], float] = own_cpu_seconds) -> None:
        self.own = own
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        """(machine busy seconds, own CPU seconds, monotonic time)."""
        try:
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
        except OSError:
            return None
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        return busy / os.sysconf("SC_CLK_TCK"), self.own(), time.monotonic()

    def cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        busy, own, wall = (e - s for s, e in zip(self.start, end, strict=True))
        return round(max(0.0, busy - own) / wall, 2)
