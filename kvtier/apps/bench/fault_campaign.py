"""A fault campaign: kvtier's engine against the engine without it, with faults in between.

    Setting(tier, host, reads, ranks)          one engine's configuration under test
    Campaign(model, prompts, work)             the prompts, their reference outputs
    with campaign.engine(setting) as run:      an engine with kvtier, the tier seeded
        run.case(fault, rng, share, rank)      -> Case: a fault, then passes over the prompts

Every pass runs the prompts one by one, the engine's own prefix cache emptied before each, so
only kvtier serves, and compares every output with the engine without kvtier (greedy). A case:
the host tier is emptied (what a tier below holds must now be read from it), the fault is put in
the tier, then three passes: the first over the fault, the second served again (from host memory
or the tier), the third after the host tier is emptied again (from the tier, healed). ``RESET``
instead resets the connector after every engine step of the first pass, while the prompt's loads
and stores run.

``served``: the share of the prompts' full chunks that kvtier loaded in a pass (hits, less the
chunks found bad). A case also records what the engine's counters rose by (``Case.counters``:
chunks found bad, lookups and loads that failed, chunks lost on their way to a tier), so that a
pass served less says why. The campaign's tests and ``kvtier bench faults`` share this module.

Over 300 lines because a case's fault, passes and checks share one engine and its reference.
"""

from __future__ import annotations

import gc
import json
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.apps.bench.fault_tiers import DiskFaults, Fault, RedisFaults, TierFaults
from kvtier.counters import LOST_CAUSES
from kvtier.scheduler.provenance import NOT_TIERS

if TYPE_CHECKING:
    from vllm import LLM

    from kvtier.apps.bench.redis_server import RedisServer

CHUNK = 64  # tokens per chunk: two engine blocks of 32
HOST = {"tiny": 4, "roomy": 4096}  # host tier sizes, in chunks
READS = {"sync": 100_000, "async": 1, "default": 256}  # min_async_load_tokens
TIERS = ("disk", "redis", "host")
DRAIN_S = 15.0  # the longest a pass waits for the tiers' writes to land after it
# no fault stalls Redis (one killed refuses connections at once): a timeout is only a round trip
# slowed by a loaded machine (0.5 s timed out once in CI, beside a two-rank engine), and it
# would open the circuit breaker and make the healed passes' loads misses
REDIS_TIMEOUT_S = 5.0
COUNTED = ("failed_lookups", "failed_loads", "bad_chunks", "failed_stores", "skipped_stores",
           "declined_chunks", *(f"lost_{cause}" for cause in LOST_CAUSES))  # fmt: skip


@dataclass(frozen=True)
class Setting:
    tier: str  # disk | redis | host (no tier below host memory)
    host: str = "roomy"  # tiny | roomy
    reads: str = "default"  # sync | async | default
    ranks: int = 1  # tensor-parallel ranks

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("tier", self.tier, TIERS),
            ("host", self.host, tuple(HOST)),
            ("reads", self.reads, tuple(READS)),
            ("ranks", self.ranks, (1, 2)),
        ):
            if value not in allowed:
                raise ValueError(f"fault campaign: {name} must be one of {allowed}, got {value!r}")

    def __str__(self) -> str:
        return f"{self.tier}/{self.host}/{self.reads}/tp{self.ranks}"


@dataclass
class Case:
    setting: Setting
    fault: Fault | None  # None: passes over a tier damaged before
    damaged: int  # records the fault damaged (or lost)
    passes: list[float] = field(default_factory=list)  # each pass's share of chunks served
    wrong: int = 0  # outputs that differ from the engine without kvtier
    outputs: int = 0  # outputs compared
    seconds: float = 0.0
    # what the engine's counters ("tier.counter": misses that failed, chunks lost on their way
    # to a tier, ...) rose by over the case: why a pass was served less, when one is
    counters: dict[str, int] = field(default_factory=dict)


