"""The models whose prefill ``kvtier bench gpu`` times against a hit (``prefill.py``), built on
the meta device (no memory, no weights): each has the parameters of the model it stands for."""

from __future__ import annotations

import pytest
import torch

from kvtier.apps.bench.gpu.prefill import check_dims, llama_config
from kvtier.apps.bench.gpu.shapes import SHAPES

transformers = pytest.importorskip("transformers")

# parameters of the model each shape's prefill stands for (one rank's, tensor-parallel)
EXPECTED = {
    "8b": 8.03e9,  # Llama-3-8B
    "70b-tp8": 70.55e9 / 8,  # one rank of eight of Llama-3-70B: a share of every projection
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_prefill_model_has_the_parameters_of_the_model_it_stands_for(name: str) -> None:
    dims = SHAPES[name].model
    assert dims is not None
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(llama_config(dims, 4096))
    check_dims(model, dims)  # its heads as wide as asked
    parameters = sum(p.numel() for p in model.parameters())
    assert abs(parameters / EXPECTED[name] - 1) < 0.03, f"{parameters / 1e9:.2f} B"
    attention = model.model.layers[0].self_attn
    assert attention.k_proj.out_features == dims.kv_heads * 128  # the shape's KV: 128 per head
