"""Helpers for engine tests: real vLLM on the CPU with or without kvtier, and its references."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from vllm import LLM, SamplingParams

from kvtier.apps.engine_heap import freeze_heap
from kvtier.apps.prompts import make_prompt
from kvtier.vllm import KVTierConnector, engine_connector, settle

__all__ = ["settle"]  # re-exported for the tests

LORA_RANK = 8  # of ``lora_adapter``
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def kvtier_transfer(**extra: Any) -> dict[str, Any]:
    """A ``kv_transfer_config`` loading kvtier, with ``extra`` as its extra config."""
    return {
        "kv_connector": "KVTierConnector",
        "kv_connector_module_path": "kvtier.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": "64MiB", **extra},
    }


# A tensor- or pipeline-parallel engine's environment: one core per rank (VLLM_CPU.md), and
# torch.compile off. With TP > 1, vLLM compiles its vocabulary-shard mask
# (get_masked_input_and_mask) with inductor on the CPU: on a fresh machine a 150 MB precompiled
# header and a C++ build, and a trace in every rank's process; PP traces its model in each rank.
# kvtier touches neither, and each test's reference runs under the same environment.
PARALLEL_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "TORCHDYNAMO_DISABLE": "1"}

# an engine's KV cache, in blocks: 131,072 tokens at 32 a block, more than a test sends; an
# engine allocates (and zeroes) these, not the whole VLLM_CPU_KVCACHE_SPACE (1 GiB: 1M tokens)
ENGINE_BLOCKS = 4096
SERVED_BLOCKS = ("--num-gpu-blocks-override", str(ENGINE_BLOCKS))  # the same, for `kvtier serve`


def engine_args(model: Path, **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": str(model),
        "dtype": "float32",
        "max_model_len": 2048,
        "enforce_eager": True,
        "seed": 0,
        "block_size": 32,
        "gpu_memory_utilization": 0.3,
        "num_gpu_blocks_override": ENGINE_BLOCKS,
        "distributed_executor_backend": "uni",
    }
    return args | overrides


@contextmanager
def engine(model: Path, **overrides: Any) -> Iterator[LLM]:
    freeze_heap()
    llm = LLM(**engine_args(model, **overrides))
    try:
        yield llm
    finally:
        # shut the engine down now: a caller's `as llm` (or a failed test's traceback) may keep
        # the object alive, and a late teardown would tear down the next engine's groups
        llm.llm_engine.engine_core.shutdown()  # vLLM's teardown too: its groups, the heap unfrozen
        del llm  # freed when the caller drops it too: no cycle holds an engine


def prompts(model: Path, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    """Token-id prompts of exactly these lengths, unrelated to each other."""
    return [make_prompt(model, n, seed=seed * 1000 + i) for i, n in enumerate(lengths)]


def greedy(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def generate(
    llm: LLM, token_prompts: Sequence[list[int]], params: SamplingParams = GREEDY
) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def connector(llm: LLM) -> KVTierConnector:
    return engine_connector(llm)


def full_chunks(token_prompts: Sequence[list[int]], chunk_tokens: int) -> int:
    return sum(len(p) // chunk_tokens for p in token_prompts)


def retrained(model: Path, into: Path) -> Path:
    """A copy of ``model`` at ``into`` with other values in every weight: the same names, shapes
    and sizes (a fine-tune of it)."""
    other = Path(shutil.copytree(model, into))
    weights = other / "model.safetensors"
    tensors = load_file(weights)
    save_file({name: t * 1.25 for name, t in tensors.items()}, weights, {"format": "pt"})
    return other


def lora_adapter(out: Path, seed: int) -> str:
    """A PEFT LoRA adapter of the tiny model (2 layers, hidden 128, 2 KV heads of 32): random
    low-rank updates of the key, value and query projections, so that it computes KV of its own."""
    out.mkdir(parents=True, exist_ok=True)
    generator, rank = torch.Generator().manual_seed(seed), LORA_RANK
    shapes = {"q_proj": (128, 128), "k_proj": (128, 64), "v_proj": (128, 64)}
    tensors = {}
    for layer in range(2):
        for proj, (fan_in, fan_out) in shapes.items():
            name = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) / 2
            tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) / 2
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
              "lora_dropout": 0.0, "bias": "none", "target_modules": list(shapes),
              "fan_in_fan_out": False, "base_model_name_or_path": "tiny"}  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config))
    return str(out)
