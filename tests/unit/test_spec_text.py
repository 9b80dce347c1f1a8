"""A KV cache group's spec as the layout fingerprint names it (``spec_text``): the same in the
installed vLLM and in the newest release (whose specs have fields 0.32's lack), other text for
a spec that differs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVQuantMode,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vllm_releases import newest_source

from kvtier.vllm.spec_text import spec_text

REPO = Path(__file__).resolve().parents[2]
F32 = torch.float32

# the specs of a full-attention, a hybrid, an MLA and a uniform-type model, one per line
SCRIPT = """
import torch
from vllm.v1.kv_cache_interface import (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
                                        UniformTypeKVCacheSpecs)
from kvtier.vllm.spec_text import spec_text
full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
specs = [
    full,
    SlidingWindowSpec(block_size=32, num_kv_heads=8, head_size=128, dtype=torch.bfloat16,
                      sliding_window=4096),
    MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                     cache_dtype_str="auto"),
    UniformTypeKVCacheSpecs(block_size=32, kv_cache_specs={"layers.1": full, "layers.0": full}),
]
for spec in specs:
    print(spec_text(spec))
"""


def _texts(*path: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


def test_the_installed_vllm_and_the_newest_name_a_spec_alike() -> None:
    """Engines of two releases share chunks, and a disk tier outlives an upgrade."""
    version, root = newest_source()
    installed, newest = _texts(REPO), _texts(root, REPO)
    assert len(installed) == 4
    assert newest == installed, version


def test_only_fields_off_their_defaults_are_named() -> None:
    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32)
    assert spec_text(full) == (
        "FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32, "
        "head_size_v=32)"
    )
    others = [
        FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32,
                          sliding_window=64),
        FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32,
                          kv_quant_mode=KVQuantMode.FP8_PER_TENSOR),
        SlidingWindowSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32,
                          sliding_window=64),
        FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.bfloat16),
    ]  # fmt: skip
    texts = {spec_text(spec) for spec in [full, *others]}
    assert len(texts) == 5
    assert "sliding_window=64" in spec_text(others[0])
    assert "kv_quant_mode=<KVQuantMode.FP8_PER_TENSOR: 1>" in spec_text(others[1])


def test_a_uniform_groups_layers_are_named_in_order() -> None:
    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=F32)
    first = UniformTypeKVCacheSpecs(block_size=32, kv_cache_specs={"b": full, "a": full})
    second = UniformTypeKVCacheSpecs(block_size=32, kv_cache_specs={"a": full, "b": full})
    assert spec_text(first) == spec_text(second)
    assert spec_text(first).startswith("UniformTypeKVCacheSpecs(block_size=32, ")
    assert "{'a': FullAttentionSpec(" in spec_text(first)
