"""What names a LoRA adapter's KV besides its name: its files.

    AdapterSalts()                one per scheduler connector
    .salt(lora_request) -> bytes  the key salt of a request's adapter (b"": no adapter)

vLLM's block hashes name an adapter by its name: an adapter trained again and saved under the
same name and path, or loaded in place (``load_inplace``), hashes alike. kvtier's disk and Redis
tiers outlive the engine, so their keys also take the adapter's files (``ChunkKeyMaker.keys``'
salt): the digest of its weights (``kvtier.checkpoint``) and its ``adapter_config.json`` (rank,
scaling, target modules). An adapter whose files are not on this machine (a Hugging Face name
not downloaded yet) is named by its path. An adapter's files are read again only when their
names, sizes or times change; looking that up costs a directory listing per request.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import xxhash

from kvtier.checkpoint import weights_digest
from kvtier.keys import SALT_BYTES
from kvtier.vllm.model_identity import local_checkpoint

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

logger = logging.getLogger(__name__)

CONFIG = "adapter_config.json"
_Signature = tuple[tuple[str, int, int], ...]


class AdapterSalts:
    def __init__(self) -> None:
        self._folders: dict[str, Path] = {}  # by path: where its files are
        self._read: dict[str, tuple[_Signature, bytes]] = {}  # by path: its files as read, salt

    def salt(self, lora: LoRARequest | None) -> bytes:
        if lora is None:
            return b""
        folder = self._folders.get(lora.lora_path) or local_checkpoint(lora.lora_path)
        if folder is not None:
            self._folders[lora.lora_path] = folder
        signature = _signature(folder) if folder is not None else None
        if folder is None or not signature:
            return _salt(b"path", lora.lora_path.encode())
        known = self._read.get(lora.lora_path)
        if known is not None and known[0] == signature:
            return known[1]
        try:
            weights = weights_digest(folder)
            config = (folder / CONFIG).read_bytes() if (folder / CONFIG).is_file() else b""
        except OSError as exc:  # replaced as it is read: named by its path, read next time
            logger.warning("kvtier: LoRA adapter %s's files could not be read (%s)",
                           lora.lora_name, exc)  # fmt: skip
            return _salt(b"path", lora.lora_path.encode())
        salt = _salt(b"files", (weights or "").encode(), config)
        self._read[lora.lora_path] = (signature, salt)
        return salt


def _signature(folder: Path) -> _Signature:
    """Its files' names, sizes and modification times (empty: none, or not a directory)."""
    if not folder.is_dir():
        return ()
    try:
        entries = [(e.name, e.stat()) for e in os.scandir(folder) if e.is_file()]
    except OSError:
        return ()
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in entries))


def _salt(kind: bytes, *parts: bytes) -> bytes:
    digest = xxhash.xxh3_128(kind)
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.digest()[:SALT_BYTES]
