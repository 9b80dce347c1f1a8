"""What a token's KV depends on besides the tokens before it: which weights, read how.

    model_identity(vllm_config) -> str   32 hex digits, the same on every engine of one model
    local_checkpoint(name, revision, download_dir) -> Path | None   where its files are here

Chunk keys and records are namespaced by it (``LayoutFingerprint.weights``), so that KV computed
by other weights is never loaded, wherever it is kept: two models served from one path (a
container's ``/mnt/models``), a fine-tune re-exported in place, another revision of a Hugging Face
model, the same weights quantized or with a config overridden (``--hf-overrides``, RoPE scaling).
It is made of:

- the model's config as vLLM uses it (overrides applied; its path, transformers' version and
  private fields left out),
- the quantization and the load format,
- the weights' digest (``kvtier.checkpoint``) where the weights are local files (a directory, a
  file, or Hugging Face's cache); otherwise the name, weights URI and revision, logged once;
- for a LongRoPE model, whether the engine's length picks the long factors;
- the same of a speculative decoding's draft model (EAGLE, a draft model, MTP's layers), whose
  layers' KV is in the engine's blocks too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.checkpoint import weights_digest

if TYPE_CHECKING:
    from vllm.config import LoadConfig, ModelConfig, VllmConfig

logger = logging.getLogger(__name__)

# config keys that name no KV (and every key starting with "_"): transformers' version, and what
# vLLM's model code writes into the config from the engine's length as it builds the model, in
# the workers only (Llama 4's query temperature, MiniMax-M2's RoPE table): kept, they would set
# the workers' records of engines of two lengths apart, each deleting the other's as foreign
_VOLATILE_CONFIG_KEYS = frozenset(
    {"transformers_version", "attn_temperature_tuning", "max_model_len"}
)
_SLOW_S = 2.0  # about 1 MiB read per weight file: milliseconds from the page cache


def model_identity(vllm_config: VllmConfig) -> str:
    target, load = vllm_config.model_config, vllm_config.load_config
    parts = _identity(target, load)
    spec = vllm_config.speculative_config
    draft = spec.draft_model_config if spec is not None else None
    if draft is not None and draft is not target:  # n-gram's is the target's own
        same = (draft.model, draft.revision) == (target.model, target.revision)  # MTP's layers
        parts["draft"] = _identity(draft, load, parts["weights"] if same else None)
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _identity(model: ModelConfig, load: LoadConfig, weights: str | None = None) -> dict[str, Any]:
    """What names one model's KV: its config, quantization, load format and ``weights`` (None:
    read)."""
    load_format = str(getattr(load.load_format, "value", load.load_format))
    if load_format == "dummy":
        weights = "dummy"  # vLLM's random weights, drawn from a fixed seed
    elif weights is None:
        weights = _weights(model, load)
    config = _plain(model.hf_config.to_dict())
    parts = {"config": config, "quantization": str(model.quantization),
             "load_format": load_format, "weights": weights}  # fmt: skip
    originals = _long_rope_contexts(config)
    if originals:  # LongRoPE (Phi-3, Phi-4-mini): the engine's length picks the factors
        parts["long_rope"] = [model.max_model_len > at if isinstance(at, int) else
                              model.max_model_len for at in originals]  # fmt: skip
    return parts


def _long_rope_contexts(config: Any, context: Any = None) -> list[Any]:
    """The original contexts of ``config``'s LongRoPE parameters (at any depth: a multimodal
    model's text config). vLLM rotates every position by the long factors when the engine's
    ``max_model_len`` exceeds that context, by the short ones otherwise: the same tokens' keys
    differ between engines on either side of it."""
    if isinstance(config, list):
        return [found for item in config for found in _long_rope_contexts(item, context)]
    if not isinstance(config, dict):
        return []
    context = config.get("original_max_position_embeddings", context)
    if config.get("rope_type", config.get("type")) == "longrope":
        return [context]
    return [found for item in config.values() for found in _long_rope_contexts(item, context)]


def _weights(model: ModelConfig, load: LoadConfig) -> str:
    """The digest of ``model``'s weight files, or (not local files) its name and revision."""
    started = time.perf_counter()
    folder = local_checkpoint(model.model, model.revision, load.download_dir)
    try:
        digest = weights_digest(folder) if folder is not None else None
    except OSError as exc:  # a file replaced or unreadable as the engine starts
        logger.warning("kvtier: %s's weight files could not be read (%s)", model.model, exc)
        digest = None
    if (spent := time.perf_counter() - started) > _SLOW_S:
        logger.warning("kvtier: sampling %s's weight files to name its KV took %.1f s (they "
                       "are not in the page cache)", model.model, spent)  # fmt: skip
    if digest is not None:
        return digest
    logger.info("kvtier: %s's weights are not local files: its KV is named by %s and revision "
                "%s, not by the weights themselves", model.model,
                model.model_weights or model.model, model.revision)  # fmt: skip
    return f"unread:{model.model_weights or model.model}@{model.revision}"


def local_checkpoint(
    name: str, revision: str | None = None, download_dir: str | None = None
) -> Path | None:
    """A model's or adapter's files on this machine: ``name`` itself (``~`` expanded), or its
    Hugging Face cache snapshot; None: not here."""
    if (local := Path(name).expanduser()).exists():
        return local
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            name, revision=revision, cache_dir=download_dir, local_files_only=True
        )
    except Exception:  # noqa: BLE001 - not a cached Hugging Face model: named, not read
        return None
    return Path(folder)


def _plain(value: Any) -> Any:
    """``value`` with only JSON's own types kept: a field holding anything else (an object, a
    dtype) is left out rather than written as a ``repr`` that may differ between processes."""
    if isinstance(value, dict):
        return {
            str(key): _plain(item)
            for key, item in value.items()
            if not str(key).startswith("_")
            and str(key) not in _VOLATILE_CONFIG_KEYS
            and _is_plain(item)
        }
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value if _is_plain(item)]
    return value


def _is_plain(value: Any) -> bool:
    if isinstance(value, dict | list | tuple):
        return True
    return value is None or isinstance(value, bool | int | float | str)
