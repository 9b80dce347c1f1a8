"""Whether vLLM recovers from a synchronous load that failed: the tokens recomputed, right.

    recovers_sync_loads(vllm_config) -> str | None   None: it does; else why not

A synchronous load runs before the forward of the step that runs its request; when it fails,
kvtier reports the blocks (``get_block_ids_with_load_errors``) and vLLM's scheduler rolls the
request back to recompute them (``kv_load_failure_policy="recompute"``). vLLM 0.32 gets that
roll-back wrong in two configurations, both its defaults on CUDA (vllm-project/vllm#49250, fixes
#49252 and #53298 unmerged): Model Runner V2 rolls back only its CPU copy of the request's
computed tokens, so the recompute reads tokens and positions from the old offset and the failed
blocks keep what they held; asynchronous scheduling leaves the request's output placeholders in
place, so the recompute runs extra tokens past the prompt (or never ends, vllm#45138). An
asynchronous load is recovered right in both: its request waits, and a failed one is scheduled
anew from what loaded.

So where vLLM does not recover, no read that can fail runs before the forward: a local disk's
chunks load asynchronously. Host memory's still load before the forward (a copy within the
process, which fails only with the device). On the CPU vLLM 0.32 runs neither configuration;
vLLM 0.34 has Model Runner V2 only, and 0.33 and 0.34 still roll back as 0.32 does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.vllm.releases import runs_model_runner_v2

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def recovers_sync_loads(vllm_config: VllmConfig) -> str | None:
    """None where vLLM recomputes a failed synchronous load right; else which setting of
    ``vllm_config`` keeps it from it."""
    if runs_model_runner_v2(vllm_config):
        return "Model Runner V2"
    if vllm_config.scheduler_config.async_scheduling:
        return "asynchronous scheduling"
    return None
