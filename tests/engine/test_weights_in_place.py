"""Weights replaced under the same path (a fine-tune re-exported, another model mounted where the
last one was) never reuse the KV the old ones computed, in real vLLM on the CPU: the disk tier
the first engine filled serves the second nothing, and serves the first's weights again once
they are back. The same weights at another path (another machine's mount, a local copy of a
Hugging Face model) are served what they computed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from disk_helpers import CHUNK, chunk_files, disk_run
from harness import full_chunks, prompts, retrained

LENGTHS = [300, 450]


def test_weights_replaced_in_place_load_nothing_the_old_ones_computed(
    tiny_model: Path, reference: Any, tmp_path: Path
) -> None:
    served = Path(shutil.copytree(tiny_model, tmp_path / "model"))  # the path every engine uses
    other = retrained(tiny_model, tmp_path / "retrained")
    token_prompts = prompts(tiny_model, LENGTHS, seed=5)
    old, new = (reference.many(m, [(token_prompts, 8)])[0] for m in (tiny_model, other))
    assert old != new  # the two models answer differently
    tier = tmp_path / "tier"

    assert disk_run(served, tier, token_prompts) == (old, 0)
    assert len(chunk_files(tier)) >= full_chunks(token_prompts, CHUNK)

    shutil.copyfile(other / "model.safetensors", served / "model.safetensors")
    assert disk_run(served, tier, token_prompts) == (new, 0)  # the old KV is not theirs

    shutil.copyfile(tiny_model / "model.safetensors", served / "model.safetensors")
    outputs, loaded = disk_run(served, tier, token_prompts)
    assert outputs == old
    assert loaded >= full_chunks(token_prompts, CHUNK)  # and is served again to its own weights


def test_the_same_weights_at_another_path_load_what_they_computed(
    tiny_model: Path, reference: Any, tmp_path: Path
) -> None:
    here, there = (Path(shutil.copytree(tiny_model, tmp_path / n)) for n in ("here", "there"))
    token_prompts = prompts(tiny_model, LENGTHS, seed=6)
    (expected,) = reference.many(tiny_model, [(token_prompts, 8)])
    tier = tmp_path / "tier"
    assert disk_run(here, tier, token_prompts) == (expected, 0)
    outputs, loaded = disk_run(there, tier, token_prompts)
    assert outputs == expected
    assert loaded >= full_chunks(token_prompts, CHUNK)
