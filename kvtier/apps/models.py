"""Local models for tests, demos and benchmarks, built deterministically with no download.

    build_models(out_dir, names)     -> {name: dir}  builds the models that are missing or stale
    model_path(name, root=None)      -> dir          one model, built on demand
    python -m kvtier.apps.models --out DIR [--only NAME]  the same from the command line

Every model directory holds a byte-level BPE tokenizer trained on a built-in corpus and a random
Llama model (safetensors). The same code makes byte-identical files on every run. A directory is
complete once its marker file (written last, holding the spec's fingerprint) is present; an
incomplete or outdated one is rebuilt. Builds happen in a temporary sibling directory that is
renamed into place, so concurrent builders never see half a model.

The training text is ``corpus.py``'s; prompts made of it, ``prompts.py``'s.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvtier.apps.corpus import corpus_lines

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

    TokenizerSource = str | os.PathLike[str] | Tokenizer | PreTrainedTokenizerBase

BUILDER_VERSION = 1  # bump when the files built for an unchanged spec change
MARKER = ".kvtier-model-complete"
MODELS_DIR_ENV = "KVTIER_MODELS_DIR"

VOCAB_SIZE = 1536
UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD)  # ids 0, 1, 2, 3
INIT_STD = 0.02


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one random Llama model."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    intermediate_size: int
    max_position_embeddings: int
    dtype: str  # "float32" | "bfloat16": the dtype of the saved weights
    seed: int
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None


SPECS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(128, 4, 2, 32, 2, 256, 4096, "float32", seed=1),
    "bench": ModelSpec(1024, 16, 8, 64, 8, 2816, 8192, "bfloat16", seed=2),
    "hybrid": ModelSpec(
        128, 4, 2, 32, 4, 256, 4096, "float32", seed=3,
        layer_types=("sliding_attention", "full_attention") * 2, sliding_window=64,
    ),
}  # fmt: skip
MODEL_NAMES = tuple(SPECS)


# --- tokenizer ------------------------------------------------------------------------------------


def train_tokenizer() -> Tokenizer:
    """A byte-level BPE tokenizer trained on the built-in corpus; adds ``<s>`` to each input."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    bos_id = token_id(tokenizer, BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"token {token!r} is not in the tokenizer's vocabulary")
    return token_id


def _save_tokenizer(tokenizer: Tokenizer, out: Path, model_max_length: int) -> None:
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=model_max_length,
    )
    wrapped.save_pretrained(str(out))


# --- model ----------------------------------------------------------------------------------------


def _save_model(spec: ModelSpec, vocab_size: int, special_ids: dict[str, int], out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    extra: dict[str, Any] = {}
    if spec.layer_types is not None:
        extra.update(layer_types=list(spec.layer_types), sliding_window=spec.sliding_window)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=INIT_STD,
        bos_token_id=special_ids[BOS],
        eos_token_id=special_ids[EOS],
        pad_token_id=special_ids[PAD],
        tie_word_embeddings=False,
        dtype=spec.dtype,
        **extra,
    )
    dtype = getattr(torch, spec.dtype)
    # Shapes only on 'meta' (no init cost), then memory filled from one seeded generator in a
    # fixed parameter order: identical bytes on every run, whatever the global RNG state.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    # transformers wraps `.to` with functools.wraps, which mypy misreads as unbound
    model = model.to(dtype=dtype).to_empty(device="cpu")  # type: ignore[call-arg]
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
    model.save_pretrained(str(out))


# --- building -------------------------------------------------------------------------------------


def fingerprint(name: str) -> str:
    """Identity of what ``build_models`` writes for ``name``; stored in the marker file."""
    recipe = {
        "builder": BUILDER_VERSION,
        "name": name,
        "spec": asdict(SPECS[name]),
        "tokenizer": [VOCAB_SIZE, list(SPECIAL_TOKENS), _corpus_digest()],
        "init_std": INIT_STD,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


@functools.cache
def _corpus_digest() -> str:
    return hashlib.sha256("\n".join(corpus_lines()).encode()).hexdigest()


def is_complete(model_dir: Path, name: str) -> bool:
    """True when ``model_dir`` holds a finished build of the current spec of ``name``."""
    marker = model_dir / MARKER
    return marker.is_file() and marker.read_text().strip() == fingerprint(name)


def build_models(
    out_dir: Path,
    names: Iterable[str] = MODEL_NAMES,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Build each named model under ``out_dir/<name>`` unless a complete build is there already.

    Returns the directory of every named model. Raises ``ValueError`` for an unknown name.
    """
    names = list(names)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise ValueError(f"unknown model name(s) {unknown}; accepted: {list(SPECS)}")
    out_dir = Path(out_dir)
    tokenizer: Tokenizer | None = None
    paths: dict[str, Path] = {}
    for name in names:
        final = out_dir / name
        paths[name] = final
        if is_complete(final, name):
            if progress:
                progress(f"{name}: present in {final}")
            continue
        start = time.perf_counter()
        tokenizer = tokenizer or train_tokenizer()
        _build_one(name, tokenizer, final)
        if progress:
            progress(f"{name}: built in {time.perf_counter() - start:.1f} s -> {final}")
    return paths


def _build_one(name: str, tokenizer: Tokenizer, final: Path) -> None:
    spec = SPECS[name]
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        special_ids = {t: token_id(tokenizer, t) for t in SPECIAL_TOKENS}
        _save_tokenizer(tokenizer, tmp, spec.max_position_embeddings)
        _save_model(spec, tokenizer.get_vocab_size(), special_ids, tmp)
        (tmp / MARKER).write_text(fingerprint(name) + "\n")
        if final.exists() and not is_complete(final, name):
            shutil.rmtree(final)  # half-written or outdated
        try:
            os.rename(tmp, final)
        except OSError:
            if not is_complete(final, name):  # not a concurrent builder's finished copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def default_models_dir() -> Path:
    """``$KVTIER_MODELS_DIR``, else ``<repo>/models`` in a checkout, else ~/.cache/kvtier/models."""
    override = os.environ.get(MODELS_DIR_ENV)
    if override:
        return Path(override)
    repo = Path(__file__).resolve().parents[2]  # kvtier/apps/models.py
    if (repo / "pyproject.toml").is_file():
        return repo / "models"
    return Path.home() / ".cache" / "kvtier" / "models"


def model_path(name: str, root: Path | None = None) -> Path:
    """Directory of model ``name`` under ``root`` or ``default_models_dir()``; built if missing."""
    return build_models(root or default_models_dir(), [name])[name]


# --- command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvtier.apps.models", description="Build kvtier's local random models."
    )
    parser.add_argument(
        "--out", type=Path, help=f"root directory (default: ${MODELS_DIR_ENV} or <repo>/models)"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=MODEL_NAMES,
        metavar="NAME",
        help=f"build only this model (repeatable): {', '.join(MODEL_NAMES)}",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # one line per model is enough
    build_models(args.out or default_models_dir(), args.only or MODEL_NAMES, progress=print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
