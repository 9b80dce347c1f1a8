"""The prefill side of ``kvtier bench transfer``, in its own process, and the bench engine.

    bench_engine(num_blocks, seed)   the bench model's KV layout on CPU tensors, one allocation
    PrefillProcess(num_blocks)       starts ``python -m kvtier.apps.bench.transfer.peer N``:
                                     a TransferServer, a raw TCP sender and, when it imports, a
                                     Mooncake TCP target over one bench engine's memory

The process speaks JSON lines: it first prints its addresses, ``{"kvtier": [host, port], "raw":
[host, port], "mooncake": {...} | "why not"}``; then for each line ``[[req_id, block_ids], ...]``
on its standard input it offers those requests and prints ``"ok"``. It ends when its standard
input closes.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import torch

from kvtier.apps.bench.transfer.mooncake import MooncakeTarget
from kvtier.apps.bench.transfer.report import BLOCK_TOKENS
from kvtier.apps.models import SPECS
from kvtier.layout import KVLayout, build_layout
from kvtier.tiers.peer.net import CpuBlockRows, PeerIdentity, TransferServer, wire

SECRET = b"kvtier-bench-transfer-secret-0123"
IDENTITY = PeerIdentity((("model", "bench"), ("dtype", "bfloat16"), ("block_tokens", "16")))
RAW_REQUEST = struct.Struct(">QQQ")  # message bytes, messages, start offset in the engine


class BenchEngine:
    """The bench model's CPU KV cache (vLLM's CPU layout per layer) in one allocation."""

    def __init__(self, num_blocks: int, seed: int | None) -> None:
        spec = SPECS["bench"]
        shape = (spec.num_hidden_layers, num_blocks, spec.num_key_value_heads, BLOCK_TOKENS,
                 2 * spec.head_dim)  # fmt: skip
        self.memory = torch.zeros(shape, dtype=torch.bfloat16)  # (layers, num_blocks, ...)
        if seed is not None:
            self.memory.view(torch.int16).random_(generator=torch.Generator().manual_seed(seed))
        caches = {f"layer.{i}": self.memory[i] for i in range(spec.num_hidden_layers)}
        self.layout: KVLayout = build_layout(caches, [list(caches)], num_blocks)
        self.rows = CpuBlockRows(self.layout.views, self.layout.groups)
        flat = self.memory.view(-1).view(torch.uint8)
        self.flat = memoryview(flat.numpy())  # type: ignore[arg-type]
        self.address = self.memory.data_ptr()

    @property
    def block_bytes(self) -> int:
        return sum(self.layout.page_bytes)


class PrefillProcess:
    """The prefill side in a child process, driven through its standard input and output."""

    def __init__(self, num_blocks: int, start_timeout_s: float = 120.0) -> None:
        command = [sys.executable, "-m", "kvtier.apps.bench.transfer.peer", str(num_blocks)]
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.addresses: dict[str, Any] = json.loads(self._read_line(start_timeout_s))

    def offer(self, offers: list[tuple[str, list[list[int]]]], timeout_s: float = 60.0) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(offers) + "\n")
        self._process.stdin.flush()
        if json.loads(self._read_line(timeout_s)) != "ok":
            raise RuntimeError("the prefill process did not take the offers")

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        if self._process.stdout is not None:
            self._process.stdout.close()

    def _read_line(self, timeout_s: float) -> str:
        assert self._process.stdout is not None
        ready = select.select([self._process.stdout], [], [], timeout_s)[0]
        line = self._process.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError(
                f"the prefill process ended or hung (exit status {self._process.returncode})"
            )
        return line


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    engine = BenchEngine(int(argv[0]), seed=0)
    server = TransferServer(engine.rows, IDENTITY, SECRET, io_timeout_s=60.0)
    raw = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_raw_sender, args=(raw, engine), daemon=True).start()
    mooncake: dict[str, Any] | str
    try:
        target = MooncakeTarget(engine.address, engine.flat.nbytes)
        mooncake = {"session": target.session, "address": engine.address}
    except Exception as e:  # an optional comparator: any failure is recorded, not raised
        mooncake = f"{type(e).__name__}: {e}"
    print(json.dumps({"kvtier": server.address, "raw": raw.getsockname()[:2],
                      "mooncake": mooncake}), flush=True)  # fmt: skip
    try:
        for line in sys.stdin:
            for req_id, block_ids in json.loads(line):
                server.offer(req_id, block_ids, time.monotonic() + 600)
            server.take_done()
            print(json.dumps("ok"), flush=True)
    finally:
        server.close()
        raw.close()
    return 0


def _raw_sender(listener: socket.socket, engine: BenchEngine) -> None:
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_send_stream, args=(sock, engine), daemon=True).start()


def _send_stream(sock: socket.socket, engine: BenchEngine) -> None:
    """One raw stream: ``messages`` sendall calls of ``message_bytes`` from the engine's memory."""
    with sock:
        wire.tune_socket(sock)
        request = bytearray(RAW_REQUEST.size)
        wire.recv_exact_into(sock, memoryview(request))
        message_bytes, messages, start = RAW_REQUEST.unpack(request)
        size = engine.flat.nbytes
        for i in range(messages):
            offset = (start + i * message_bytes) % size
            sock.sendall(engine.flat[offset : offset + message_bytes])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
