"""One engine's vLLM ``Scheduler`` (a release's own) and kvtier's two halves, stepped as vLLM's
model runner steps them, with a stand-in forward (``Loop``); the scenarios: ``release_run.py``.

The stand-in forward writes each position's K and V as a function of the tokens up to it, and
first checks every position the request reads (those computed before this step: the engine's
prefix cache, kvtier's loads, its own earlier steps; in a sliding window's group only those the
window holds). Each request's next token is a function of its tokens so far. So any KV served
wrong is counted (``wrong``), and the outputs equal ``expected`` token for token, computed here
without an engine.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

BLOCK, HEADS, DIM, LAYERS, NUM_BLOCKS = 32, 2, 32, ("model.layers.0", "model.layers.1"), 40
WINDOW = 64  # the hybrid model's second layer: sliding-window attention
MAX_TOKENS = 48


def _values(tokens: list[int]) -> list[int]:
    """Each position's value: a hash of the tokens up to it (exact in float32)."""
    values, h = [], 0
    for token in tokens:
        h = (h * 1_000_003 + token + 1) % 2_147_483_647
        values.append(h % (1 << 23))
    return values


def _next_token(tokens: list[int]) -> int:
    return _values(tokens)[-1] % 480 + 10


def expected(prompt: list[int]) -> list[int]:
    tokens = list(prompt)
    for _ in range(MAX_TOKENS):
        tokens.append(_next_token(tokens))
    return tokens[len(prompt) :]


