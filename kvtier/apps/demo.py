"""``kvtier demo``: a multi-round chat in real vLLM on the CPU, without kvtier and with it.

Users share a system prompt; every round each user appends a message to their own history and the
assistant's reply is appended too. Between rounds the engine's own prefix cache is emptied
(``reset_prefix_cache()``), so every reused token of a later round must come from kvtier. The same
workload runs twice, one engine at a time: with no connector, then with ``KVTierConnector``. Greedy
decoding: both runs must give the same tokens.

    run(users, rounds, out_dir) -> list[RoundResult]   prints a table, writes out_dir/demo.png
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rich.console import Console
from rich.progress import Progress

from kvtier.apps import demo_report
from kvtier.apps.bench.common.connector import kvtier_config
from kvtier.apps.bench.common.engine_env import apply_in_process_env
from kvtier.apps.engine_heap import freeze_heap
from kvtier.apps.models import model_path
from kvtier.apps.prompts import make_prompt
from kvtier.apps.provenance_report import ProvenanceTotals, add_up

if TYPE_CHECKING:
    from vllm import LLM

SYSTEM_TOKENS = 256
MESSAGE_TOKENS = (64, 128)  # each user message: a length drawn in this range
REPLY_TOKENS = 16
CHUNK_TOKENS = 64  # kvtier's chunk: two engine blocks of 32 tokens
KVTIER = kvtier_config({"cpu_bytes_to_use": "256MiB", "block_size": CHUNK_TOKENS})


@dataclass(frozen=True)
class Workload:
    system: list[int]
    messages: list[list[list[int]]]  # [round][user]: token ids of that user's new message


@dataclass(frozen=True)
class RoundRun:
    """One round of one run."""

    prompt_tokens: int
    ttft_s: float  # mean over the round's requests
    cached_tokens: int  # prompt tokens the engine did not compute: its own cache + kvtier
    served_tokens: int  # prompt tokens loaded from kvtier (hit chunks x chunk tokens)
    outputs: list[list[int]]
    provenance: ProvenanceTotals  # the completions' kv_transfer_params (empty without kvtier)


@dataclass(frozen=True)
class RoundResult:
    round: int
    prompt_tokens: int
    ttft_s_without: float
    ttft_s_with: float
    served_tokens: int
    uncached_tokens: int  # prompt tokens beyond the engine's own cache, in the kvtier run
    identical: bool  # the kvtier run's tokens equal those of the run without a connector
    provenance: ProvenanceTotals  # of the kvtier run

    @property
    def ttft_ratio(self) -> float:
        return self.ttft_s_with / self.ttft_s_without

    @property
    def hit_rate(self) -> float:
        return self.served_tokens / self.uncached_tokens if self.uncached_tokens else 0.0


def run(
    users: int = 6, rounds: int = 5, out_dir: Path = Path("bench/results")
) -> list[RoundResult]:
    """Run the chat without and with kvtier; print the table and summary, write the plot.

    Sets the in-process engine's environment (``bench.common.engine_env``: process-wide,
    before vLLM is imported): the engines run in this process, ``kvtier.stats`` reads them.
    """
    apply_in_process_env()
    model = model_path("tiny")
    workload = _workload(model, users, rounds)
    console = Console()
    runs: dict[str, list[RoundRun]] = {}
    cpu_before = _cpu_times()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("", total=2 * rounds)
        for label, transfer in (("without kvtier", None), ("with kvtier", KVTIER)):
            progress.update(task, description=f"{label}: starting vLLM")
            runs[label] = []
            for round_run in _chat(model, workload, transfer):
                runs[label].append(round_run)
                done = len(runs[label])
                progress.update(task, advance=1, description=f"{label}: round {done}/{rounds}")
    pairs = zip(runs["without kvtier"], runs["with kvtier"], strict=True)
    results = [_compare(r, without, with_) for r, (without, with_) in enumerate(pairs)]
    demo_report.print_report(console, results)
    others = _others_cpu_share(cpu_before, _cpu_times())
    if others > 0.2:
        console.print(
            f"[yellow]note: other processes used {others:.0%} of the CPUs during the run: "
            "the TTFT figures are noisy (token counts and outputs are not)"
        )
    demo_report.plot(results, out_dir / "demo.png")
    console.print(f"plot: {out_dir / 'demo.png'}")
    return results


def _workload(model: Path, users: int, rounds: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    lengths = [[rng.randint(*MESSAGE_TOKENS) for _ in range(users)] for _ in range(rounds)]
    messages = [
        [make_prompt(model, n, seed=seed + 1 + r * users + u, bos=False) for u, n in enumerate(row)]
        for r, row in enumerate(lengths)
    ]
    return Workload(make_prompt(model, SYSTEM_TOKENS, seed=seed), messages)


def _chat(model: Path, workload: Workload, transfer: dict[str, Any] | None) -> Iterator[RoundRun]:
    """The chat on one engine, a round at a time; the engine's prefix cache emptied in between."""
    tiered = transfer is not None
    histories = [list(workload.system) for _ in workload.messages[0]]
    with _engine(model, workload, transfer) as llm:
        warm_up = [make_prompt(model, 3 * CHUNK_TOKENS, seed=-1)]  # unrelated to the chat
        for _ in range(2):  # with kvtier, the second pass loads: one-time costs of both paths
            _chat_round(llm, warm_up, tiered)
        for messages in workload.messages:
            for history, message in zip(histories, messages, strict=True):
                history += message
            round_run = _chat_round(llm, histories, tiered)
            for history, reply in zip(histories, round_run.outputs, strict=True):
                history += reply
            yield round_run


