"""Prompts of English-like text for the local models, deterministic for a seed.

make_prompt(tokenizer, n, seed) -> [int]   exactly ``n`` token ids, the first ``<s>``
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

from kvtier.apps.corpus import sentence
from kvtier.apps.models import BOS, token_id

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

    TokenizerSource = str | os.PathLike[str] | Tokenizer | PreTrainedTokenizerBase


def make_prompt(
    tokenizer: TokenizerSource, num_tokens: int, seed: int, *, bos: bool = True
) -> list[int]:
    """Exactly ``num_tokens`` token ids of generated text, the first one ``<s>`` when ``bos``.

    ``tokenizer`` is a directory holding ``tokenizer.json`` (a model directory), a
    ``tokenizers.Tokenizer`` or a transformers fast tokenizer. The same seed gives the same ids.
    """
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    backend = _backend_tokenizer(tokenizer)
    rng = random.Random(seed)
    head = [token_id(backend, BOS)] if bos else []
    ids = list(head)
    while len(ids) < num_tokens:
        text = " ".join(sentence(rng) for _ in range(max(8, (num_tokens - len(ids)) // 8)))
        if len(ids) > len(head):
            text = " " + text
        ids.extend(backend.encode(text, add_special_tokens=False).ids)
    return ids[:num_tokens]


def _backend_tokenizer(tokenizer: TokenizerSource) -> Tokenizer:
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        path = Path(tokenizer)
        return Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TypeError(f"not a fast tokenizer: {type(tokenizer).__name__}")
    return backend
