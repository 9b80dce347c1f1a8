"""Pulls into and out of CUDA engine memory through ``CudaBlockRows`` (needs CUDA).

Layout: FlashAttention's ``(2, num_blocks, block_size, kv_heads, head_size)``, so each layer is
two views (K and V); two groups of one layer each. Both ranks' rows are staged through pinned
host buffers; the server's and client's threads bind the device captured at construction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from kvtier.addresses import EngineBlocks
from kvtier.layout import build_layout
from kvtier.tiers.peer.messages import PeerBlocks
from kvtier.tiers.peer.net import (
    CpuBlockRows,
    CudaBlockRows,
    PeerIdentity,
    TransferClient,
    TransferServer,
    client,
    server,
)
from kvtier.tiers.peer.net.base import Rows
from kvtier.tiers.peer.worker import PeerLoadHandler

pytestmark = pytest.mark.gpu

NUM_BLOCKS = 24
SECRET = b"kvtier-gpu-test-secret-0123456789"
IDENTITY = PeerIdentity((("model", "gpu-test"), ("tp_size", "1"), ("tp_rank", "0")))
REMOTE, LOCAL = [[1, 5, 9, 2], [3, 4]], [[20, 0, 7, 8], [11, 23]]


class RecordingRows(CudaBlockRows):
    """Records, per call, the thread and the current CUDA device it ran on."""

    def __init__(self, views: Sequence[torch.Tensor], groups: Sequence[Sequence[int]]) -> None:
        super().__init__(views, groups)
        self.calls: list[tuple[str, str, int]] = []

    def _record(self, what: str) -> None:
        self.calls.append((what, threading.current_thread().name, torch.cuda.current_device()))

    def bind_thread(self) -> None:
        super().bind_thread()
        self._record("bind")

    def read_rows(self, rows: Rows) -> list[memoryview]:
        self._record("read")
        return super().read_rows(rows)

    def write_rows(self, rows: Rows) -> list[memoryview]:
        self._record("write")
        return super().write_rows(rows)


def _caches(device: str, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    caches = {
        name: torch.randn(2, NUM_BLOCKS, 16, 2, 64, generator=generator).to(device, torch.bfloat16)
        for name in ("full.0", "swa.0")
    }
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)  # written before the transfer threads' streams read them
    return caches


def _rows(caches: dict[str, torch.Tensor], cls: type = RecordingRows) -> CudaBlockRows:
    layout = build_layout(caches, [["full.0"], ["swa.0"]], NUM_BLOCKS)
    return cls(layout.views, layout.groups)  # type: ignore[no-any-return]


def _pull(src_rows: object, dst_rows: object, connections: int = 2) -> int:
    with (
        TransferServer(src_rows, IDENTITY, SECRET) as server,
        TransferClient(  # type: ignore[arg-type]
            dst_rows,
            IDENTITY,
            SECRET,
            connections=connections,  # type: ignore[arg-type]
        ) as client,
    ):
        server.offer("req", REMOTE, time.monotonic() + 30)
        return client.pull(*server.address, "req", REMOTE, LOCAL)


def _assert_copied(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> None:
    for name, (remote, local) in zip(("full.0", "swa.0"), zip(REMOTE, LOCAL)):
        a, b = src[name][:, remote].cpu(), dst[name][:, local].cpu()
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("connections", [1, 2])
def test_cuda_to_cuda_round_trip(connections: int) -> None:
    src, dst = _caches("cuda", 1), _caches("cuda", 2)
    received = _pull(_rows(src), _rows(dst), connections)
    assert received == 6 * 2 * 16 * 2 * 64 * 2
    _assert_copied(src, dst)


def test_cpu_prefill_to_cuda_decode() -> None:
    src, dst = _caches("cpu", 1), _caches("cuda", 2)
    layout = build_layout(src, [["full.0"], ["swa.0"]], NUM_BLOCKS)
    _pull(CpuBlockRows(layout.views, layout.groups), _rows(dst))
    _assert_copied(src, dst)


def test_threads_bind_the_captured_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "MIN_PART_BYTES", 1)  # split this small pull over helpers too
    index = torch.cuda.device_count() - 1  # not 0 when there are two devices
    torch.cuda.set_device(0)
    src, dst = _caches(f"cuda:{index}", 1), _caches(f"cuda:{index}", 2)
    src_rows, dst_rows = _rows(src), _rows(dst)
    _pull(src_rows, dst_rows)
    _assert_copied(src, dst)
    server_calls = [c for c in src_rows.calls if c[1] == "kvtier-transfer-conn"]  # type: ignore[attr-defined]
    assert {c[0] for c in server_calls} == {"bind", "read"}
    assert all(device == index for _, _, device in server_calls)
    helpers = [c for c in dst_rows.calls if c[1].startswith("kvtier-pull")]  # type: ignore[attr-defined]
    assert helpers and all(device == index for _, _, device in helpers)
    assert torch.cuda.current_device() == 0  # the caller's thread was left alone


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices"
)
def test_a_rank_on_the_second_device() -> None:
    src, dst = _caches("cuda:0", 1), _caches("cuda:1", 2)
    _pull(_rows(src), _rows(dst))
    _assert_copied(src, dst)
    assert all(t.device.index == 1 for t in dst.values())


@pytest.mark.parametrize("connections", [1, 2])
def test_a_pull_of_many_slices_is_exact(monkeypatch: pytest.MonkeyPatch, connections: int) -> None:
    """Slices of two pages: every slice after a part's first was read ahead on the device while
    the one before was sent, and committed while the next arrived."""
    monkeypatch.setattr(server, "READ_SLICE_BYTES", 2 * 16 * 2 * 64 * 2)
    monkeypatch.setattr(client, "WRITE_SLICE_BYTES", 2 * 16 * 2 * 64 * 2)
    monkeypatch.setattr(client, "MIN_PART_BYTES", 1)
    src, dst = _caches("cuda", 1), _caches("cuda", 2)
    assert _pull(_rows(src), _rows(dst), connections) == 6 * 2 * 16 * 2 * 64 * 2
    _assert_copied(src, dst)


def test_a_pull_lands_after_the_engine_work_queued_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step still in flight may write blocks just given to the pulled request: the handler's
    pull commits after the engine's stream as it was when the pull was asked for, on every
    thread of the pull, so the pulled bytes are what the blocks hold, not what the step wrote
    last. A first pull warms the threads (their movers, the kernels) outside the timing."""
    monkeypatch.setattr(client, "MIN_PART_BYTES", 1)  # parts on helper threads too
    src, dst = _caches("cuda", 1), _caches("cuda", 2)
    engine = EngineBlocks(np.array(LOCAL[0] + LOCAL[1]), (4, 2), (0, 0))
    with TransferServer(_rows(src, CudaBlockRows), IDENTITY, SECRET) as served:
        handler = PeerLoadHandler(TransferClient(_rows(dst, CudaBlockRows), IDENTITY, SECRET), 0,
                                  dst["full.0"].device)  # fmt: skip  # cuda:N, as vLLM's
        try:
            for job, req_id in enumerate(("warm", "req")):
                served.offer(req_id, REMOTE, time.monotonic() + 30)
                offer = PeerBlocks((served.address,), req_id, tuple(map(tuple, REMOTE)))
                if req_id == "req":
                    # the block ids on the device first: a list index would be copied there
                    # with a synchronize, after the busy work, not queued behind it
                    ids = [torch.tensor(local, device="cuda") for local in LOCAL]
                    torch.cuda._sleep(500_000_000)  # type: ignore[no-untyped-call]  # busy
                    for name, index in zip(("full.0", "swa.0"), ids):
                        dst[name].index_fill_(1, index, 0)  # the step in flight writes last
                assert handler.transfer_async(job, offer, engine)
                if req_id == "req":
                    assert not torch.cuda.current_stream().query()  # the step still in flight
                handler.wait([job])
                (result,) = handler.get_finished()
                assert result.success
            torch.cuda.synchronize()
        finally:
            handler.shutdown()
    _assert_copied(src, dst)


def test_a_request_of_an_8b_shape_in_16_mib_slices() -> None:
    """Four layers of an 8B-class model (32 KiB pages), 400 blocks scattered each side: 100 MiB
    in slices of 16 MiB over two connections, byte-exact."""
    blocks, layers = 512, 4
    generator = torch.Generator(device="cuda").manual_seed(3)
    caches = [
        {
            f"layer.{i}": torch.randn(2, blocks, 16, 8, 128, device="cuda", generator=generator).to(
                torch.bfloat16
            )
            for i in range(layers)
        }  # fmt: skip
        for _ in range(2)
    ]
    torch.cuda.synchronize()  # written before the transfer threads' streams read them
    order = torch.randperm(blocks, generator=torch.Generator().manual_seed(4)).tolist()
    remote, local = [order[:400]], [order[100:500]]
    rows = [build_layout(c, [list(c)], blocks) for c in caches]
    with (
        TransferServer(CudaBlockRows(rows[0].views, rows[0].groups), IDENTITY, SECRET) as served,
        TransferClient(CudaBlockRows(rows[1].views, rows[1].groups), IDENTITY, SECRET) as puller,
    ):
        served.offer("req", remote, time.monotonic() + 30)
        assert puller.pull(*served.address, "req", remote, local) == 400 * 2 * layers * 32768
    for name in caches[0]:
        a, b = caches[0][name][:, remote[0]].cpu(), caches[1][name][:, local[0]].cpu()
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name
