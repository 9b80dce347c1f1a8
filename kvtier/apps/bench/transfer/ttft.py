"""``kvtier bench transfer``'s TTFT split: prefill→decode through ``kvtier proxy``, real processes.

The TTFT driver's peer tier (``ttft.tier.peer_tier``): a prefill ``kvtier serve``
(kv_producer) stores, a decode ``kvtier serve`` (kv_consumer) pulls; ``kvtier proxy`` in front,
on loopback, with the bench model. Between the passes, the prefill's ``kv_transfer_params``
go to the decode engine. Samples are kept in ``ttft.results.TTFTResults``. For each prompt
length, every repeat sends two fresh prompts (never seen by either engine), interleaved:

    prefill_s         prompt A straight to the prefill engine (max_tokens=1): the prefill's TTFT
    transfer_s        the decode engine's pull of A (kvtier's load seconds on its /metrics)
    step_s            one decode step: the median time between A's streamed tokens on the decode
                      engine
    first_s           A's first token from the decode engine (the pull, then its first step)
    own_first_s       A and one more token on the decode engine, which now holds A's KV (vLLM's
                      own prefix hit, one token left to compute, as after a pull): the first
                      token of a decode engine that needs no transfer at all
    proxy_s           prompt B through the proxy, streamed: the time to its first token
    proxy_prefill_s   B's prefill as the proxy timed it (its ``Server-Timing`` header)
    proxy_transfer_s  the decode engine's pull of B
    proxy_decode_*    B on the decode engine, from vLLM's own request metrics there: ``ttft``
                      (from its arrival), ``queue`` (until scheduled: the pull and the wait for
                      the step after it), ``forward`` (scheduled to first token)

Goal: ``proxy_s <= prefill + transfer + 1.2 * step`` for each prompt B (the ratio of the two,
median over the repeats, <= 1): the proxy and the hand-over add no more than a fifth of a decode
step. B's own prefill and pull make its bound (two prompts of one length may differ in prefill
time by more than the goal's margin). ``ideal_ratio`` divides ``proxy_s`` by B's
prefill plus ``own_first_s``: what the hand-over costs beyond a decode engine that already held
the KV. Where B's time beyond its bound goes: ``forward_steps`` (its first forward in decode
steps), ``wait_after_pull_s`` (queued beyond the pull) and ``hops_s`` (the rest: the proxy, and
the decode request's HTTP and input processing before vLLM timestamps its arrival).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.common.servers import (
    KVTIER,
    WAIT_S,
    WORKER_IN_CORE,
    Server,
    launch,
    post,
    sample,
    serve_command,
    stop,
    wait,
    wait_healthy,
)
from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.transfer import ttft_report
from kvtier.apps.bench.ttft.results import TTFTResults
from kvtier.apps.bench.ttft.tier import TierTTFT, peer_tier
from kvtier.apps.bench.ttft.timing import Sample
from kvtier.apps.models import model_path
from kvtier.apps.ports import free_port
from kvtier.apps.prompts import make_prompt

LENGTHS = (1024, 2048, 4096)
STEP_TOKENS = 9  # tokens streamed from the decode engine to time its steps
DECODE_SPLIT = {  # B's time on the decode engine, from vLLM's request metrics there
    "ttft": "vllm:time_to_first_token_seconds_sum",
    "queue": "vllm:request_queue_time_seconds_sum",
    "forward": "vllm:request_prefill_time_seconds_sum",
}
GOAL = 1.0
CORES = os.cpu_count() or 1


@contextmanager
def disaggregated(
    model: Path, work: Path, dtype: str, max_model_len: int, tier: TierTTFT | None = None
) -> Iterator[dict[str, Server]]:
    """A prefill engine, a decode engine (kvtier configured for ``tier``, default
    ``peer_tier()``) and the proxy, stopped on exit."""
    env = {"KVTIER_TRANSFER_SECRET": secrets.token_hex(16)}
    extra = (tier or peer_tier()).extra()
    started: dict[str, Server] = {}
    try:
        for core, (name, role) in enumerate(
            (("prefill", "kv_producer"), ("decode", "kv_consumer"))
        ):
            port = free_port()
            command = serve_command(model, port, extra, (), dtype, max_model_len)
            # one core each, as on two machines (an engine busy-polls for a while after each
            # step, which would stall the other on a shared core); its worker in its engine
            # core, as a one-GPU server runs it
            pinned = ["taskset", "-c", str(core % CORES), *command, "--kv-role", role]
            started[name] = launch(pinned, port, work / f"{name}.log", env | WORKER_IN_CORE)
        wait_healthy(started["prefill"], started["decode"])
        port = free_port()
        command = [KVTIER, "proxy", "--prefill", started["prefill"].url,
                   "--decode", started["decode"].url, "--port", str(port)]  # fmt: skip
        started["proxy"] = launch(command, port, work / "proxy.log")
        wait_healthy(started["proxy"])
        yield started
    finally:
        for server in started.values():
            stop(server)


def measure(
    servers: dict[str, Server], model: Path, lengths: Sequence[int], repeats: int
) -> list[dict[str, Any]]:
    """One row per length: every part's median and samples, B's ratios to its bounds."""
    results = TTFTResults()
    for length in lengths:
        for repeat in range(repeats + 1):  # the first is a warm-up, not kept
            seed = 7000 + length * 100 + 2 * repeat  # every prompt of the run differs
            found = _one(servers, make_prompt(model, length, seed=seed),
                         make_prompt(model, length, seed=seed + 1))  # fmt: skip
            if repeat:
                for name, value in found.items():
                    results.record(name, length, Sample(value))
    return [_row(length, results) for length in lengths]


def _row(length: int, results: TTFTResults) -> dict[str, Any]:
    """Medians of every part, and the ratios each repeat's prompt B makes, paired."""
    row: dict[str, Any] = {"prompt_tokens": length}
    samples = {name: results.seconds(name, length) for name in results.measured(length)}
    for name, values in samples.items():
        row[f"{name}_s"] = median(values)
        row[f"{name}_samples"] = values
    parts = zip(samples["proxy"], samples["proxy_prefill"], samples["proxy_transfer"],
                samples["step"], samples["own_first"], strict=True)  # fmt: skip
    bounds, ratios, ideal = [], [], []
    for proxy, prefill, transfer, step, own_first in parts:
        bounds.append(prefill + transfer + 1.2 * step)
        ratios.append(proxy / bounds[-1])
        ideal.append(proxy / (prefill + own_first))
    row.update(bound_s=median(bounds), ratio_samples=ratios, ratio=median(ratios),
               ratio_min=min(ratios), ratio_max=max(ratios), passes=median(ratios) <= GOAL,
               ideal_ratio=median(ideal), ideal_ratio_min=min(ideal),
               ideal_ratio_max=max(ideal))  # fmt: skip
    decode = zip(samples["proxy"], samples["proxy_prefill"], samples["proxy_transfer"],
                 samples["step"], samples["proxy_decode_ttft"], samples["proxy_decode_queue"],
                 samples["proxy_decode_forward"], strict=True)  # fmt: skip
    forward_steps, waits, hops = [], [], []
    for proxy, prefill, transfer, step, ttft, queue, forward in decode:
        forward_steps.append(forward / step)
        waits.append(queue - transfer)
        hops.append(proxy - prefill - ttft)
    row.update(forward_steps=median(forward_steps), wait_after_pull_s=median(waits),
               hops_s=median(hops))  # fmt: skip
    return row


