"""``kvtier bench ttft``'s set-up: the engines' arguments and environment, the workloads.

Shared with ``kvtier bench disk`` (``disk_ttft.py``). Nothing here starts an engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINE_ENV = {  # forced: kvtier's counters and step counts need the engine in its own process
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # V2 needs Triton
}
ENGINE_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB
ENGINE_BLOCK, CHUNK_TOKENS = 32, 64  # tokens per engine block; per kvtier chunk (default)
KVTIER_HOST_BYTES = "2GiB"  # kvtier's host tier in the TTFT engines
HIT_FRACTION = 0.9  # of a prompt's loadable chunks a kvtier hit must load, else the run is invalid
CONFIGS = ("baseline", "kvtier", "example")  # the engines: no connector, kvtier, ExampleConnector


@dataclass(frozen=True)
class Workload:
    """The 0%-hit throughput workload: per pair, ``prompts`` never-seen prompts of ``tokens``
    tokens, each decoded ``max_tokens`` tokens, served once by each engine (interleaved).

    At least ``pairs`` pairs; more, up to ``max_pairs``, while the spread of the median ratio
    is above ``spread_goal`` (a fraction)."""

    prompts: int = 8
    tokens: int = 512
    max_tokens: int = 16
    pairs: int = 10
    max_pairs: int = 40
    spread_goal: float = 0.02

    @property
    def tokens_per_pair(self) -> int:
        return 2 * self.prompts * self.tokens


@dataclass(frozen=True)
class Setup:
    """What every engine of one run shares: the model, the prompt lengths, kvtier's chunk."""

    model: Path
    dtype: str
    lengths: tuple[int, ...]
    repeats: int
    workload: Workload
    storage: Path  # ExampleConnector's files
    chunk_tokens: int = field(default=CHUNK_TOKENS, kw_only=True)

    def engine_args(self, transfer: dict[str, Any] | None) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM`` for an in-process engine on the CPU."""
        return {
            "model": str(self.model),
            "dtype": self.dtype,
            "max_model_len": max(*self.lengths, self.workload.tokens) + 64,
            "enforce_eager": True,
            "seed": 0,
            "block_size": ENGINE_BLOCK,
            "gpu_memory_utilization": 0.3,  # a fraction of host memory on the CPU
            "distributed_executor_backend": "uni",
            "kv_transfer_config": transfer,
        }

    def transfer(self, config: str) -> dict[str, Any] | None:
        """vLLM's ``kv_transfer_config`` of one of ``CONFIGS``."""
        if config == "kvtier":
            extra = {"cpu_bytes_to_use": KVTIER_HOST_BYTES, "block_size": self.chunk_tokens}
            return {"kv_connector": "KVTierConnector", "kv_connector_module_path": "kvtier.vllm",
                    "kv_role": "kv_both", "kv_connector_extra_config": extra}  # fmt: skip
        if config == "example":
            extra = {"shared_storage_path": str(self.storage)}
            return {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": extra}  # fmt: skip
        if config == "baseline":
            return None
        raise ValueError(f"unknown engine configuration {config!r}; one of {CONFIGS}")


def engine_env() -> dict[str, str]:
    """The environment an engine runs in: ``ENGINE_ENV`` over this process's, whose values win
    over ``ENGINE_ENV_DEFAULTS``."""
    env = {name: os.environ.get(name, value) for name, value in ENGINE_ENV_DEFAULTS.items()}
    env["VLLM_LOGGING_LEVEL"] = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")
    return {**env, **ENGINE_ENV}


def set_engine_env() -> None:
    """Set ``engine_env()`` in this process (for in-process engines)."""
    os.environ.update(engine_env())


def loadable_chunks(length: int, chunk_tokens: int) -> int:
    """Whole chunks of a ``length``-token prompt before its last token (the engine computes the
    last token itself, so a hit may stop one chunk short at lengths that are multiples)."""
    return (length - 1) // chunk_tokens
