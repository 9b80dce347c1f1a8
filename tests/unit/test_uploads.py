"""``kvtier/pages/uploads.py``: a job's tables reach the device through memory kept from job to
job, never memory a queued job may still read. On the CPU a copy is done when it returns; what a
queued CUDA copy holds is ``tests/gpu/test_uploads_cuda.py``'s."""

from __future__ import annotations

import numpy as np
import torch

from kvtier.pages import PageMover, Pages
from kvtier.pages.uploads import MOST_SLOTS, SMALLEST, Uploads

CPU = torch.device("cpu")


def test_an_upload_holds_the_tables_values_as_int64() -> None:
    uploads = Uploads(CPU)
    table = np.array([3, 1 << 40, -2], dtype=np.int64)
    got = uploads.put(table)
    assert got.dtype == torch.int64 and got.tolist() == table.tolist()
    assert uploads.put(np.arange(5, dtype=np.int32)).tolist() == [0, 1, 2, 3, 4]


def test_jobs_one_after_another_reuse_one_slots_memory() -> None:
    uploads = Uploads(CPU)
    first = uploads.put(np.arange(10)).data_ptr()
    uploads.queued()
    for job in range(5):
        got = uploads.put(np.arange(10) + job)
        uploads.queued()
        assert got.data_ptr() == first and got.tolist() == list(range(job, job + 10))
    assert len(uploads.slots) == 1


def test_tables_of_one_job_take_a_slot_each() -> None:
    """What ``put`` gave is read until ``queued``: a second table of the job must not land in
    the first one's memory."""
    uploads = Uploads(CPU)
    a = uploads.put(np.full(4, 7))
    b = uploads.put(np.full(4, 9))
    assert a.tolist() == [7] * 4 and b.tolist() == [9] * 4
    assert len(uploads.slots) == 2


def test_a_table_larger_than_its_slot_grows_the_slot() -> None:
    uploads = Uploads(CPU)
    uploads.put(np.arange(4))
    uploads.queued()
    big = np.arange(SMALLEST * 3)
    assert uploads.put(big).tolist() == big.tolist()
    uploads.queued()
    assert len(uploads.slots) == 1 and len(uploads.slots[0].host_np) == SMALLEST * 4


def test_past_the_most_slots_in_use_an_upload_goes_the_plain_way() -> None:
    uploads = Uploads(CPU)
    got = [uploads.put(np.full(3, i)) for i in range(MOST_SLOTS + 2)]
    assert [t.tolist() for t in got] == [[i] * 3 for i in range(MOST_SLOTS + 2)]
    assert len(uploads.slots) == MOST_SLOTS
    uploads.queued()
    assert uploads.put(np.arange(3)).data_ptr() == uploads.slots[0].device.data_ptr()


def test_a_movers_jobs_reuse_the_memory_of_their_tables() -> None:
    """The torch gather on the CPU, staged as on a GPU: a second job of the same pages takes
    no slot more than the first, and moves the same bytes."""
    views = [torch.arange(8 * 16, dtype=torch.int64).view(8, 16) + 1000 * v for v in range(3)]
    mover = PageMover(views, staged=True, triton=False)
    pages = Pages(np.repeat(np.arange(3), 4), np.tile([6, 1, 3, 0], 3), np.arange(12) * 128)
    stored, slots = [], []
    for _ in range(2):
        host = torch.zeros(12 * 128, dtype=torch.uint8)
        mover.store(pages, host)
        stored.append(host.view(torch.int64).view(12, 16))
        slots.append([slot.device.data_ptr() for slot in mover.uploads.slots])
    assert slots[0] == slots[1] and all(not slot.taken for slot in mover.uploads.slots)
    assert torch.equal(stored[0], stored[1])
    assert torch.equal(stored[0][0], views[0][6]) and torch.equal(stored[0][11], views[2][0])
