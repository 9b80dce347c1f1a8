"""The engines ``kvtier bench gpu`` moves KV for: real models' page shapes, built as vLLM does.

    SHAPES[name]                       a ``Shape``: its KV layout, and the model whose prefill a
                                       hit replaces (or why there is none)
    build_engine(shape, blocks, dev)   its KV tensors, every layer carved from ONE allocation
                                       (vLLM 0.32's ``KVCacheTensor`` placements), random bytes

FlashAttention's per-layer tensor is ``(2, num_blocks, block_tokens, kv_heads, head_dim)`` (K and
V of a block apart: two views per layer); MLA's is ``(num_blocks, block_tokens, latent)``. A
hybrid model's sliding-window layers alias the full-attention layers' memory, as vLLM 0.32
overlays its groups (layer ``i`` of both groups in one buffer; a block id belongs to one group at
a time), and its sliding group's job covers only the window at the end of the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvtier.layout import KVLayout, build_layout

CHUNK_TOKENS = 64  # tokens per chunk: kvtier's default ``block_size``


@dataclass(frozen=True)
class ModelDims:
    """A Llama model's dimensions (transformers' ``LlamaConfig``)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int = 0  # 0: hidden // heads (a tensor-parallel rank's heads are fewer)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads


@dataclass(frozen=True)
class Shape:
    name: str
    about: str
    layers: int  # KV tensors (full-attention layers)
    page: tuple[int, ...]  # one block of one tensor, (block_tokens, ...) without the K/V axis
    kv_split: bool  # FlashAttention: K and V apart, (2, num_blocks, ...); MLA: (num_blocks, ...)
    sliding_layers: int = 0  # a second group over the first ``sliding_layers`` tensors
    window_tokens: int = 0  # tokens of the request the sliding group's job covers
    model: ModelDims | None = None
    no_model: str = ""  # why no prefill is measured (``model`` is None)

    @property
    def block_tokens(self) -> int:
        return self.page[0]

    @property
    def chunk_tokens(self) -> int:
        return max(CHUNK_TOKENS, self.block_tokens)

    @property
    def factor(self) -> int:
        """Engine blocks per chunk."""
        return self.chunk_tokens // self.block_tokens

    def tensor_shape(self, num_blocks: int) -> tuple[int, ...]:
        return (2, num_blocks, *self.page) if self.kv_split else (num_blocks, *self.page)


LLAMA_8B = ModelDims(4096, 32, 32, 8, 14336, 128256)
# one tensor-parallel rank of eight of Llama-3-70B: heads, KV heads, MLP and vocab split 8 ways,
# the hidden size whole (each rank's projections take all of it): 8.6 B parameters, 1/8 of 70 B
LLAMA_70B_TP8 = ModelDims(8192, 80, 64 // 8, 1, 28672 // 8, 128256 // 8, head_dim=128)
BENCH = ModelDims(1024, 8, 16, 8, 2816, 1536)  # ``kvtier.apps.models.SPECS["bench"]``
TINY = ModelDims(128, 2, 4, 2, 256, 1536)  # ``SPECS["tiny"]``, in bf16

SHAPES: dict[str, Shape] = {
    "8b": Shape("8b", "Llama-3-8B: 32 layers x 8 KV heads x 128, FlashAttention, 16-token blocks",
                32, (16, 8, 128), True, model=LLAMA_8B),
    "70b-tp8": Shape("70b-tp8", "Llama-3-70B, one TP rank of 8: 80 layers x 1 KV head x 128 "
                     "(4 KiB pages)", 80, (16, 1, 128), True, model=LLAMA_70B_TP8),
    "mla": Shape("mla", "DeepSeek-V3 MLA: 61 layers of (blocks, 64, 576) bf16, 64-token blocks",
                 61, (64, 576), False,
                 no_model="transformers' Llama has no multi-head latent attention, and "
                 "DeepSeek-V3 (671B parameters) does not fit one GPU"),
    "hybrid": Shape("hybrid", "16 full-attention + 16 sliding-window layers (window 1,024) of "
                    "8 KV heads x 128, aliased", 16, (16, 8, 128), True, sliding_layers=16,
                    window_tokens=1024, model=LLAMA_8B),
    "bench": Shape("bench", "the bench model: 8 layers x 8 KV heads x 64, FlashAttention",
                   8, (16, 8, 64), True, model=BENCH),
    "tiny": Shape("tiny", "tests: 2 layers x 2 KV heads x 32, FlashAttention, a sliding group",
                  2, (16, 2, 32), True, sliding_layers=2, window_tokens=1024, model=TINY),
}  # fmt: skip
QUICK_SHAPES = ("8b", "bench")
FULL_SHAPES = ("8b", "70b-tp8", "mla", "hybrid", "bench")
PREFILL_NOTES = {
    "hybrid": "the sliding-window layers' prefill computed as full attention (an upper bound)",
    "70b-tp8": "one rank's share of the compute, without its all-reduces",
}


def parse_shapes(text: str) -> tuple[str, ...]:
    """``"8b,mla"`` -> ``("8b", "mla")``; ``ValueError`` naming the valid shapes."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in SHAPES]
    if unknown or not names:
        raise ValueError(f"--shapes: unknown {unknown or text!r}; valid: {', '.join(SHAPES)}")
    return names


@dataclass(frozen=True)
class Engine:
    caches: dict[str, torch.Tensor]  # layer name -> its KV tensor, as vLLM registers them
    groups: list[list[str]]  # layer names per KV cache group
    layout: KVLayout


def build_engine(shape: Shape, num_blocks: int, device: torch.device, seed: int) -> Engine:
    """``shape``'s KV tensors for ``num_blocks`` blocks in one allocation on ``device``, random."""
    physical = shape.tensor_shape(num_blocks)
    per_layer = math.prod(physical)
    item = torch.empty((), dtype=torch.bfloat16).element_size()
    backing = torch.empty(shape.layers * per_layer * item, dtype=torch.uint8, device=device)
    backing.random_(0, 256, generator=_generator(device, seed))
    words = backing.view(torch.bfloat16)
    tensors = [words[i * per_layer : (i + 1) * per_layer].view(physical)
               for i in range(shape.layers)]  # fmt: skip
    caches = {f"full.{i}": tensor for i, tensor in enumerate(tensors)}
    groups = [list(caches)]
    if shape.sliding_layers:
        sliding = {f"swa.{i}": tensors[i] for i in range(shape.sliding_layers)}
        caches |= sliding
        groups.append(list(sliding))
    if device.type == "cuda":  # filled before the side streams of the copies read it
        torch.cuda.synchronize(device)
    return Engine(caches, groups, build_layout(caches, groups, num_blocks))


def _generator(device: torch.device, seed: int) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator
