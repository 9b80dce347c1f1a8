"""A pull's rows are arrays, handed to the sockets as few byte views as their memory allows.

A 4,096-token request of a 70B model's tensor-parallel rank is 40,960 rows of 4 KiB: Python per
row (a pair, a call, a generator step) on both ends cost more than the wire on a GPU host. The
pull here is counted, not timed: the Python calls of a whole pull, both ends, do not grow with
its number of rows at the same bytes.
"""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path
from types import FrameType

import numpy as np
import pytest
import torch
from peer_setup import IDENTITY, SECRET, deadline, pairs

import kvtier
from kvtier.tiers.peer.net import CpuBlockRows, TransferClient, TransferServer, request_rows

KVTIER = str(Path(kvtier.__file__).parent)


def _rows(*pairs_: tuple[int, int]) -> np.ndarray:
    return np.array(pairs_, dtype=np.int64).reshape(-1, 2)


def test_rows_back_to_back_are_one_view_in_order() -> None:
    words = torch.arange(16 * 64, dtype=torch.int64).reshape(16, 64)
    packed = torch.arange(16 * 48, dtype=torch.int64).reshape(16, 48)[:, :32]  # rows 48 apart
    rows = CpuBlockRows([words, packed], [(0, 1)])
    asked = _rows((0, 3), (0, 4), (0, 5), (0, 9), (1, 2), (1, 3), (0, 10), (1, 4))
    views = rows.read_rows(asked)
    # blocks 3-5 of view 0 lie back to back; view 1's rows never do (16 words between them)
    assert [v.nbytes for v in views] == [3 * 512, 512, 256, 256, 512, 256]
    expected = b"".join(
        (words if view == 0 else packed)[block].numpy().tobytes() for view, block in pairs(asked)
    )
    assert b"".join(views) == expected
    assert rows.write_rows(asked[:0]) == []


def test_a_row_out_of_range_is_a_value_error_naming_it() -> None:
    rows = CpuBlockRows([torch.zeros(16, 64, dtype=torch.int64)], [(0,)])
    with pytest.raises(ValueError, match=r"block 16 out of range for view 0 \(16\)"):
        rows.write_rows(_rows((0, 2), (0, 16)))
    with pytest.raises(ValueError, match="block -1 out of range"):
        rows.read_rows(_rows((0, -1)))
    with pytest.raises(ValueError, match="rows name views 0..1; there are 1"):
        rows.read_rows(_rows((0, 2), (1, 2)))


def test_request_rows_of_a_large_request_are_one_array() -> None:
    groups = (tuple(range(160)),)
    rows = request_rows(groups, [list(range(256))])
    assert rows.shape == (160 * 256, 2) and rows.dtype == np.int64
    assert pairs(rows[255:258]) == [(0, 255), (1, 0), (1, 1)]


def _pull_calls(row_words: int, count: int) -> int:
    """Python calls made in kvtier's code, on every thread, by one pull of ``count`` scattered
    rows of ``row_words`` words (the connections' set-up included)."""
    blocks = 2 * count
    sides = [torch.randint(-(2**62), 2**62, (blocks, row_words)) for _ in "pd"]
    rng = random.Random(count)
    remote, local = [rng.sample(range(blocks), count)], [rng.sample(range(blocks), count)]
    calls = 0
    lock = threading.Lock()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(KVTIER):
            with lock:
                calls += 1

    threading.setprofile(profile)  # the server's and client's threads, started from here on
    sys.setprofile(profile)
    try:
        with (
            TransferServer(CpuBlockRows([sides[0]], [(0,)]), IDENTITY, SECRET) as server,
            TransferClient(CpuBlockRows([sides[1]], [(0,)]), IDENTITY, SECRET,
                           connections=1) as client,
        ):  # fmt: skip
            server.offer("req", remote, deadline())
            assert client.pull(*server.address, "req", remote, local) == count * row_words * 8
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert torch.equal(sides[0][remote[0]], sides[1][local[0]])
    return calls


def test_a_pull_makes_python_calls_per_slice_not_per_row() -> None:
    few = _pull_calls(row_words=1024, count=32)  # 32 rows of 8 KiB
    many = _pull_calls(row_words=128, count=256)  # 256 rows of 1 KiB: the same 256 KiB
    # per row, the old lists of pairs made several calls at each end (1,600 more here)
    assert many - few < (256 - 32) // 4, (few, many)
