"""The prefill a host hit replaces: the same tokens computed by a model of the shape.

    measure(shape, tokens, device, reps, clock)   seconds of ``reps`` prefills, after a warm-up
    hit_over_prefill(load_s, prefill_s)           host load seconds / prefill seconds, per rep

The model is transformers' ``LlamaForCausalLM`` of the shape's dimensions (``shapes.ModelDims``),
random weights made directly on the device in bf16 (no download), sdpa attention. A prefill is
one forward of the ``tokens`` prompt under ``torch.inference_mode()``, the logits of its last
token only (as an engine samples); the figure pairs each host load of ``host_copy.measure`` with
a prefill, rep by rep. A shape with no such model (MLA) is ``Unavailable``, with the reason.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.figures import Measured, Unavailable, summary
from kvtier.apps.bench.gpu.shapes import PREFILL_NOTES, ModelDims, Shape


def measure(shape: Shape, tokens: int, device: torch.device, reps: int, clock: Clock) -> Measured:
    if shape.model is None:
        raise Unavailable(shape.no_model)
    try:
        from transformers import LlamaForCausalLM
    except ImportError as error:
        raise Unavailable(f"transformers does not import: {error}") from error
    dims = shape.model
    config = llama_config(dims, tokens)
    with _default_dtype(torch.bfloat16), torch.device(device):
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    try:
        check_dims(model, dims)
        seconds = _timed(model, dims.vocab, tokens, reps, clock)
        details: dict[str, Any] = {
            "model": _described(dims), "parameters": _parameters(model), "tokens": tokens,
            "attention": getattr(model.config, "_attn_implementation", None),
            "seconds": summary(seconds),
        }  # fmt: skip
    finally:
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if shape.name in PREFILL_NOTES:
        details["note"] = PREFILL_NOTES[shape.name]
    return Measured({}, {}, details)


def llama_config(dims: ModelDims, tokens: int) -> Any:
    """transformers' ``LlamaConfig`` of ``dims`` for a ``tokens`` prompt, sdpa attention."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=dims.vocab, hidden_size=dims.hidden, intermediate_size=dims.intermediate,
        num_hidden_layers=dims.layers, num_attention_heads=dims.heads,
        num_key_value_heads=dims.kv_heads, head_dim=dims.head_size,
        max_position_embeddings=max(8192, tokens), tie_word_embeddings=False, use_cache=False,
    )  # fmt: skip
    try:
        config._attn_implementation = "sdpa"
    except (AttributeError, ValueError):  # a transformers without the setter: its default
        pass
    return config


def check_dims(model: Any, dims: ModelDims) -> None:
    """``Unavailable`` where this transformers built other heads than ``dims`` asks (one
    without ``head_dim`` in ``LlamaConfig`` makes them ``hidden // heads`` wide)."""
    built = model.model.layers[0].self_attn.q_proj.out_features
    if built != dims.heads * dims.head_size:
        raise Unavailable(f"transformers {_version()} built {built} query features, not "
                          f"{dims.heads} heads of {dims.head_size}")  # fmt: skip


def _version() -> str:
    import transformers

    return str(getattr(transformers, "__version__", "?"))


def _timed(model: Any, vocab: int, tokens: int, reps: int, clock: Clock) -> list[float]:
    """Seconds of ``reps`` prefills of a random ``tokens`` prompt, after one warm-up."""
    model.eval()
    device = clock.device
    generator = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, vocab, (1, tokens), generator=generator, device=device)

    def prefill() -> None:
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        model.lm_head(hidden[:, -1:])

    with torch.inference_mode():
        prefill()  # warm-up: kernels chosen, memory allocated
        return [clock.seconds(prefill) for _ in range(reps)]


def hit_over_prefill(load_s: dict[str, list[float]], prefill_s: list[float]) -> dict[str, Any]:
    """Per mechanism: the ``i``-th load's seconds over the ``i``-th prefill's (cycled)."""
    return {
        mechanism: summary([s / prefill_s[i % len(prefill_s)] for i, s in enumerate(loads)])
        for mechanism, loads in load_s.items()
    }


def _described(dims: ModelDims) -> dict[str, int]:
    return {"hidden": dims.hidden, "layers": dims.layers, "heads": dims.heads,
            "kv_heads": dims.kv_heads, "head_dim": dims.head_size,
            "intermediate": dims.intermediate, "vocab": dims.vocab}  # fmt: skip


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
