"""``kvtier bench gpu``'s timing of each call a host job's submit makes (needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from kvtier.apps.bench.gpu import call_costs

pytestmark = pytest.mark.gpu


def test_every_call_of_a_submit_is_timed_apart() -> None:
    costs = call_costs.measure(torch.device("cuda"))
    assert {"event_record", "stream_context", "on_stream", "pin_and_upload", "uploads_put",
            "grid_launch", "mover_store"} <= set(costs)  # fmt: skip
    assert all(0 < us < 10_000 for us in costs.values()), costs
