"""``kvtier/pages/streams.py``: a job's stream entered and left as torch's context does (needs
CUDA)."""

from __future__ import annotations

import pytest
import torch

from kvtier.pages.streams import on_stream

pytestmark = pytest.mark.gpu


def test_work_inside_runs_on_the_stream_and_the_former_stream_comes_back() -> None:
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    former = torch.cuda.current_stream()
    with on_stream(side):
        assert torch.cuda.current_stream() == side
        torch.cuda._sleep(1 << 30)  # type: ignore[no-untyped-call]  # queued on side: ~0.5 s
    assert torch.cuda.current_stream() == former
    assert not side.query()  # the work went to side
    side.synchronize()


def test_the_former_stream_comes_back_when_the_work_raises() -> None:
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    former = torch.cuda.current_stream()
    with pytest.raises(RuntimeError, match="inside"), on_stream(side):
        raise RuntimeError("inside")
    assert torch.cuda.current_stream() == former
