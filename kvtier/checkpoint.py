"""What tells one checkpoint's weights from another's, read in milliseconds, not at load speed.

    weights_files(path)    -> [Path]       the files vLLM loads from ``path`` (none: not local)
    weights_digest(path)   -> str | None   hex, the same on every machine; None: no weight files

Two checkpoints of one architecture (a fine-tune and its base, two trainings of one fine-tune, a
model re-exported to the same directory) have files of the same names and sizes: only their bytes
differ. Reading them whole would take as long as loading the model, so each file counts by its
name, its size and ``SAMPLES`` pieces of ``SAMPLE_BYTES`` spread evenly over it (its header and
its end among them); a file of at most ``WHOLE_BYTES`` is read whole. A safetensors file also
counts by its whole header (every tensor's name, dtype, shape and place) and ``TENSOR_BYTES``
from the middle of each tensor: an edit of any whole tensor (a layer fine-tuned, an adapter
merged into a few projections, a model edited in one matrix) changes the digest. An edit of a
few values inside a tensor can fall between the pieces.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import BinaryIO

import xxhash

SAMPLES = 256
SAMPLE_BYTES = 4096
WHOLE_BYTES = 8 << 20
TENSOR_BYTES = 256
_MAX_HEADER = 100 << 20  # safetensors' own limit

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
            return
        last = size - SAMPLE_BYTES
        for i in range(SAMPLES):
            file.seek(i * last // (SAMPLES - 1))
            digest.update(file.read(SAMPLE_BYTES))
        if path.name.endswith(".safetensors"):
            _add_tensors(digest, file, size)


def _add_tensors(digest: xxhash.xxh3_128, file: BinaryIO, size: int) -> None:
    """A safetensors file's header, and the middle of each of its tensors (a file whose header
    cannot be read counts by its even pieces alone: vLLM will refuse it anyway)."""
    file.seek(0)
    length = int.from_bytes(file.read(8), "little")
    if not 0 < length <= min(_MAX_HEADER, size - 8):
        return
    header = file.read(length)
    digest.update(header)
    try:
        tensors = json.loads(header)
        spans = sorted(tuple(t["data_offsets"]) for k, t in tensors.items() if k != "__metadata__")
    except (ValueError, TypeError, KeyError, AttributeError):
        return
    base = 8 + length
    for begin, end in spans:
        if isinstance(begin, int) and isinstance(end, int) and 0 <= begin < end:
            file.seek(base + begin + max(0, end - begin - TENSOR_BYTES) // 2)
            digest.update(file.read(min(TENSOR_BYTES, end - begin)))