def _one(servers: dict[str, Server], direct: list[int], proxied: list[int]) -> dict[str, float]:
    prefill, decode = servers["prefill"], servers["decode"]
    asks = {"do_remote_decode": True, "do_remote_prefill": False}
    started = time.perf_counter()
    answer = post(prefill.url, "/v1/completions", _body(direct, 1, kv_transfer_params=asks))
    prefill_s = time.perf_counter() - started
    loaded = _pulled_s(decode)
    params = answer["kv_transfer_params"]
    times = _stream(decode.url, _body(direct, STEP_TOKENS, kv_transfer_params=params))[0]
    transfer_s = _pulled_s(decode) - loaded
    steps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # the decode engine holds A's KV now; one more token leaves one to compute, as after a pull
    # (A alone is block-aligned: vLLM would compute its whole last block again)
    own_first = _stream(decode.url, _body(direct + direct[:1], 2))[0]
    loaded, before = _pulled_s(decode), _decode_split(decode)
    proxy_times, timing = _stream(servers["proxy"].url, _body(proxied, 2))
    wait(lambda: _finished(decode) > before["finished"], WAIT_S, "B's metrics on the decode engine")
    after = _decode_split(decode)
    split = {f"proxy_decode_{name}": after[name] - before[name] for name in DECODE_SPLIT}
    return {"prefill": prefill_s, "transfer": transfer_s, "step": median(steps),
            "first": times[0], "own_first": own_first[0], "proxy": proxy_times[0],
            "proxy_prefill": _prefill_timing(timing),
            "proxy_transfer": _pulled_s(decode) - loaded, **split}  # fmt: skip


