"""On CUDA a job's tables (``kvtier/pages/uploads.py``) keep their memory until the work that
reads them is done, however long the stream is busy before it (needs CUDA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.pages import PageMover, Pages
from kvtier.pages.mechanism import Mechanism
from kvtier.pages.uploads import Uploads

pytestmark = pytest.mark.gpu


def test_a_slot_is_taken_again_only_once_the_work_queued_after_it_is_done() -> None:
    uploads = Uploads(torch.device("cuda"))
    torch.cuda._sleep(1 << 30)  # type: ignore[no-untyped-call]  # the stream, busy: ~0.5 s
    first = uploads.put(np.arange(100))
    uploads.queued()
    second = uploads.put(np.arange(100) + 1)  # the first's copy has not run yet
    uploads.queued()
    assert second.data_ptr() != first.data_ptr()
    torch.cuda.synchronize()
    assert first.tolist() == list(range(100)) and second.tolist() == list(range(1, 101))
    assert uploads.put(np.arange(3)).data_ptr() == first.data_ptr()


def test_jobs_queued_behind_busy_work_each_move_their_own_pages() -> None:
    """Eight stores queued while the stream is busy: each job's table is its own, and each
    moves the pages it named."""
    views = [torch.randint(0, 1 << 40, (64, 512), dtype=torch.int64, device="cuda")
             for _ in range(2)]  # fmt: skip
    mover = PageMover(views, mechanism=Mechanism.KERNEL)
    host = torch.zeros(16 * 4096, dtype=torch.uint8).pin_memory()
    blocks = [5, 9, 17, 40, 2, 63, 30, 11]
    torch.cuda._sleep(1 << 30)  # type: ignore[no-untyped-call]
    for job, block in enumerate(blocks):
        at = np.array([2 * job, 2 * job + 1]) * 4096
        mover.store(Pages(np.array([0, 1]), np.array([block, block]), at), host)
    assert not torch.cuda.current_stream().query()  # all of them queued behind the work
    torch.cuda.synchronize()
    rows = host.view(torch.int64).view(16, 512)
    for job, block in enumerate(blocks):
        assert torch.equal(rows[2 * job], views[0][block].cpu())
        assert torch.equal(rows[2 * job + 1], views[1][block].cpu())
    assert len(mover.uploads.slots) == len(blocks)
