"""A ``kvtier serve``'s Unix sockets in a directory of its own, removed when the server returns.

    with socket_dir() as directory:   a new private directory (``mkdtemp``: this user only);
        ...                           vLLM's ZMQ sockets go there (``VLLM_RPC_BASE_PATH``, for
                                      the server and the engine processes it starts) unless the
                                      user set that variable; gone, with what is in it, when the
                                      body ends, however it ends

vLLM names its IPC sockets (API server ↔ engine core ↔ workers) by uuid in ``VLLM_RPC_BASE_PATH``,
the temporary directory by default, and a stopped server leaves them there: seven per start on
the CPU, and kvtier's two KV-event sockets beside them (``serve.kv_events_config``). Thousands
pile up in ``/tmp`` on a machine that starts servers all day. A process killed with SIGKILL
still leaves its directory; nothing in it is read again.

A Unix socket's path holds at most ``SUN_PATH_MAX`` bytes: a temporary directory too long for
vLLM's names raises ``ValueError`` naming it (vLLM would fail later, less clearly).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RPC_BASE = "VLLM_RPC_BASE_PATH"
SUN_PATH_MAX = 107  # bytes of a Unix socket's path on Linux (sun_path, less its NUL)
LONGEST_NAME = len("/01234567-89ab-cdef-0123-456789abcdef")  # vLLM's: a uuid4


@contextmanager
def socket_dir() -> Iterator[Path]:
    """A new directory for this process's sockets (and its children's), ``VLLM_RPC_BASE_PATH``
    pointing at it unless set; removed, and the variable restored, when the body ends."""
    directory = Path(tempfile.mkdtemp(prefix="kvtier-"))
    if len(os.fsencode(directory)) + LONGEST_NAME > SUN_PATH_MAX:
        directory.rmdir()
        raise ValueError(
            f"kvtier serve: the temporary directory {tempfile.gettempdir()!r} is too long for "
            f"a Unix socket's path ({SUN_PATH_MAX} bytes with vLLM's socket names); set TMPDIR "
            "to a shorter one"
        )
    given = os.environ.get(RPC_BASE)
    if given is None:
        os.environ[RPC_BASE] = str(directory)
    try:
        yield directory
    finally:
        if given is None:
            os.environ.pop(RPC_BASE, None)
        shutil.rmtree(directory, ignore_errors=True)
