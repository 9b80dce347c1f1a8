"""CUDA graphs captured on this thread, as vLLM captures them (CUDA's ``global`` mode), while a
16 GiB host tier is pinned on the pinning thread: ``python capture_beside_pinning.py`` prints one
JSON object, the captures made while it pinned and whether each replayed right, and whether the
whole tier was pinned (no registration refused). ``test_graphs_cuda.py`` runs it in a process of
its own, within a time limit: a capture that CUDA cannot end must not hold the other tests."""

from __future__ import annotations

import json
import sys
import time

import torch

from kvtier.layout import build_layout
from kvtier.tiers.host.buffers import HostTier

RECORD = 2 * 16 * 8 * 128 * 2 * 4  # K and V pages of 4 blocks of an 8B-class layer
LIMIT_S = 40.0


def main() -> None:
    kv = torch.zeros(2, 64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    layout = build_layout({"a": kv}, [["a"]], 64)
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    expected = x * 2 + 1
    host = HostTier(layout, (16 << 30) // RECORD, 4)  # 16 GiB: seconds of registrations
    assert host.pinning is not None
    captures, wrong, error = 0, 0, None
    deadline = time.monotonic() + LIMIT_S
    try:
        while not host.pinning.wait(0) and time.monotonic() < deadline:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # capture_error_mode "global", vLLM's
                y = x * 2 + 1
            y.zero_()
            graph.replay()
            torch.cuda.synchronize()
            wrong += not torch.equal(y, expected)
            captures += 1
    except Exception as e:  # a capture CUDA invalidated
        error = f"{type(e).__name__}: {e}"
    finished = host.pinning.wait(max(0.0, deadline - time.monotonic()))
    pinned = host.pinned
    host.close()
    json.dump({"captures": captures, "wrong": wrong, "error": error, "finished": finished,
               "pinned": pinned}, sys.stdout)  # fmt: skip


if __name__ == "__main__":
    main()
