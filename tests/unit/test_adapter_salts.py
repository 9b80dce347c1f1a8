"""A LoRA adapter's key salt: its files (weights and adapter_config.json), read again only when
they change; an adapter not on this machine is named by its path."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import huggingface_hub.constants
import pytest
from vllm.lora.request import LoRARequest

from kvtier.keys import SALT_BYTES
from kvtier.vllm.adapter_salts import AdapterSalts


def _adapter(folder: Path, weights: bytes = b"w" * 5000, alpha: int = 16) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_model.safetensors").write_bytes(weights)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": alpha}))
    return folder


def _lora(path: Path | str, name: str = "a") -> LoRARequest:
    return LoRARequest(name, 1, str(path))


def test_no_adapter_no_salt() -> None:
    assert AdapterSalts().salt(None) == b""


def test_an_adapter_is_named_by_its_files_wherever_they_are(tmp_path: Path) -> None:
    salts = AdapterSalts()
    first = salts.salt(_lora(_adapter(tmp_path / "a")))
    assert len(first) == SALT_BYTES
    copy = shutil.copytree(tmp_path / "a", tmp_path / "elsewhere")
    assert AdapterSalts().salt(_lora(copy)) == first
    assert salts.salt(_lora(tmp_path / "a")) == first  # again: the same


@pytest.mark.parametrize("change", ["weights", "config"])
def test_an_adapter_saved_again_in_place_is_named_anew(tmp_path: Path, change: str) -> None:
    """Trained again (other weights of the same size) or rescaled (its alpha), under the same
    name and path, while the engine runs."""
    salts = AdapterSalts()
    folder = _adapter(tmp_path / "a")
    before = salts.salt(_lora(folder))
    if change == "weights":
        _adapter(folder, weights=b"v" * 5000)
    else:
        _adapter(folder, alpha=32)
    stat = (folder / "adapter_config.json").stat()
    os.utime(folder / "adapter_config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert salts.salt(_lora(folder)) != before


def test_an_adapter_not_here_is_named_by_its_path(tmp_path: Path) -> None:
    salts = AdapterSalts()
    first = salts.salt(_lora("acme/not-downloaded"))
    assert len(first) == SALT_BYTES
    assert salts.salt(_lora("acme/not-downloaded", name="b")) == first
    assert salts.salt(_lora("acme/other")) != first
    assert salts.salt(_lora(tmp_path / "empty-dir")) not in (first, b"")


def test_a_hugging_face_adapter_is_read_from_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--acme--adapter" / "snapshots" / ("c" * 40)
    _adapter(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("c" * 40)
    local = AdapterSalts().salt(_lora(_adapter(tmp_path / "local")))
    assert AdapterSalts().salt(_lora("acme/adapter")) == local