class Campaign:
    """``prompts`` on ``model``; the reference outputs are computed by ``reference()``."""

    def __init__(
        self,
        model: Path,
        prompts: Sequence[list[int]],
        work: Path,
        redis: RedisServer | None = None,
        max_tokens: int = 8,
    ) -> None:
        self.model = model
        self.prompts = [list(p) for p in prompts]
        self.work = work
        self.redis = redis
        self.max_tokens = max_tokens
        self.full_chunks = sum(len(p) // CHUNK for p in self.prompts)  # of all the prompts
        self.expected: list[list[int]] = []
        self._engines = 0

    def engine_args(self, ranks: int = 1, **overrides: Any) -> dict[str, Any]:
        args: dict[str, Any] = {
            "model": str(self.model),
            "dtype": "float32",
            "max_model_len": 2048,
            "enforce_eager": True,
            "seed": 0,
            "block_size": 32,
            "gpu_memory_utilization": 0.3,
            "distributed_executor_backend": "uni" if ranks == 1 else "mp",
            "tensor_parallel_size": ranks,
        }
        return args | overrides

    def reference(self, ranks: int = 1) -> list[list[int]]:
        """The outputs without kvtier (computed once)."""
        if not self.expected:
            with _engine(self.engine_args(ranks)) as llm:
                self.expected = [self._generate_served(llm, p)[0] for p in self.prompts]
        return self.expected

    def _generate_served(
        self, llm: LLM, prompt: list[int], read_cache: bool = True
    ) -> tuple[list[int], int]:
        """``prompt``'s output, and the tokens of its full chunks kvtier served (none when not
        ``read_cache``: the engine computes every token, as without kvtier)."""
        from vllm import SamplingParams, TokensPrompt

        llm.reset_prefix_cache()
        params = SamplingParams(
            temperature=0.0,
            max_tokens=self.max_tokens,
            ignore_eos=True,
            skip_reading_prefix_cache=not read_cache,
        )
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        return list(out.outputs[0].token_ids), _served_tokens(out.kv_transfer_params, prompt)

    def extra(self, setting: Setting) -> dict[str, Any]:
        """kvtier's extra config for ``setting`` (a tier of this engine's own)."""
        self._engines += 1
        extra: dict[str, Any] = {
            "cpu_bytes_to_use": HOST[setting.host] * chunk_bytes(self.model),
            "block_size": CHUNK,
            "min_async_load_tokens": READS[setting.reads],
        }
        if setting.tier == "disk":
            path = self.work / f"disk-{self._engines}"
            extra["disk"] = {"path": str(path), "bytes": "256MiB", "write_through": True}
        elif setting.tier == "redis":
            assert self.redis is not None, "fault campaign: a Redis tier needs a server"
            prefix = f"faults-{self._engines}-{time.monotonic_ns()}"
            extra["redis"] = {"url": self.redis.url, "timeout_s": REDIS_TIMEOUT_S, "prefix": prefix}
        return extra

    @contextmanager
    def engine(
        self, setting: Setting, tier: str | None = None, seed: bool = True
    ) -> Iterator[CampaignEngine]:
        """An engine with kvtier for ``setting``, its tier ``seed``ed with every prompt.
        ``tier``: the address of a tier written before (a disk tier's path, a Redis tier's key
        prefix: ``CampaignEngine.tier_address``); None: a new one. With several ranks, the
        reference is the engine's own outputs computed without reading any cache (a
        tensor-parallel engine's numbers differ from one rank's)."""
        from kvtier.vllm import engine_connector

        if setting.ranks == 1:
            self.reference()
        extra = self.extra(setting)
        if tier is not None and setting.tier == "disk":
            extra["disk"]["path"] = tier
        elif tier is not None and setting.tier == "redis":
            extra["redis"]["prefix"] = tier
        transfer = {
            "kv_connector": "KVTierConnector",
            "kv_connector_module_path": "kvtier.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
        with _engine(self.engine_args(setting.ranks, kv_transfer_config=transfer)) as llm:
            chunks = engine_connector(llm).scheduler.manager.capacity
            if chunks != HOST[setting.host]:
                raise RuntimeError(f"fault campaign: {chunks} host chunks, expected "
                                   f"{HOST[setting.host]} ({setting})")  # fmt: skip
            if setting.ranks == 1:
                expected = self.expected
            else:
                expected = [self._generate_served(llm, p, False)[0] for p in self.prompts]
            faults = _tier_faults(self, setting, extra)
            run = CampaignEngine(self, setting, llm, faults, expected, seed)
            run.tier_address = _address(setting, extra)
            yield run


class CampaignEngine:
    """One engine with kvtier, its tier seeded with every prompt."""

    def __init__(
        self,
        campaign: Campaign,
        setting: Setting,
        llm: LLM,
        tier: TierFaults | None,
        expected: list[list[int]],
        seed: bool = True,
    ) -> None:
        self.campaign = campaign
        self.setting = setting
        self.llm = llm
        self.tier = tier
        self.expected = expected
        self.cases: list[Case] = []
        self.tier_address: str | None = None  # its tier's path or key prefix
        if seed:  # the host tier and, written through, the tier below
            _, wrong = self._pass()
            if wrong:
                raise AssertionError(f"fault campaign: {wrong} wrong outputs seeding {setting}")

    def _pass(self, reset_each_step: bool = False) -> tuple[float, int]:
        """Every prompt once: (share of full chunks served, outputs that differ)."""
        from kvtier.vllm import settle

        wrong = served = 0
        for prompt, expected in zip(self.campaign.prompts, self.expected):
            if reset_each_step:
                got, tokens = self._generate_resetting(prompt), 0
            else:
                got, tokens = self.campaign._generate_served(self.llm, prompt)
            wrong += got != expected
            served += tokens
        settle(self.llm)
        self._drain()
        return served / max(1, self.campaign.full_chunks * CHUNK), wrong

    def _drain(self, timeout_s: float = DRAIN_S) -> None:
        """Step the idle engine until the tiers below host memory took what they should (a
        write retried after a tier came back, a write-back): what seconds of traffic would
        do, done before the next pass. Bounded: a tier still down is left as it is."""
        from kvtier.vllm import engine_connector

        scheduler = engine_connector(self.llm).scheduler
        core = self.llm.llm_engine.engine_core.engine_core  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout_s
        while scheduler.has_pending_work and time.monotonic() < deadline:
            core.step()

    def _generate_resetting(self, prompt: list[int]) -> list[int]:
        """``prompt``, with the connector reset after every engine step (loads, stores and
        writes in flight)."""
        from vllm import RequestOutput, SamplingParams

        self.llm.reset_prefix_cache()
        engine = self.llm.llm_engine
        params = SamplingParams(
            temperature=0.0, max_tokens=self.campaign.max_tokens, ignore_eos=True
        )
        request_id = f"reset-{time.monotonic_ns()}"
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
        tokens: list[int] = []
        for _ in range(10_000):
            for out in engine.step():
                if out.request_id == request_id and out.finished:
                    assert isinstance(out, RequestOutput)
                    tokens = list(out.outputs[0].token_ids)
            if not engine.has_unfinished_requests():
                return tokens
            engine.reset_prefix_cache(reset_connector=True)
        raise RuntimeError("fault campaign: a request did not finish in 10,000 steps")

    def drop_host(self) -> None:
        """Empty the host tier (chunks in use stay; the tier below is kept)."""
        for _ in range(10_000):
            if self.llm.reset_prefix_cache(reset_connector=True):
                return
            self.llm.llm_engine.step()
        raise RuntimeError("fault campaign: the host tier could not be emptied")

    def case(
        self,
        fault: Fault,
        rng: random.Random,
        share: float = 1.0,
        rank: int | None = None,
        passes: int = 3,
    ) -> Case:
        """``fault`` on ``share`` of the tier's records (of ``rank`` only: None, every rank),
        then ``passes`` passes (1 to 3)."""
        started = time.perf_counter()
        before = self._counters()
        self.drop_host()
        damaged = 0
        if fault is not Fault.RESET:
            assert self.tier is not None, f"fault campaign: {fault.value} needs a tier"
            damaged = self.tier.inject(fault, rng, share, rank)
        return self.passes(Case(self.setting, fault, damaged), passes, started, before)

    def passes(
        self,
        case: Case | None = None,
        count: int = 2,
        started: float = 0.0,
        before: dict[str, int] | None = None,
    ) -> Case:
        """``count`` passes over the prompts (a ``RESET`` case's first resets at every step),
        the host tier emptied before the third; recorded in ``case`` (None: a case of no
        fault of its own, e.g. over a tier damaged before the engine started), with what the
        counters rose by since ``before`` (None: since now)."""
        started = started or time.perf_counter()
        case = case or Case(self.setting, None, 0)
        before = self._counters() if before is None else before
        for n in range(count):
            if n == 2:
                self.drop_host()  # the third pass reads the tier below: it healed
            served, wrong = self._pass(reset_each_step=case.fault is Fault.RESET and n == 0)
            case.passes.append(served)
            case.wrong += wrong
            case.outputs += len(self.campaign.prompts)
        case.seconds = time.perf_counter() - started
        after = self._counters()
        case.counters = {name: value - before.get(name, 0) for name, value in after.items()
                         if value != before.get(name, 0)}  # fmt: skip
        self.cases.append(case)
        return case

    def _counters(self) -> dict[str, int]:
        """The engine's counters of every tier (``COUNTED``), as ``"tier.counter"``."""
        from kvtier.vllm import stats

        return {f"{name}.{counter}": getattr(tier, counter)
                for name, tier in stats(self.llm).tiers.items() for counter in COUNTED}  # fmt: skip


def _address(setting: Setting, extra: dict[str, Any]) -> str | None:
    if setting.tier == "disk":
        return str(extra["disk"]["path"])
    if setting.tier == "redis":
        return str(extra["redis"]["prefix"])
    return None


def _tier_faults(campaign: Campaign, setting: Setting, extra: dict[str, Any]) -> TierFaults | None:
    if setting.tier == "disk":
        return DiskFaults(Path(extra["disk"]["path"]))
    if setting.tier == "redis":
        assert campaign.redis is not None
        return RedisFaults(campaign.redis.url, extra["redis"]["prefix"], campaign.redis.restart)
    return None


def shared_prefix_prompts(model: Path, prefixes: Sequence[int], suffixes: int) -> list[list[int]]:
    """``suffixes`` prompts on each prefix (of these lengths in tokens): prefixes are shared."""
    from kvtier.apps.prompts import make_prompt

    heads = [make_prompt(model, n, seed=100 + i) for i, n in enumerate(prefixes)]
    return [
        head + make_prompt(model, 40 + 13 * j, seed=500 + 10 * i + j, bos=False)
        for i, head in enumerate(heads)
        for j in range(suffixes)
    ]


def _served_tokens(params: dict[str, Any] | None, prompt: list[int]) -> int:
    """Tokens of ``prompt``'s full chunks kvtier loaded (its provenance, in the completion's
    ``kv_transfer_params``): loaded from any tier, less those whose load failed."""
    found = (params or {}).get("kvtier") or {}
    loaded = sum(int(v) for k, v in found.items() if k not in NOT_TIERS)
    return max(0, min(loaded - int(found.get("failed_tokens", 0)), len(prompt) // CHUNK * CHUNK))


def chunk_bytes(model: Path) -> int:
    """Bytes of one chunk of ``model``'s KV (float32, every layer, K and V, all ranks)."""
    config = json.loads((model / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return int(CHUNK * config["num_hidden_layers"] * 2 * kv_heads * head_dim * 4)


@contextmanager
def _engine(args: dict[str, Any]) -> Iterator[LLM]:
    import vllm

    llm = vllm.LLM(**args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.unfreeze()
        gc.collect()
        vllm.distributed.cleanup_dist_env_and_memory()
