"""``kvtier bench transfer``: prefill -> decode pulls over loopback TCP against raw TCP streams.

Both engines hold the bench model's KV cache in vLLM's CPU layout (8 layers, 8 KV heads, head_dim
64, bf16, 16-token blocks: 32 KiB per block per layer, 256 KiB per block). The prefill side runs
in its own process (``peer.py``), as it would in a deployment, with a ``TransferServer``,
a raw TCP sender and, when it imports, a Mooncake TCP target over the same memory. The decode side
(this process) moves the whole cache once per trial, in messages of one chunk each: 16, 64 and
256 tokens (256 KiB, 1 MiB and 4 MiB), by

    kvtier-1, kvtier-2   TransferClient.pull per chunk, of scattered random blocks into scattered
                         random blocks, over 1 or 2 connections (authenticated, checksummed)
    raw-1, raw-2         1 or 2 plain TCP streams of the same bytes: sendall of each chunk,
                         recv_into a preallocated buffer (the decode engine's memory), no protocol
    mooncake             Mooncake's batch_transfer_sync_read over TCP of the same scattered rows

Every trial of a repetition runs back to back, in an order rotated per repetition; the figure is
each method's throughput over raw-1's in the same repetition and chunk (min/median/max over the
repetitions). All sockets get the same options (TCP_NODELAY, 4 MiB buffers). Every method's
received bytes are checked against the source in the first repetition.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from kvtier.apps.bench.common.results import write_json
from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.transfer import mooncake, report
from kvtier.apps.bench.transfer.peer import (
    IDENTITY,
    RAW_REQUEST,
    SECRET,
    BenchEngine,
    PrefillProcess,
)
from kvtier.apps.bench.transfer.report import BLOCK_TOKENS, CHUNK_TOKENS, METHODS
from kvtier.tiers.peer.net import TransferClient, wire

START_TIMEOUT_S = 120.0


def run(out_dir: Path, quick: bool = False, console: Console | None = None) -> dict[str, Any]:
    """Measure, print a table, write ``transfer.json``, ``.md`` and ``.png`` under ``out_dir``
    (``quick``: 16 MiB a trial, 2 repetitions); the JSON document."""
    console = console or Console()
    total_bytes, reps = (16 << 20, 2) if quick else (256 << 20, 9)
    decode = BenchEngine(total_bytes // (256 << 10), seed=None)
    num_blocks = decode.layout.num_blocks
    prefill = PrefillProcess(num_blocks, START_TIMEOUT_S)
    try:
        peer = _Peer(prefill, decode)
        samples = _measure(peer, decode, reps, console)
    finally:
        prefill.close()
    rows = _rows(samples, decode.block_bytes)
    meta = {
        "layout": "bench model, vLLM CPU layout, 16-token blocks, 256 KiB per block",
        "bytes_per_trial": total_bytes,
        "repetitions": reps,
        "cpu_count": os.cpu_count(),
        "prefill": "a separate process (python -m kvtier.apps.bench.transfer.peer)",
        "socket_options": f"TCP_NODELAY, SO_SNDBUF/SO_RCVBUF {wire.SOCKET_BUFFER_BYTES} for all",
        "goals": {f"{k} / raw-1 at >= 1 MiB": v for k, v in report.GOALS.items()},
        "mooncake": peer.mooncake_status,
        "verified": peer.verified,
    }
    path = out_dir / "transfer.json"
    write_json(path, "transfer", rows, report.summary, **meta)
    report.plot(rows, out_dir / "transfer.png", [m for m in METHODS if m in peer.methods])
    report.print_table(rows, console)
    document: dict[str, Any] = json.loads(path.read_text())
    return document


class _Peer:
    """The decode side's ends of every method, toward the prefill process."""

    def __init__(self, prefill: PrefillProcess, decode: BenchEngine) -> None:
        self.prefill = prefill
        addresses = prefill.addresses
        self.kvtier, self.raw = tuple(addresses["kvtier"]), tuple(addresses["raw"])
        self.clients = {
            n: TransferClient(decode.rows, IDENTITY, SECRET, timeout_s=60.0, connections=n)
            for n in (1, 2)
        }
        self.methods = ["kvtier-1", "kvtier-2", "raw-1", "raw-2"]
        self.mooncake: mooncake.MooncakeReader | None = None
        self.mooncake_status = _mooncake_status(addresses["mooncake"])
        if isinstance(addresses["mooncake"], dict):
            try:
                self.mooncake = mooncake.MooncakeReader(
                    decode.address, decode.flat.nbytes, addresses["mooncake"]["session"]
                )
                self.remote_base = int(addresses["mooncake"]["address"])
                self.methods.append("mooncake")
            except Exception as e:  # optional comparator: recorded, not raised
                self.mooncake_status = {"available": False, "reason": f"{type(e).__name__}: {e}"}
        self.verified: dict[str, bool] = {}
        self._ids = 0

    def offer(self, messages: list[tuple[np.ndarray, np.ndarray]]) -> list[str]:
        ids = [f"r{self._ids + i}" for i in range(len(messages))]
        self._ids += len(messages)
        self.prefill.offer([(i, [src.tolist()]) for i, (src, _) in zip(ids, messages)])
        return ids

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def _mooncake_status(entry: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(entry, str):
        return {"available": False, "reason": entry, "package": mooncake.version()}
    return {"available": True, "package": mooncake.version(), "protocol": "tcp"}


def _measure(
    peer: _Peer, decode: BenchEngine, reps: int, console: Console
) -> dict[tuple[int, str], list[float]]:
    samples: dict[tuple[int, str], list[float]] = {}
    expected = BenchEngine(decode.layout.num_blocks, seed=0).memory.view(torch.int16)
    bits = decode.memory.view(torch.int16)
    try:
        for rep in range(reps):
            for tokens in CHUNK_TOKENS:
                blocks = tokens // BLOCK_TOKENS
                order = (
                    peer.methods[rep % len(peer.methods) :]
                    + peer.methods[: rep % len(peer.methods)]
                )
                for method in order:
                    check = rep == 0
                    if check:
                        decode.memory.zero_()
                    seconds, src, dst = _trial(peer, decode, method, blocks, rep)
                    if check:
                        moved = torch.equal(bits[:, dst], expected[:, src])  # NaNs: compare bits
                        peer.verified[f"{method}/{tokens}"] = bool(moved)
                    samples.setdefault((tokens, method), []).append(
                        decode.flat.nbytes / seconds / 1e9
                    )
            console.print(f"bench transfer: repetition {rep + 1}/{reps} done")
    finally:
        peer.close()
    return samples


def _trial(
    peer: _Peer, decode: BenchEngine, method: str, blocks: int, rep: int
) -> tuple[float, np.ndarray, np.ndarray]:
    """Seconds to move the whole cache in messages of ``blocks`` blocks by ``method``, and where
    the blocks went (source block ``src[i]`` to decode block ``dst[i]``)."""
    n = decode.layout.num_blocks
    if method.startswith("raw"):  # the same bytes, in place
        seconds = _raw(peer.raw, decode, int(method[-1]), blocks * decode.block_bytes)
        return seconds, np.arange(n), np.arange(n)
    rng = np.random.default_rng(rep * 1000 + blocks)
    src, dst = rng.permutation(n), rng.permutation(n)
    messages = [(src[i : i + blocks], dst[i : i + blocks]) for i in range(0, n, blocks)]
    if method == "mooncake":
        return _mooncake(peer, decode, messages), src, dst
    client = peer.clients[int(method[-1])]
    ids = peer.offer(messages)
    host, port = peer.kvtier
    started = time.perf_counter()
    for req_id, (remote, local) in zip(ids, messages):
        client.pull(host, port, req_id, [remote.tolist()], [local.tolist()])
    return time.perf_counter() - started, src, dst


def _raw(address: tuple[str, int], decode: BenchEngine, streams: int, message: int) -> float:
    total = decode.flat.nbytes
    share = total // streams
    sockets = [socket.create_connection(address, timeout=60) for _ in range(streams)]
    for sock in sockets:
        wire.tune_socket(sock)

    def receive(k: int) -> None:
        sockets[k].sendall(RAW_REQUEST.pack(message, share // message, k * share))
        view = decode.flat[k * share : (k + 1) * share]
        while view.nbytes:
            got = sockets[k].recv_into(view)
            if not got:
                raise ConnectionError("raw sender closed early")
            view = view[got:]

    started = time.perf_counter()
    threads = [threading.Thread(target=receive, args=(k,)) for k in range(1, streams)]
    for thread in threads:
        thread.start()
    receive(0)
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    for sock in sockets:
        sock.close()
    return elapsed


def _mooncake(
    peer: _Peer, decode: BenchEngine, messages: list[tuple[np.ndarray, np.ndarray]]
) -> float:
    assert peer.mooncake is not None
    page = decode.layout.page_bytes[0]
    layer = decode.layout.num_blocks * page  # bytes between two layers' block 0
    layers = np.arange(len(decode.layout.views)) * layer
    plans = []
    for src, dst in messages:
        remote = (peer.remote_base + layers[:, None] + src[None, :] * page).ravel().tolist()
        local = (decode.address + layers[:, None] + dst[None, :] * page).ravel().tolist()
        plans.append((local, remote, [page] * len(local)))
    started = time.perf_counter()
    for local, remote, lengths in plans:
        peer.mooncake.read(local, remote, lengths)
    return time.perf_counter() - started


def _rows(samples: dict[tuple[int, str], list[float]], block_bytes: int) -> list[dict[str, Any]]:
    rows = []
    for (tokens, method), gbps in samples.items():
        raw = samples[(tokens, "raw-1")]
        ratios = [a / b for a, b in zip(gbps, raw)]
        rows.append({
            "chunk_tokens": tokens,
            "message_bytes": tokens // BLOCK_TOKENS * block_bytes,
            "method": method,
            "gbps_median": round(median(gbps), 3),
            "gbps_min": round(min(gbps), 3),
            "gbps_max": round(max(gbps), 3),
            "ratio_to_raw_stream": round(median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
        })  # fmt: skip
    return sorted(rows, key=lambda r: (r["chunk_tokens"], METHODS.index(r["method"])))
