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
chunks found bad), and those found in a tier that the measured costs chose to compute instead
(``declined_chunks``: a loaded machine may judge a tier that just restarted slower than
computing; a decision, not a miss). A case also records what the engine's counters rose by
(``Case.counters``: chunks found bad, lookups and loads that failed, chunks lost on their way to
a tier), so that a pass served less says why. The campaign's tests and ``kvtier bench faults``
share this module. The settings and a case: ``setting.py``; an engine under a campaign:
``engine.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.apps.bench.common.connector import kvtier_config
from kvtier.apps.bench.common.engine_env import require_in_process_env
from kvtier.apps.bench.faults.engine import CampaignEngine
from kvtier.apps.bench.faults.setting import CHUNK, HOST, READS, REDIS_TIMEOUT_S, Setting
from kvtier.apps.bench.faults.tiers import DiskFaults, RedisFaults, TierFaults
from kvtier.apps.engine_heap import freeze_heap
from kvtier.scheduler.provenance import NOT_TIERS

if TYPE_CHECKING:
    from vllm import LLM

    from kvtier.apps.bench.common.redis_server import RedisServer


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
            "reset_keeps_tiers": True,  # a reset empties host memory: the tier below serves
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
        transfer = kvtier_config(extra)
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
    """An in-process engine (``common.engine_env`` applied: ``RuntimeError`` if not), torn
    down on exit."""
    require_in_process_env()
    import vllm

    freeze_heap()
    llm = vllm.LLM(**args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()  # vLLM's teardown: its state, the heap unfrozen
        del llm  # freed when the caller drops it too: no cycle holds an engine
