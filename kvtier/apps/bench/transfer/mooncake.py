"""Mooncake's transfer engine over TCP, an optional comparator for ``kvtier bench transfer``.

Needs ``pip install mooncake-transfer-engine-non-cuda`` (and Debian's ``libibverbs1``); not a
kvtier dependency. Both ends use P2P handshake metadata (no etcd) on 127.0.0.1: the target
registers the prefill engine's memory, the reader registers the decode engine's and reads rows
with ``batch_transfer_sync_read`` (one entry per row, as kvtier pulls them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _engine() -> Any:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("mooncake TransferEngine.initialize failed")
    return engine


class MooncakeTarget:
    """The side whose memory is read (prefill)."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.engine = _engine()
        if self.engine.register_memory(address, nbytes) != 0:
            raise RuntimeError("mooncake register_memory failed")
        self.session = f"127.0.0.1:{self.engine.get_rpc_port()}"


class MooncakeReader:
    """The side that reads (decode) into its own registered memory."""

    def __init__(self, address: int, nbytes: int, session: str) -> None:
        self.engine = _engine()
        if self.engine.register_memory(address, nbytes) != 0:
            raise RuntimeError("mooncake register_memory failed")
        self.session = session

    def read(self, local: Sequence[int], remote: Sequence[int], lengths: Sequence[int]) -> None:
        status = self.engine.batch_transfer_sync_read(
            self.session, list(local), list(remote), list(lengths)
        )
        if status != 0:
            raise RuntimeError(f"mooncake batch_transfer_sync_read returned {status}")


def version() -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    for name in ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine"):
        try:
            return f"{name} {package_version(name)}"
        except PackageNotFoundError:
            continue
    return None
