"""A checkpoint's weights named by their files: the same bytes anywhere, other bytes apart."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from kvtier.checkpoint import SAMPLE_BYTES, SAMPLES, WHOLE_BYTES, weights_digest, weights_files


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _checkpoint(root: Path, seed: int = 0, size: int = 3000) -> Path:
    data = bytes((seed + i * 7) % 251 for i in range(size))
    _write(root / "config.json", b"{}")
    _write(root / "model-00001-of-00002.safetensors", data)
    _write(root / "model-00002-of-00002.safetensors", data[::-1])
    return root


def test_the_files_are_those_vllm_loads_in_its_order_of_preference(tmp_path: Path) -> None:
    both = _checkpoint(tmp_path / "both")
    _write(both / "pytorch_model.bin", b"older copy")
    _write(both / "original" / "consolidated.00.pth", b"not loaded")
    assert [f.name for f in weights_files(both)] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
    ]  # fmt: skip
    torch_only = tmp_path / "bin"
    _write(torch_only / "pytorch_model.bin", b"weights")
    _write(torch_only / "config.json", b"{}")
    assert weights_files(torch_only) == [torch_only / "pytorch_model.bin"]
    gguf = _write(tmp_path / "model-Q4_K_M.gguf", b"GGUF")
    assert weights_files(gguf) == [gguf]
    assert weights_files(tmp_path / "missing") == []
    assert weights_files(_write(tmp_path / "cfg" / "config.json", b"{}").parent) == []
    assert weights_digest(tmp_path / "cfg") is None


def test_the_same_weights_anywhere_have_one_digest(tmp_path: Path) -> None:
    first = _checkpoint(tmp_path / "a")
    copy = Path(shutil.copytree(first, tmp_path / "elsewhere" / "b"))
    os.utime(copy / "model-00001-of-00002.safetensors", (1, 1))  # another time: the same bytes
    assert weights_digest(first) == weights_digest(copy)
    assert len(weights_digest(first) or "") == 32


def test_other_bytes_names_or_sizes_give_another_digest(tmp_path: Path) -> None:
    base = weights_digest(_checkpoint(tmp_path / "base"))
    assert weights_digest(_checkpoint(tmp_path / "other", seed=1)) != base
    assert weights_digest(_checkpoint(tmp_path / "longer", size=3001)) != base
    renamed = _checkpoint(tmp_path / "renamed")
    (renamed / "model-00002-of-00002.safetensors").rename(renamed / "model-2.safetensors")
    assert weights_digest(renamed) != base
    edited = _checkpoint(tmp_path / "edited")
    shard = edited / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[1234] ^= 1  # a small file is read whole: any byte counts
    shard.write_bytes(bytes(data))
    assert weights_digest(edited) != base


def test_a_large_file_is_sampled_at_the_same_places_everywhere(tmp_path: Path) -> None:
    """Pieces spread over the whole file, its first and last bytes among them; a byte in a piece
    changes the digest."""
    size = WHOLE_BYTES + 12345
    data = bytearray(os.urandom(size))
    big = _write(tmp_path / "a" / "model.safetensors", bytes(data))
    digest = weights_digest(big.parent)
    step = (size - SAMPLE_BYTES) // (SAMPLES - 1)
    for where in (0, size - 1, 100 * step + SAMPLE_BYTES // 2):
        data[where] ^= 0xFF
        _write(tmp_path / f"at{where}" / "model.safetensors", bytes(data))
        assert weights_digest(tmp_path / f"at{where}") != digest
        data[where] ^= 0xFF
    _write(tmp_path / "same" / "model.safetensors", bytes(data))
    assert weights_digest(tmp_path / "same") == digest


def test_a_safetensors_file_edited_in_one_tensor_between_the_pieces_is_another(
    tmp_path: Path,
) -> None:
    """A model edited in one small tensor that no even piece reads (one layer's matrix):
    seen from the header's place of each tensor."""
    rng = np.random.default_rng(0)
    tensors = {f"layer.{i:03d}.weight": rng.standard_normal(6144, dtype=np.float32)
               for i in range(400)}  # fmt: skip  # 24 KiB each: 9.6 MB in all
    original = tmp_path / "a" / "model.safetensors"
    original.parent.mkdir()
    save_file(tensors, str(original))
    size = original.stat().st_size
    assert size > WHOLE_BYTES
    length = int.from_bytes(original.read_bytes()[:8], "little")
    header = json.loads(original.read_bytes()[8 : 8 + length])
    pieces = [i * (size - SAMPLE_BYTES) // (SAMPLES - 1) for i in range(SAMPLES)]
    spans = {name: [8 + length + at for at in t["data_offsets"]]
             for name, t in header.items() if name != "__metadata__"}  # fmt: skip
    unread = [name for name, (begin, end) in spans.items()
              if not any(p < end and begin < p + SAMPLE_BYTES for p in pieces)]  # fmt: skip
    assert unread, "every tensor meets an even piece: the layout of this test changed"
    edited = tmp_path / "b" / "model.safetensors"
    edited.parent.mkdir()
    save_file({**tensors, unread[0]: tensors[unread[0]] * 2}, str(edited))
    assert edited.stat().st_size == size
    assert weights_digest(edited.parent) != weights_digest(original.parent)
