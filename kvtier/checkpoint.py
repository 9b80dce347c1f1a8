"""What tells one checkpoint's weights from another's, read in milliseconds, not at load speed.

    weights_files(path)    -> [Path]       the files vLLM loads from ``path`` (none: not local)
    weights_digest(path)   -> str | None   hex, the same on every machine; None: no weight files

Two checkpoints of one architecture (a fine-tune and its base, two trainings of one fine-tune, a
model re-exported to the same directory) have files of the same names and sizes: only their bytes
differ. Reading them whole would take as long as loading the model, so each file counts by its
name, its size and ``SAMPLES`` pieces of ``SAMPLE_BYTES`` spread evenly over it (its header and
its end among them); a file of at most ``WHOLE_BYTES`` is read whole. Two trainings differ in
nearly every weight, so the pieces differ; an edit confined to a few tensors can fall between them.
"""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

SAMPLES = 256
SAMPLE_BYTES = 4096
WHOLE_BYTES = 8 << 20

# the suffixes vLLM's default loader looks for, in its order of preference
_PREFERENCE = ((".safetensors",), (".bin",), (".pt", ".pth"))
_SINGLE_FILE = (".gguf", ".safetensors", ".bin", ".pt", ".pth")


def weights_files(path: str | os.PathLike[str]) -> list[Path]:
    """The weight files of the checkpoint at ``path``, sorted by name: a file given by itself,
    or a directory's top-level files of the first kind it holds (safetensors, then PyTorch's)."""
    where = Path(path)
    if where.is_file():
        return [where] if where.name.endswith(_SINGLE_FILE) else []
    if not where.is_dir():
        return []
    names = sorted(e.name for e in os.scandir(where) if e.is_file() or e.is_symlink())
    for suffixes in _PREFERENCE:
        chosen = [where / name for name in names if name.endswith(suffixes)]
        if chosen:
            return chosen
    return []


def weights_digest(path: str | os.PathLike[str]) -> str | None:
    """The digest of ``weights_files(path)``: their names, sizes and sampled bytes."""
    files = weights_files(path)
    if not files:
        return None
    digest = xxhash.xxh3_128()
    for weights in files:
        _add_file(digest, weights)
    return digest.hexdigest()


def _add_file(digest: xxhash.xxh3_128, path: Path) -> None:
    size = path.stat().st_size
    digest.update(path.name.encode() + b"\0" + size.to_bytes(8, "big"))
    with open(path, "rb") as file:
        if size <= WHOLE_BYTES:
            digest.update(file.read())
        else:
            last = size - SAMPLE_BYTES
            for i in range(SAMPLES):
                file.seek(i * last // (SAMPLES - 1))
                digest.update(file.read(SAMPLE_BYTES))
