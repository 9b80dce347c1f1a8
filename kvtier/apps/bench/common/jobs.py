"""Transfer jobs run one at a time, outside an engine, as the benchmarks time them.

run_job(handler, job_id, src, dst) -> TransferResult   one job to its end
bench_layout(layers, block_tokens, num_blocks, device) -> KVLayout
                                    the bench model's per-layer KV tensors in vLLM's CPU
                                    layout, ``(num_blocks, KV_HEADS, block_tokens,
                                    2 * HEAD_DIM)`` bf16, one tensor per layer, every page
                                    written once (no load pays a first-touch fault)
"""

from __future__ import annotations

import torch

from kvtier.addresses import TransferSpec
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.base.handler import TransferHandler, TransferResult

KV_HEADS, HEAD_DIM = 8, 64  # the bench model's (``kvtier.apps.models.SPECS["bench"]``)


def run_job(
    handler: TransferHandler, job_id: int, src: TransferSpec, dst: TransferSpec
) -> TransferResult:
    """Submit one job to ``handler``, wait for it, and return its result (raises when refused
    or failed: a figure of a job that did not move its bytes is no figure)."""
    if not handler.transfer_async(job_id, src, dst):
        raise RuntimeError(f"job {job_id} ({type(src).__name__} -> {type(dst).__name__}) refused")
    handler.wait([job_id])
    results = handler.get_finished()
    mine = [result for result in results if result.job_id == job_id]
    if not mine or not mine[0].success:
        raise RuntimeError(f"job {job_id} failed: {mine[0] if mine else 'never reported'}")
    return mine[0]


def bench_layout(layers: int, block_tokens: int, num_blocks: int, device: torch.device) -> KVLayout:
    caches = {
        f"layer.{i}": torch.ones(num_blocks, KV_HEADS, block_tokens, 2 * HEAD_DIM,
                                 dtype=torch.bfloat16, device=device)
        for i in range(layers)
    }  # fmt: skip
    return build_layout(caches, [list(caches)], num_blocks)
