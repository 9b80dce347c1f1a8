"""The TTFT benches' set-up: what every engine of one run shares, and the workloads.

    Setup(model, dtype, lengths, repeats, workload, storage)   ``.engine_args(transfer)``
    Workload                      ``kvtier bench ttft``'s 0%-hit throughput workload
    loadable_chunks(length, chunk)

Shared by ``kvtier bench ttft``, ``disk``, ``redis`` and ``concurrency``. Nothing here starts an
engine; their environment is ``common.engine_env``'s, their connectors ``tier.TierTTFT``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINE_BLOCK = 32  # tokens per engine block
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
    """What every engine of one run shares: the model, the prompt lengths."""

    model: Path
    dtype: str
    lengths: tuple[int, ...]
    repeats: int = 1
    workload: Workload = Workload()

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


def loadable_chunks(length: int, chunk_tokens: int) -> int:
    """Whole chunks of a ``length``-token prompt before its last token (the engine computes the
    last token itself, so a hit may stop one chunk short at lengths that are multiples)."""
    return (length - 1) // chunk_tokens
