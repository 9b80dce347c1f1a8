"""The decode engine's pull of the request from the prefill engine, against raw TCP.

    measure(shape, tokens, device, reps, clock)   pull_ratio

Two engines of the shape on the device: the prefill side serves the request's blocks through a
``TransferServer`` over ``CudaBlockRows`` (``CpuBlockRows`` on the CPU), the decode side pulls
them into other scattered blocks through a ``TransferClient`` over its own rows, on 127.0.0.1,
with the peer tier's default connections (``TransferConfig``). Each rep offers the request anew
and times one ``pull`` (authenticated, checksummed, committed into the decode engine's blocks);
the blocks are checked against the prefill engine's after the reps. The bound: the same number of
bytes over one raw TCP connection on loopback (``common/loopback.py``). Per rep the two run back to
back, their order alternating. ``pull_profile``: the functions of two more pulls in the pulling
thread (it receives the first part, then waits for the others): where a pull's time goes.
"""

from __future__ import annotations

import contextlib
import time

import torch

from kvtier.apps.bench.common.loopback import Loopback
from kvtier.apps.bench.gpu import submit_profile
from kvtier.apps.bench.gpu.clock import Clock
from kvtier.apps.bench.gpu.figures import Measured, ratios, summary
from kvtier.apps.bench.gpu.request import Request, engine_blocks_for, same_pages
from kvtier.apps.bench.gpu.shapes import Shape, build_engine
from kvtier.layout import KVLayout
from kvtier.tiers.peer.config import TransferConfig
from kvtier.tiers.peer.net import (
    BlockRows,
    CpuBlockRows,
    CudaBlockRows,
    PeerIdentity,
    TransferClient,
    TransferServer,
)

SECRET = b"kvtier-bench-gpu-transfer-secret-0123"
TIMEOUT_S = 60.0


def measure(shape: Shape, tokens: int, device: torch.device, reps: int, clock: Clock) -> Measured:
    blocks = engine_blocks_for(shape, tokens)
    prefill = build_engine(shape, blocks, device, seed=10).layout
    decode = build_engine(shape, blocks, device, seed=11).layout
    request = Request.of(shape, prefill, tokens, seed=1)
    target = request.elsewhere(blocks, seed=2)
    remote, local = request.group_ids(request.engine), request.group_ids(target)
    identity = PeerIdentity((("model", f"bench-gpu-{shape.name}"), ("layout", prefill.describe())))
    connections = TransferConfig().connections
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(TransferServer(_rows(prefill), identity, SECRET,
                                                    io_timeout_s=TIMEOUT_S))  # fmt: skip
        client = stack.enter_context(TransferClient(_rows(decode), identity, SECRET,
                                                    timeout_s=TIMEOUT_S,
                                                    connections=connections))  # fmt: skip
        raw = Loopback.of(request.nbytes)
        stack.callback(raw.close)
        pulls = iter(range(1 << 30))

        def pull() -> None:
            req_id = f"bench-{next(pulls)}"
            server.offer(req_id, remote, time.monotonic() + TIMEOUT_S)
            received = client.pull(*server.address, req_id, remote, local)
            if received != request.nbytes:
                raise RuntimeError(f"pulled {received} bytes of {request.nbytes}")
            server.take_done()

        pull()  # warm-up: connections, staging buffers
        raw.stream()
        seconds: dict[str, list[float]] = {"raw": [], "kvtier": []}
        for rep in range(reps):
            pair = [("raw", raw.stream), ("kvtier", pull)]
            for side, fn in pair if rep % 2 == 0 else pair[::-1]:
                seconds[side].append(clock.seconds(fn))
        profile = submit_profile.top(pull, jobs=2)
    if not same_pages(decode, target, prefill, request.engine):
        raise RuntimeError("the pull brought other bytes than the prefill engine's")
    nbytes = request.nbytes
    details = {
        "bytes": nbytes, "connections": connections,
        "seconds": {name: summary(values) for name, values in seconds.items()},
        "gb_s": {name: round(nbytes / min(values) / 1e9, 2) for name, values in seconds.items()},
        "pull_profile": profile,
    }  # fmt: skip
    return Measured({"pull_ratio": ratios(seconds["raw"], seconds["kvtier"])}, {}, details)


def _rows(layout: KVLayout) -> BlockRows:
    if layout.device.type == "cuda":
        return CudaBlockRows(layout.views, layout.groups)
    return CpuBlockRows(layout.views, layout.groups)
