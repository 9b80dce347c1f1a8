"""``kvtier bench fleet``'s real half: two engines and the proxy on this machine.

    run_real(out, work)                 measure, print, write ``fleet.json``, ``.md``, ``.png``
    summarize(found, work)    -> dict   each repeat's figures, kv-aware's ratios to round-robin

Each repeat runs every policy (in an order rotated per repeat; ``fleet.py``) on two workloads,
in tokens so that the random model's answers are the tokens the next round sends (``chat.py``):
- ``chat``: LMCache's multi-round QA: ``users`` share a system prompt, each brings a context of
  its own, then asks ``rounds`` questions after its growing history, ``in_flight`` at a time;
- ``docs``: LMCache's long-doc QA: ``documents`` documents of ``document_tokens`` tokens, each
  read ``passes`` times (the order shuffled per pass) with a new question each time.
Per policy: TTFT p50/p90 (streamed, to the first token), requests per second, prompt tokens the
fleet computed, requests per engine. Goal: the chat's TTFT p50 with ``kv-aware`` ≤ 0.6 ×
``round-robin``'s. The table, the PNG and the Markdown: ``report.py``.
"""

from __future__ import annotations

import random
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from kvtier.apps.bench.common.machine import describe
from kvtier.apps.bench.common.results import now, write
from kvtier.apps.bench.fleet.real import report
from kvtier.apps.bench.fleet.real.chat import TIMEOUT_S, ask, chat_workload
from kvtier.apps.bench.fleet.real.fleet import Ask, Asked, Ran, RealWork, measure_policies
from kvtier.apps.models import model_path
from kvtier.apps.prompts import make_prompt

POLICIES = ("round-robin", "least-loaded", "kv-aware")
GOAL_TTFT = 0.6  # kv-aware's chat TTFT p50 over round-robin's


def run_real(out: Path, work: RealWork) -> dict[str, Any]:
    """Every policy on both workloads, ``work.repeats`` times; the JSON document."""
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-fleet-") as logs:
        found = measure_policies(work, _workloads(work), POLICIES, Path(logs))
    results = {"benchmark": "fleet", "date": now(), "machine": describe(torch_too=False),
               **summarize(found, work)}  # fmt: skip
    write(out / "fleet.json", results, report.summary, indent=1)
    report.plot(results, out / "fleet.png")
    report.report(results, GOAL_TTFT)
    return results


def _workloads(work: RealWork) -> dict[str, Ask]:
    model = model_path(work.model)

    def chat(url: str, pool: ThreadPoolExecutor) -> Asked:
        answers = chat_workload(url, work.users, work.rounds, pool, work.answer_tokens,
                                tokens=model, context_chars=work.context_chars,
                                stream=True)  # fmt: skip
        return ([a.ttft_s for a in answers], [a.tokens for a in answers],
                [a.engine for a in answers], sum(len(a.prompt) for a in answers))  # fmt: skip

    def docs(url: str, pool: ThreadPoolExecutor) -> Asked:
        documents = [make_prompt(model, work.document_tokens, seed=7_000_003 + d)
                     for d in range(work.documents)]  # fmt: skip
        rng = random.Random(0)
        prompts = []
        for read in range(work.passes):
            order = list(range(work.documents))
            rng.shuffle(order)
            prompts += [documents[d] + make_prompt(model, work.question_tokens,
                                                   seed=8_000_009 + read * 101 + d, bos=False)
                        for d in order]  # fmt: skip
        with httpx.Client(base_url=url, timeout=TIMEOUT_S, trust_env=False) as client:
            futures = [pool.submit(ask, client, "tiny", {"prompt": p}, i, 0, work.answer_tokens,
                                   True) for i, p in enumerate(prompts)]  # fmt: skip
            answers = [future.result()[0] for future in futures]
        return ([a.ttft_s for a in answers], [a.tokens for a in answers],
                [a.engine for a in answers], sum(map(len, prompts)))  # fmt: skip

    return {"chat": chat, "docs": docs}


def summarize(found: dict[str, dict[str, list[Ran]]], work: RealWork) -> dict[str, Any]:
    """Per workload and policy, each repeat's figures; per workload, kv-aware's ratios against
    round-robin per repeat (TTFT p50, prompt tokens computed)."""
    results: dict[str, Any] = {"work": asdict(work), "workloads": {}}
    for name, policies in found.items():
        rows = {policy: [_figures(ran) for ran in runs] for policy, runs in policies.items()}
        aware, spread = rows["kv-aware"], rows["round-robin"]
        outputs = {policy: [ran.outputs for ran in runs] for policy, runs in policies.items()}
        first = outputs["round-robin"][0]
        results["workloads"][name] = {
            "policies": rows,
            "ttft_p50_ratio": [
                round(a["ttft_p50_s"] / s["ttft_p50_s"], 3)
                for a, s in zip(aware, spread, strict=True)
            ],  # fmt: skip
            "computed_ratio": [
                round(a["computed"] / s["computed"], 3) for a, s in zip(aware, spread, strict=True)
            ],  # fmt: skip
            "outputs_equal": all(o == first for runs in outputs.values() for o in runs),
        }
    return results


def _figures(ran: Ran) -> dict[str, Any]:
    ttfts = sorted(ran.ttft_s)
    return {
        "ttft_p50_s": round(statistics.median(ttfts), 4),
        "ttft_p90_s": round(ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))], 4),
        "requests_per_s": round(len(ttfts) / ran.wall_s, 3),
        "computed": ran.computed,
        "prompt_tokens": ran.prompt_tokens,
        "served": ran.served,
        "reasons": ran.reasons,
    }