@contextmanager
def _engine(model: Path, workload: Workload, transfer: dict[str, Any] | None) -> Iterator[LLM]:
    import vllm

    rounds = len(workload.messages)
    longest = SYSTEM_TOKENS + rounds * (MESSAGE_TOKENS[1] + REPLY_TOKENS)
    freeze_heap()
    llm = vllm.LLM(
        model=str(model),
        dtype="float32",
        max_model_len=-(-longest // 256) * 256,
        enforce_eager=True,
        seed=0,
        block_size=32,  # the CPU attention backend needs a multiple of 32
        gpu_memory_utilization=0.3,  # a fraction of CPU memory here
        distributed_executor_backend="uni",
        disable_log_stats=False,  # fills RequestOutput.metrics (first-token latency)
        use_tqdm_on_load=False,
        kv_transfer_config=transfer,
    )
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()  # vLLM's teardown: its state, the heap unfrozen
        del llm  # freed when the caller drops it too: no cycle holds an engine


def _chat_round(llm: LLM, prompts: list[list[int]], tiered: bool) -> RoundRun:
    """Generate every prompt in one batch, let kvtier's stores drain, empty the engine's cache."""
    from vllm import SamplingParams

    import kvtier

    hits_before = kvtier.stats(llm).cpu.hit_chunks if tiered else 0
    params = SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS, ignore_eos=True)
    requests: list[Any] = [{"prompt_token_ids": p} for p in prompts]
    outputs = llm.generate(requests, params, use_tqdm=False)
    _drain(llm, tiered)
    hits = kvtier.stats(llm).cpu.hit_chunks - hits_before if tiered else 0
    ttfts = [_first_token_latency(o) for o in outputs]
    return RoundRun(
        prompt_tokens=sum(map(len, prompts)),
        ttft_s=sum(ttfts) / len(ttfts),
        cached_tokens=sum(o.num_cached_tokens or 0 for o in outputs),
        served_tokens=hits * CHUNK_TOKENS,
        outputs=[list(o.outputs[0].token_ids) for o in outputs],
        provenance=add_up(o.kv_transfer_params for o in outputs),
    )


def _first_token_latency(output: Any) -> float:
    metrics = output.metrics
    if metrics is None or metrics.first_token_latency <= 0:
        raise RuntimeError("kvtier demo: vLLM reported no first-token latency (log stats off?)")
    return float(metrics.first_token_latency)


def _drain(llm: LLM, tiered: bool) -> None:
    """Let kvtier's stores finish (finished requests hold their blocks until then), and empty the
    engine's prefix cache."""
    if tiered:
        from kvtier.vllm import settle

        settle(llm)
    if not llm.reset_prefix_cache():
        raise RuntimeError("kvtier demo: the engine still holds blocks; cannot reset its cache")


def _compare(round_: int, without: RoundRun, with_: RoundRun) -> RoundResult:
    own_cache = with_.cached_tokens - with_.served_tokens
    return RoundResult(
        round=round_,
        prompt_tokens=with_.prompt_tokens,
        ttft_s_without=without.ttft_s,
        ttft_s_with=with_.ttft_s,
        served_tokens=with_.served_tokens,
        uncached_tokens=with_.prompt_tokens - own_cache,
        identical=without.outputs == with_.outputs,
        provenance=with_.provenance,
    )


class _CpuTimes(NamedTuple):
    wall: float
    machine: float  # seconds of CPU any process used, all cores (Linux; 0.0 elsewhere)
    own: float  # seconds of CPU this process used


def _cpu_times() -> _CpuTimes:
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        fields = []
    # user nice system idle iowait irq softirq steal: all but idle and iowait are busy
    busy = sum(int(v) for i, v in enumerate(fields[:8]) if i not in (3, 4))
    own = os.times()
    return _CpuTimes(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system)


def _others_cpu_share(before: _CpuTimes, after: _CpuTimes) -> float:
    """The share of all cores' time that other processes used between ``before`` and ``after``."""
    capacity = (after.wall - before.wall) * (os.cpu_count() or 1)
    if capacity <= 0 or after.machine == 0.0:
        return 0.0
    return max(0.0, (after.machine - before.machine) - (after.own - before.own)) / capacity
