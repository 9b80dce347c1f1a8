"""What kvtier reads differently across the vLLM releases it supports (``versions.SUPPORTED``).

    skips_external_kv(request) -> bool          the request loads no KV from a connector
    truncate_block_hashes(request, tokens)      its block hashes after its prompt was cut
    runs_model_runner_v2(vllm_config) -> bool   the engine's workers run Model Runner V2

vLLM 0.34 (against 0.32): a request's ``skip_reading_prefix_cache`` became
``prefix_cache_hit_limit``, and ``skip_reading_external_kv`` (also set by prompt logprobs) says
whether it may read a connector's KV; ``Request.truncate_block_hashes`` appeared; Model Runner
V1 is gone, with ``VllmConfig.use_v2_model_runner`` (and ``VLLM_USE_V2_MODEL_RUNNER=0`` is
refused: ``apps/bench/common/engine_env.py``); resumed requests come as new ones
(``schedule.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request


def skips_external_kv(request: Request) -> bool:
    """Whether vLLM discards what a connector finds for ``request`` (0.34: prompt logprobs, or
    ``skip_reading_prefix_cache``; before: ``skip_reading_prefix_cache``, set by both)."""
    skips = getattr(request, "skip_reading_external_kv", None)
    if skips is None:
        skips = getattr(request, "skip_reading_prefix_cache", False)
    return bool(skips)


def truncate_block_hashes(request: Request, hash_block_size: int) -> None:
    """Drops the hashes of blocks ``request``'s cut prompt no longer fills."""
    truncate = getattr(request, "truncate_block_hashes", None)
    if truncate is not None:  # vLLM 0.34: also its per-block prompt-embedding hashes
        truncate(hash_block_size)
        return
    del request.block_hashes[request.num_tokens // hash_block_size :]


def runs_model_runner_v2(vllm_config: VllmConfig) -> bool:
    """Model Runner V2 (0.32 and 0.33: its choice, vLLM's default on CUDA; 0.34: the only one)."""
    return bool(getattr(vllm_config, "use_v2_model_runner", True))
