"""The host tier's memory on CUDA: pinned while the engine serves, the engine's CUDA calls barely
waiting for it; on the GPU's NUMA node (needs CUDA)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from resident import PAGE, fresh, numa_policy

from kvtier.layout import build_layout
from kvtier.tiers.host.buffers import HostTier
from kvtier.tiers.host.numa import gpu_node, prefer_node
from kvtier.tiers.host.pin_driver import CudaDriver
from kvtier.tiers.host.pinning import PIECE_BYTES

pytestmark = pytest.mark.gpu

SLACK_S = 0.005  # the probe's own jitter beside a busy thread


def test_the_engines_cuda_calls_barely_wait_while_its_tier_is_pinned() -> None:
    """A probe of the engine's (a tiny kernel, then a synchronize), as its steps make, while a
    4 GiB tier is pinned: the driver's lock is held one short registration at a time."""
    kv = torch.zeros(2, 64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"a": kv}, [["a"]], 64)
    probe = torch.zeros(1024, device="cuda")

    def tick() -> float:
        started = time.perf_counter()
        probe.add_(1)
        torch.cuda.synchronize()
        return time.perf_counter() - started

    before = max(tick() for _ in range(200))
    record = 2 * 16 * 8 * 128 * 2 * 4  # K and V pages of 4 blocks
    host = HostTier(layout, (4 << 30) // record, 4)
    assert host.pinning is not None
    during = []
    deadline = time.monotonic() + 120
    while not host.pinning.wait(0) and time.monotonic() < deadline:
        during.append(tick())
    pinned, rate = host.pinned, host.pinning.rate()
    host.close()
    assert pinned and rate is not None
    assert len(during) >= 10, f"pinned in {len(during)} probes: nothing measured"
    # a probe takes the driver's lock twice (its launch, its synchronize): it may wait out one
    # registration each time, no more (256 MiB pieces the driver faulted in: 37-117 ms)
    one = _one_registration_s()
    stall = max(during) - before
    assert stall < 2 * one + SLACK_S, (stall, one, before, f"{rate / 1e9:.2f} GB/s")


def _one_registration_s() -> float:
    """The longest of three registrations, on this thread, of a piece faulted in before, as the
    pinning registers them: the bound of what the engine may wait for, measured here."""
    memory = np.ones(3 * PIECE_BYTES, dtype=np.uint8)  # every page written: faulted in
    driver = CudaDriver(torch.device("cuda", torch.cuda.current_device()))  # set_device needs one
    seconds = []
    for k in range(3):
        address = memory.ctypes.data + k * PIECE_BYTES
        started = time.perf_counter()
        assert driver.register(address, PIECE_BYTES) == 0
        seconds.append(time.perf_counter() - started)
        driver.unregister(address)
    return max(seconds)


def test_the_tier_prefers_its_gpus_numa_node() -> None:
    """On a machine of several nodes the tier's pages prefer the GPU's (its range a mapping of
    its own, ``prefer:N``); on one of one node, nothing is set."""
    kv = torch.zeros(2, 64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"a": kv}, [["a"]], 64)
    node = gpu_node(torch.device("cuda"))
    if node is not None and not _may_set_policies(node):
        pytest.skip("this process may not set a memory policy (numactl's, or a seccomp "
                    "without CAP_SYS_NICE): the tier lands where it is touched")  # fmt: skip
    host = HostTier(layout, 64, 4)
    try:
        assert host.node == node
        if node is not None:
            assert numa_policy(host.memory.data_ptr()) == f"prefer:{node}"
    finally:
        host.close()


def _may_set_policies(node: int) -> bool:
    """Whether a mapping of this process's may be given a NUMA policy (``prefer_node`` on a
    fresh page of its own)."""
    page = fresh(PAGE)
    return prefer_node(page.data_ptr(), PAGE, node)
