"""``socket_dir``: a new directory of this user's only, ``VLLM_RPC_BASE_PATH`` pointing at it unless
set; removed with the sockets bound in it, and the variable restored, however the body ends. A
temporary directory too long for a socket's path is refused, named."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.apps.socket_dir import RPC_BASE, SUN_PATH_MAX, socket_dir


@pytest.fixture
def temp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of its own for ``tempfile`` (short: pytest's ``tmp_path`` can be
    too long for a socket's path)."""
    base = Path(tempfile.mkdtemp(prefix="kt-"))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    shutil.rmtree(base)


def _bind(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    return listener


def test_vllms_sockets_go_to_a_private_directory_removed_at_the_end(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(RPC_BASE, raising=False)
    with socket_dir() as directory:
        assert directory.parent == temp and directory.name.startswith("kvtier-")
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert os.environ[RPC_BASE] == str(directory)
        with _bind(directory / "01234567-89ab-cdef-0123-456789abcdef"), _bind(directory / "ev"):
            pass  # closed without unlinking, as a stopped engine leaves them
        assert len(list(directory.iterdir())) == 2
    assert list(temp.iterdir()) == []
    assert RPC_BASE not in os.environ


def test_an_error_inside_still_removes_it(temp: Path) -> None:
    with pytest.raises(SystemExit), socket_dir() as directory:
        (directory / "a-file").write_bytes(b"x")
        raise SystemExit(2)  # vLLM's argument parser, refusing an option
    assert list(temp.iterdir()) == []


def test_a_users_rpc_base_path_is_kept(temp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RPC_BASE, "/run/mine")
    with socket_dir() as directory:
        assert directory.is_dir() and os.environ[RPC_BASE] == "/run/mine"
    assert os.environ[RPC_BASE] == "/run/mine" and not directory.exists()


def test_a_temporary_directory_too_long_for_a_socket_path_is_refused_named(
    temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = temp / ("d" * (SUN_PATH_MAX - len(str(temp)) - 40))  # room for "/kvtier-…", not a uuid
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(ValueError, match="TMPDIR") as refused, socket_dir():
        pass
    assert str(deep) in str(refused.value)
    assert list(deep.iterdir()) == []  # nothing left of the attempt
