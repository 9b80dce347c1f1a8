"""What an engine's ranks tell its scheduler before the first step names its chunk keys: their
layouts, the attention kernel's packing included.

Two engines of one model whose ranks hold other bytes for the same tokens (FlashAttention's and
FlashInfer's blocks, HND and NHD pages, vLLM's CPU kernels on AMX and on AVX-512) must share no
key: each would find the other's records, refuse them, delete them and compute again, hit after
hit. vLLM's CPU kernels pack a page in their ISA's own order in tensors of one shape, so without
the packing in the layout such a record would not even be refused. Only one layout runs on this
machine: this shows what the engine's ranks tell and that its keys are named by it; other
layouts name other keys (``unit/test_release_keys.py``) and their records are refused
(``unit/test_records.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from disk_helpers import chunk_files, disk_extra
from harness import connector, engine, engine_args, generate, kvtier_transfer, prompts, settle

import kvtier
from kvtier.tiers.base.chunk_format import read_header


def _isa(model: Path) -> str:
    """The ISA vLLM's CPU backend packs this test's engines' pages for (``cpu_attn.py``)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    args, config = engine_args(model), json.loads((model / "config.json").read_text())
    assert args["dtype"] == "float32"
    return str(_get_attn_isa(torch.float32, args["block_size"], head_size=config["head_dim"]))


def test_the_ranks_layouts_and_their_packing_name_the_keys(
    tiny_model: Path, tmp_path: Path
) -> None:
    tier = tmp_path / "tier"
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(**disk_extra(tier))) as llm:
        generate(llm, prompts(tiny_model, [200]))
        settle(llm)
        keys = connector(llm).scheduler.keys.fingerprint
    files = sorted(chunk_files(tier))
    assert len(files) == 3  # 200 tokens: three chunks of 64
    header, _ = read_header(files[0])
    rank = header.describe.split(" layout=", 1)[1].split(" tp=", 1)[0]  # what the rank told
    assert rank.endswith(f" packing={_isa(tiny_model)}"), rank
    assert keys.layout.endswith(f" ranks=[{rank}]"), keys.layout
    assert {path.parent.parent.name for path in files} == {keys.digest().hex()}


def test_inside_a_multi_connector_kvtier_hides_no_other_connectors_handshake(
    tiny_model: Path, tmp_path: Path
) -> None:
    """vLLM's MultiConnector tells the first handshake one of its connectors has: kvtier's would
    hide NixlConnector's, so there it tells none, and still serves its tiers (their keys named
    by the KV cache groups alone)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    tier = tmp_path / "tier"
    multi = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [kvtier_transfer(**disk_extra(tier))]},
    }
    prompt, outputs, loaded = prompts(tiny_model, [200]), [], []
    for _ in range(2):  # the second engine reads what the first wrote
        with engine(tiny_model, kv_transfer_config=multi) as llm:
            assert get_kv_transfer_group().get_handshake_metadata() is None
            outputs.append(generate(llm, prompt))
            settle(llm)
            loaded.append(kvtier.stats(llm).tiers["disk"].loaded_chunks)
    assert loaded == [0, 3]
    with engine(tiny_model) as llm:
        assert outputs == [generate(llm, prompt)] * 2