class Loop:
    def __init__(
        self, model: str, work: Path, hybrid: bool, role: str = "kv_both", **settings: Any
    ) -> None:
        """``settings``: the scheduler's besides (``SchedulerConfig``'s), or kvtier's (its
        ``kv_connector_extra_config``'s) where they name one of kvtier's."""
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.kv_cache_utils import init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            KVCacheTensor,
            SlidingWindowSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        from kvtier.config import KVTierConfig
        from kvtier.vllm import KVTierConnector

        extra: dict[str, Any] = {"cpu_bytes_to_use": "3MiB"}
        if role == "kv_both":
            extra["disk"] = {"path": str(work / "disk"), "bytes": "64MiB"}
        else:  # prefill→decode over TCP on 127.0.0.1
            extra["transfer"] = {"secret": "kvtier-scheduler-loop-secret"}
        kvtier = {f.name for f in dataclasses.fields(KVTierConfig)}
        extra |= {k: v for k, v in settings.items() if k in kvtier}
        scheduler = dict(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512,
                         enable_chunked_prefill=True, is_encoder_decoder=False)  # fmt: skip
        scheduler |= {k: v for k, v in settings.items() if k not in kvtier}
        config = VllmConfig(
            model_config=ModelConfig(model=model, dtype="float32", seed=0, max_model_len=512),
            scheduler_config=SchedulerConfig(**scheduler),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
            kv_transfer_config=KVTransferConfig(
                kv_connector="KVTierConnector", kv_connector_module_path="kvtier.vllm",
                kv_role=role, kv_connector_extra_config=extra,
            ),
            device_config=DeviceConfig("cpu"),
        )  # fmt: skip
        config.cache_config.num_gpu_blocks = NUM_BLOCKS
        shape = (2, NUM_BLOCKS, BLOCK, HEADS, DIM)  # FlashAttention's, one allocation for all
        page, full = BLOCK * HEADS * DIM * 4, dict(block_size=BLOCK, num_kv_heads=HEADS,
                                                   head_size=DIM, dtype=torch.float32)  # fmt: skip
        if hybrid:  # a group per layer; their blocks come from one pool, so they share memory
            backing = torch.zeros(1, *shape)
            self.caches = {name: backing[0] for name in LAYERS}
            placement = KVCacheTensor(backing.nbytes, list(LAYERS), 0, page)
            specs = [FullAttentionSpec(**full), SlidingWindowSpec(**full, sliding_window=WINDOW)]
            groups = [KVCacheGroupSpec([name], spec) for name, spec in zip(LAYERS, specs)]
            self.windows: list[int | None] = [None, WINDOW]
        else:
            backing = torch.zeros(len(LAYERS), *shape)
            self.caches = {name: backing[i] for i, name in enumerate(LAYERS)}
            placement = KVCacheTensor(backing.nbytes, list(LAYERS), backing[0].nbytes, page)
            groups = [KVCacheGroupSpec(list(LAYERS), FullAttentionSpec(**full))]
            self.windows = [None]
        kv_config = KVCacheConfig(
            num_blocks=NUM_BLOCKS, kv_cache_tensors=[placement], kv_cache_groups=groups
        )
        self.group_layers = [list(g.layer_names) for g in groups]
        from vllm.utils.hashing import sha256

        init_none_hash(sha256)
        self.hash_fn = sha256
        self.scheduler = Scheduler(
            vllm_config=config, kv_cache_config=kv_config, block_size=BLOCK, log_stats=True,
            structured_output_manager=StructuredOutputManager(config),
        )  # fmt: skip
        _one_rank(config, work)
        self.worker = KVTierConnector(config, KVConnectorRole.WORKER, kv_config)
        self.worker.register_kv_caches(self.caches)
        told = self.worker.get_handshake_metadata()  # as the engine does, before its first step
        assert told is not None
        self.scheduler.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): told})
        self.steps = self.wrong = self.preempted = 0
        self.outputs: dict[str, list[int]] = {}
        self.transfer_params: dict[str, dict[str, Any]] = {}  # a prefill's, per finished request

    def add(self, req_id: str, prompt: list[int], prompt_logprobs: bool = False,
            transfer: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.scheduler.add_request(self.request(req_id, prompt, prompt_logprobs, transfer))
        self.outputs[req_id] = []

    def request(self, req_id: str, prompt: list[int], prompt_logprobs: bool = False,
                transfer: dict[str, Any] | None = None) -> Any:  # fmt: skip
        """``transfer``: its kv_transfer_params (a prefill's request makes one token)."""
        from vllm import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        prefill = transfer is not None and transfer.get("do_remote_decode")
        params = SamplingParams(
            max_tokens=1 if prefill else MAX_TOKENS, ignore_eos=True, temperature=0.0,
            prompt_logprobs=1 if prompt_logprobs else None,
            extra_args=None if transfer is None else {"kv_transfer_params": transfer},
        )  # fmt: skip
        return Request(
            request_id=req_id, prompt_token_ids=prompt, sampling_params=params,
            pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, self.hash_fn),
        )  # fmt: skip

    def releases(self) -> dict[str, Any]:
        """What ``kvtier.vllm.releases`` reads off this release's requests."""
        from kvtier.vllm.releases import skips_external_kv, truncate_block_hashes

        cut = self.request("cut", list(range(10, 10 + 2 * BLOCK)))
        hashes = len(cut.block_hashes)
        cut.prompt_token_ids = cut.prompt_token_ids[:-1]  # as kv_role.py backs a prompt off
        del cut._all_token_ids[-1:]
        cut.num_prompt_tokens -= 1
        truncate_block_hashes(cut, BLOCK)
        return {
            "skips_prompt_logprobs": skips_external_kv(self.request("l", [1] * 40, True)),
            "skips_plain": skips_external_kv(self.request("p", [1] * 40)),
            "hashes_before_and_after_a_cut": [hashes, len(cut.block_hashes)],
        }  # fmt: skip

    def step(self) -> None:
        from vllm.v1.outputs import KVConnectorOutput

        out = self.scheduler.schedule()
        worker = self.worker
        worker.handle_preemptions(out.kv_connector_metadata)
        worker.bind_connector_metadata(out.kv_connector_metadata)
        sync = getattr(out, "has_sync_kv_loads", True)  # vLLM 0.34: async loads after forward
        if sync:
            worker.start_load_kv(None)  # type: ignore[arg-type]
        sampled = self.forward(out)
        if not sync:
            worker.start_load_kv(None)  # type: ignore[arg-type]
        worker.wait_for_save()
        results = worker.get_transfer_results(out.finished_req_ids)
        kv_output = KVConnectorOutput(
            finished_sending=results.finished_sending or None,
            finished_recving=results.finished_recving or None,
            failed_recving=set(results.failed_recving or ()),
            invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        )
        worker.clear_connector_metadata()
        for outputs in self.scheduler.update_from_output(out, _output(sampled, kv_output)).values():
            for output in outputs.outputs:
                self.outputs[output.request_id] += output.new_token_ids
                if output.kv_transfer_params:
                    self.transfer_params[output.request_id] = output.kv_transfer_params
        self.steps += 1

    def settle(self, limit_s: float = 60.0) -> None:
        """Steps the engine while it has requests or kvtier has work (its writes to its tiers),
        as vLLM's engine does (bounded in time)."""
        deadline = time.monotonic() + limit_s
        while self.scheduler.has_requests():
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests or kvtier's work left after {limit_s} s")
            self.step()

    def status(self, req_id: str) -> str:
        return str(self.scheduler.requests[req_id].status.name)

    def forward(self, out: Any) -> dict[str, list[int]]:
        """Checks what each scheduled request reads, writes what it computes: its next token
        where this step reaches its last token."""
        starts = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
        self.preempted += len(out.preempted_req_ids or ())
        cached = out.scheduled_cached_reqs
        starts.update(zip(cached.req_ids, cached.num_computed_tokens))
        sampled = {}
        for req_id, count in out.num_scheduled_tokens.items():
            tokens = list(self.scheduler.requests[req_id].all_token_ids)
            start, end = starts[req_id], starts[req_id] + count
            tables = self.scheduler.kv_cache_manager.get_block_ids(req_id)
            values = torch.tensor(_values(tokens[:end]), dtype=torch.float32)
            for layers, window, blocks in zip(self.group_layers, self.windows, tables):
                first = 0 if window is None else max(0, start - window + 1)  # what it attends to
                rows = torch.tensor([blocks[p // BLOCK] for p in range(first, end)])
                offsets = torch.arange(first, end) % BLOCK
                read = start - first
                for name in layers:
                    cache = self.caches[name]
                    want = (values[first:] + LAYERS.index(name)).view(-1, 1, 1)
                    seen = cache[:, rows[:read], offsets[:read]]
                    self.wrong += int((seen != want[:read]).flatten(1).any(0).any(-1).any(-1).sum())
                    cache[0, rows[read:], offsets[read:]] = want[read:]
                    cache[1, rows[read:], offsets[read:]] = want[read:]
            reaches_end = end >= len(tokens)
            sampled[req_id] = [_next_token(tokens)] if reaches_end else []
        time.sleep(2e-5 * sum(out.num_scheduled_tokens.values()))  # what computing costs
        return sampled

    def summary(self) -> dict[str, Any]:
        stats = self.scheduler.connector.scheduler.stats  # type: ignore[union-attr]
        return {
            "steps": self.steps, "wrong_positions": self.wrong, "preempted": self.preempted,
            "tiers": {name: dataclasses.asdict(tier) for name, tier in stats.tiers.items()},
        }  # fmt: skip


def _one_rank(config: Any, work: Path) -> None:
    """This process as the one rank of a world of one (what the worker half asks its rank of)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
        model_parallel_is_initialized,
    )

    if model_parallel_is_initialized():  # a prefill and a decode engine in one process
        return
    with set_current_vllm_config(config):
        init_distributed_environment(1, 0, f"file://{work / 'rendezvous'}", 0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)


def _output(sampled: dict[str, list[int]], kv_output: Any) -> Any:
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sampled)
    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    extra = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}  # vLLM 0.32's
    return ModelRunnerOutput(
        req_ids=req_ids, sampled_token_ids=[sampled[r] for r in req_ids],
        kv_connector_output=kv_output, **{k: v for k, v in extra.items() if k in fields},
    )  # fmt: skip
