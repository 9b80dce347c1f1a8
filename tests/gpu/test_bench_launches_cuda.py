"""``kvtier bench gpu``'s sweep of the grid kernel's launches (``launches.py``), on CUDA: every
launch it times moves the request byte for byte, and is timed both ways (needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from kvtier.apps.bench.gpu import launches
from kvtier.apps.bench.gpu.host_copy import HostRig
from kvtier.apps.bench.gpu.shapes import SHAPES, Shape

pytestmark = pytest.mark.gpu

MLA_2 = Shape("mla-2", "two MLA layers", 2, (64, 576), False)  # 72 KiB pages: 2.25 steps


@pytest.mark.parametrize(("shape", "tokens"), [(SHAPES["tiny"], 2048), (MLA_2, 1024)])
def test_every_launch_the_sweep_times_moves_the_request_and_is_timed(
    shape: Shape, tokens: int
) -> None:
    rig = HostRig(shape, tokens, torch.device("cuda"), only=("kernel",))
    try:
        measured = launches.measure(rig, reps=2)
    finally:
        rig.close()
    rows = measured.details["launches"]
    assert [row["launch"] for row in rows][0] == measured.details["chosen"]
    assert len(rows) >= 4
    for row in rows:
        assert "error" not in row and row["intact"] is True, row
        assert 0 < row["store"]["median"] and 0 < row["load"]["median"], row
    assert set(measured.details["fastest"]) == {"store", "load"}
