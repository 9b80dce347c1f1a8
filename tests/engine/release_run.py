"""kvtier in a vLLM release's own scheduler, two ways (``scheduler_loop.Loop``). Run as a
script, in a process of its own, under whichever vLLM ``sys.path`` finds first: the installed
one, or a newer release's source (no compiled part of vLLM runs).

    python release_run.py MODEL_DIR WORK_DIR [hybrid] [pd | inflight]    last line: JSON

``hybrid``: the second layer a sliding window's (its own KV cache group), else both full
attention in one group. ``pd``: a prefill engine and a decode engine pulling from it over TCP
(kv_producer, kv_consumer), else one engine with host memory and a disk tier; ``inflight``:
that engine with vLLM 0.34's cap on asynchronous loads (``inflight_loads``).

One engine is small (``NUM_BLOCKS``) so that twelve requests at once preempt each other, and a
second round of prompts sharing the first round's prefixes is served from kvtier's host memory
and, past its 3 MiB, from its disk tier: synchronous and asynchronous loads, resumed requests,
stores of finished requests that hold their blocks until stored. A prefill engine's offers are
held until the decode engine pulled them. Outputs must equal ``expected``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler_loop import Loop, expected

ROUND_S = 120.0  # the longest a round may take: past it, requests are stuck


def run_together(loops: list[Loop], before: Callable[[], None] = lambda: None) -> None:
    """Steps each engine in turn (``before`` each round) until none holds a request (bounded in
    time)."""
    deadline = time.monotonic() + ROUND_S
    while any(loop.scheduler.requests for loop in loops):
        if time.monotonic() > deadline:
            left = [list(loop.scheduler.requests) for loop in loops]
            raise TimeoutError(f"requests left after {ROUND_S} s: {left}")
        before()
        for loop in loops:
            if loop.scheduler.requests:
                loop.step()


def prompts_of(seed: int) -> Callable[[int], list[int]]:
    rng = random.Random(seed)
    return lambda length: [rng.randrange(10, 490) for _ in range(length)]


def one_engine(model: str, work: Path, hybrid: bool) -> dict[str, Any]:
    loop = Loop(model, work, hybrid)
    prompt = prompts_of(0)
    # twelve at once: they preempt each other; then prompts sharing their first 256 tokens, the
    # last round's first: the newest in host memory, the oldest evicted to disk
    first = {f"a{i}": prompt(300 + 20 * (i % 8)) for i in range(12)}
    second = {f"b{i}": p[:256] + prompt(40) for i, p in reversed(list(enumerate(first.values())))}
    # and one asking for prompt logprobs: it reads no KV from outside the engine
    second["c0"] = first["a0"][:256] + prompt(40)
    for prompts in (first, second):
        for req_id, tokens in prompts.items():
            loop.add(req_id, tokens, prompt_logprobs=req_id == "c0")
        run_together([loop])
    prompts = {**first, **second}
    summary = loop.summary() | {"releases": loop.releases()}
    summary["outputs_match"] = all(loop.outputs[r] == expected(p) for r, p in prompts.items())
    loop.worker.shutdown()
    return summary


def inflight_loads(model: str, work: Path, hybrid: bool) -> dict[str, Any]:
    """vLLM 0.34's ``--max-num-inflight-kv-loads 1``, two requests running at most: a prompt
    whose prefix is on disk starts its load while the batch is full, and a load held at the cap
    holds up no other new request. Each status is read after the step that added it."""
    loop = Loop(model, work, hybrid, max_num_seqs=2, max_num_inflight_kv_loads=1,
                min_async_load_tokens=64)  # fmt: skip
    prompt = prompts_of(2)
    first = {f"a{i}": prompt(300 + 20 * (i % 8)) for i in range(12)}  # a0-a3: on disk only
    for req_id, tokens in first.items():
        loop.add(req_id, tokens)
    loop.settle()
    shares = {f"b{i}": first[f"a{i}"][:256] + prompt(40) for i in range(3)}
    prompts = {**first, **shares, "f0": prompt(100), "f1": prompt(100), "c": prompt(100)}
    loop.add("f0", prompts["f0"])
    loop.add("f1", prompts["f1"])
    for _ in range(8):  # both prefills take two steps at most (256 tokens a step)
        if len(loop.scheduler.running) == 2:
            break
        loop.step()
    loop.add("b0", prompts["b0"])
    loop.step()
    full = {"running": len(loop.scheduler.running), "b0": loop.status("b0")}
    loop.settle()
    for req_id in ("b1", "b2", "c"):
        loop.add(req_id, prompts[req_id])
    loop.step()
    at_cap = {req_id: loop.status(req_id) for req_id in ("b1", "b2", "c")}
    loop.settle()
    summary = loop.summary() | {"batch_full": full, "at_cap": at_cap}
    summary["outputs_match"] = all(loop.outputs[r] == expected(p) for r, p in prompts.items())
    loop.worker.shutdown()
    return summary


def prefill_decode(model: str, work: Path, hybrid: bool) -> dict[str, Any]:
    """A prefill engine computes seven prompts; a decode engine pulls each one's KV over TCP once
    it is offered, then decodes: both stepped in turn, as two engines run at once. The seventh's
    decode request asks for prompt logprobs: it pulls nothing, and computes its whole prompt
    (``held_rounds``: the rounds it ran while the prefill engine still held its blocks)."""
    prefill = Loop(model, work, hybrid, "kv_producer")
    decode = Loop(model, work, hybrid, "kv_consumer")
    prompt = prompts_of(1)
    # 255, 319 and 383 tokens: the hybrid's prefill leaves the last one to the decode engine
    # (computed whole, its window would free the block that token attends to first)
    prompts = {f"p{i}": prompt(n) for i, n in enumerate((200, 255, 280, 319, 360, 383))}
    prompts["q"] = prompt(296)  # as 200 tokens: not backed off in the hybrid
    backed_off = 0
    for req_id, tokens in prompts.items():
        prefill.add(req_id, tokens, transfer={"do_remote_decode": True, "do_remote_prefill": False})
        backed_off += prefill.scheduler.requests[req_id].num_prompt_tokens < len(tokens)

    held_rounds = 0

    def send_offered() -> None:  # to the decode engine, as a proxy does
        nonlocal held_rounds
        for req_id in prefill.transfer_params.keys() - decode.outputs.keys():
            decode.add(req_id, prompts[req_id], prompt_logprobs=req_id == "q",
                       transfer=prefill.transfer_params[req_id])  # fmt: skip
        running = "q" in decode.scheduler.requests and decode.status("q") == "RUNNING"
        held_rounds += running and "q" in prefill.scheduler.requests

    run_together([prefill, decode], send_offered)
    summary = decode.summary() | {"held_rounds": held_rounds}
    summary["prefill_wrong_positions"], summary["backed_off"] = prefill.wrong, backed_off
    summary["outputs_match"] = all(decode.outputs[r] == expected(p) for r, p in prompts.items())
    decode.worker.shutdown()
    prefill.worker.shutdown()
    return summary


def main() -> None:
    import vllm

    model, work, flags = sys.argv[1], Path(sys.argv[2]), set(sys.argv[3:])
    run = prefill_decode if "pd" in flags else inflight_loads if "inflight" in flags else one_engine
    summary = run(model, work, "hybrid" in flags)
    print(json.dumps(summary | {"vllm": vllm.__version__}))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
