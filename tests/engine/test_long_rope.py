"""A LongRoPE model (Phi-3's, Phi-4-mini's rotary embedding) in real vLLM on the CPU: vLLM rotates
every key by the long factors in an engine longer than the model's original context, by the
short ones otherwise. Engines on either side of it compute other KV for the same tokens, so a
disk tier one of them filled serves the other nothing; engines on the same side share it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from disk_helpers import CHUNK, disk_run
from harness import full_chunks, prompts

ORIGINAL = 256  # the model's original context: tokens a short engine may hold
LENGTHS = [150, 200]  # prompts a short engine takes (with 8 tokens of output)


def _long_rope(model: Path, into: Path) -> Path:
    """A copy of ``model`` whose rotary embedding is LongRoPE (short factors 1, long ones 4)."""
    copy = Path(shutil.copytree(model, into))
    config = json.loads((copy / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    config["rope_parameters"] = {
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * (head_dim // 2),
        "long_factor": [4.0] * (head_dim // 2), "original_max_position_embeddings": ORIGINAL,
    }  # fmt: skip
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_engines_on_either_side_of_the_original_context_share_no_kv(
    tiny_model: Path, reference: Any, tmp_path: Path
) -> None:
    model = _long_rope(tiny_model, tmp_path / "long-rope")
    token_prompts = prompts(tiny_model, LENGTHS, seed=7)
    short, long = (reference.many(model, [(token_prompts, 8)], max_model_len=n)[0]
                   for n in (ORIGINAL, 4 * ORIGINAL))  # fmt: skip
    assert short != long  # the two rotations answer differently
    tier = tmp_path / "tier"

    def run(max_model_len: int) -> tuple[list[list[int]], int]:
        return disk_run(model, tier, token_prompts, max_model_len=max_model_len)

    assert run(ORIGINAL) == (short, 0)
    assert run(4 * ORIGINAL) == (long, 0)  # not the short engine's KV
    outputs, loaded = run(8 * ORIGINAL)  # long factors too: the long engine's KV
    assert outputs == long
    assert loaded >= full_chunks(token_prompts, CHUNK)