def _decode_split(decode: Server) -> dict[str, float]:
    """vLLM's request-time sums on the decode engine, and how many requests they count."""
    found = {name: sample(decode.url, metric) for name, metric in DECODE_SPLIT.items()}
    return found | {"finished": _finished(decode)}


def _finished(decode: Server) -> float:
    return sample(decode.url, "vllm:e2e_request_latency_seconds_count")


def _pulled_s(decode: Server) -> float:
    """The decode engine's pull seconds so far (kvtier's load seconds from the peer)."""
    return sample(decode.url, "vllm:kvtier_load_seconds_sum", tier="peer")


def _body(prompt: list[int], max_tokens: int, **more: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, **more}  # fmt: skip


def _stream(url: str, body: dict[str, Any]) -> tuple[list[float], str | None]:
    """Seconds from the request to each streamed token, and the answer's ``Server-Timing``."""
    data = json.dumps({**body, "stream": True}).encode()
    request = urllib.request.Request(url + "/v1/completions", data,
                                     {"Content-Type": "application/json"})  # fmt: skip
    started, times = time.perf_counter(), []
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        timing = response.headers.get("server-timing")
        for line in response:
            text = line.decode().strip()
            if text.startswith("data: ") and text != "data: [DONE]":
                if json.loads(text[6:])["choices"][0].get("text") is not None:
                    times.append(time.perf_counter() - started)
    return times, timing


def _prefill_timing(header: str | None) -> float:
    """The prefill's seconds in the proxy's ``Server-Timing``."""
    match = re.search(r"\bprefill;dur=([\d.]+)", header or "")
    if match is None:
        raise RuntimeError(f"the proxy's answer has no prefill Server-Timing: {header!r}")
    return float(match[1]) / 1e3


def run(out_dir: Path, quick: bool = False) -> list[dict[str, Any]]:
    """The TTFT split for each prompt length (the tiny model, 1k tokens, when ``quick``); writes
    ``transfer-ttft.json``, ``.md`` and ``.png`` into ``out_dir`` and prints the ratios."""
    name, dtype = ("tiny", "float32") if quick else ("bench", "bfloat16")
    lengths, repeats = ((1024,), 1) if quick else (LENGTHS, 5)
    model = model_path(name)
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-pd-") as work:
        with disaggregated(model, Path(work), dtype, max(lengths) + 64) as servers:
            rows = measure(servers, model, lengths, repeats)
    meta = {"model": name, "dtype": dtype, "repeats": repeats, "goal": GOAL,
            "goal_text": "proxy <= prefill + transfer + 1.2 * step, for each prompt B (its own "
                         "prefill from the proxy's Server-Timing, its own pull)"}  # fmt: skip
    path = out_dir / "transfer-ttft.json"
    write_json(path, "transfer-ttft", rows, ttft_report.summary, **meta)
    ttft_report.plot(rows, meta, path.with_suffix(".png"))
    for row in rows:
        print(ttft_report.line(row, GOAL))
    return rows
