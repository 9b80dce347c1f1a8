"""``TransferClient``: the decode rank's side; pulls a prefill request's rows into its own."""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from kvtier.connect import connect
from kvtier.tiers.peer.net import auth, wire
from kvtier.tiers.peer.net.base import (
    SLICE_BYTES,
    BlockRows,
    PeerIdentity,
    Rows,
    TransferError,
    request_rows,
    row_sizes,
    slices,
)
from kvtier.tiers.peer.net.pool import ConnectionPool

log = logging.getLogger(__name__)

MIN_PART_BYTES = 1 << 20  # a pull is split only into parts at least this large
WRITE_SLICE_BYTES = SLICE_BYTES  # rows received at once, then committed while the next arrive


@dataclass(frozen=True)
class _Pull:
    """What the parts of one pull share (``ready``: the engine's event its commits wait for)."""

    req_id: str
    remote: list[list[int]]
    ready: torch.cuda.Event | None


@dataclass(frozen=True)
class _Part:
    """Rows ``[start, stop)`` of a pull (``rows``), ``nbytes`` long."""

    start: int
    stop: int
    nbytes: int
    rows: Rows


class TransferClient:
    """Pulls offered requests from ``TransferServer``s into this rank's rows.

    ``pull`` may be called from several threads at once, to the same peer or others. Each peer
    has a pool of authenticated connections reused across pulls; a pull splits its rows over up to
    ``connections`` of them, the calling thread serving one part and helper threads (bound with
    ``rows.bind_thread``) the others: enough for ``concurrent_pulls`` pulls at once, so that no
    part waits for a helper held by another pull (one from a peer that hangs, say).
    ``timeout_s`` bounds every socket operation; it should exceed the server's ``offer_wait_s``.
    """

    def __init__(
        self,
        rows: BlockRows,
        identity: PeerIdentity,
        secret: bytes,
        *,
        timeout_s: float = 10.0,
        connections: int = 2,
        concurrent_pulls: int = 4,
    ) -> None:
        if connections < 1:
            raise ValueError(f"connections must be >= 1, got {connections}")
        if concurrent_pulls < 1:
            raise ValueError(f"concurrent_pulls must be >= 1, got {concurrent_pulls}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._rows = rows
        self._identity = identity
        self._secret = auth.check_secret(secret)
        self._timeout_s = timeout_s
        self._connections = connections
        self._lock = threading.Lock()
        self._pools: dict[tuple[str, int], ConnectionPool] = {}
        self._closed = False
        self._helpers = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, (connections - 1) * concurrent_pulls),
            thread_name_prefix="kvtier-pull",
            initializer=rows.bind_thread,
        )

    def pull(
        self,
        host: str,
        port: int,
        remote_req_id: str,
        remote_block_ids: Sequence[Sequence[int]],
        local_block_ids: Sequence[Sequence[int]],
        ready: torch.cuda.Event | None = None,
    ) -> int:
        """Receive the remote request's rows into the local blocks; returns the bytes received.

        Each part is received a slice at a time, each slice committed while the next arrives
        (after ``ready``, if given: ``BlockRows.wait_for``), all of it done on return. Raises
        ``TransferError`` on any failure, a checksum that differs included (the local blocks'
        contents are then undefined: the engine computes them again), ``ValueError`` when a
        group's remote and local lists differ in length. Always tells the server to release the
        offer."""
        _check_lengths(remote_block_ids, local_block_ids, len(self._rows.groups))
        rows = request_rows(self._rows.groups, local_block_ids)
        pool = self._pool(host, port)
        parts = _split(rows, self._rows.page_bytes, self._connections, MIN_PART_BYTES)
        request = _Pull(remote_req_id, [list(map(int, ids)) for ids in remote_block_ids], ready)
        errors: list[TransferError] = []
        ok = False
        try:
            if parts:
                errors = self._pull_parts(pool, request, parts)
            ok = not errors
        finally:
            self._release(pool, remote_req_id, ok)
        if errors:
            raise errors[0]
        return sum(part.nbytes for part in parts)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()
        self._helpers.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> TransferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pool(self, host: str, port: int) -> ConnectionPool:
        with self._lock:
            if self._closed:
                raise TransferError("transfer client is closed")
            pool = self._pools.get((host, port))
            if pool is None:
                pool = ConnectionPool(host, port, self._connect, max_idle=4 * self._connections)
                self._pools[(host, port)] = pool
            return pool

    def _connect(self, host: str, port: int) -> socket.socket:
        peer = f"peer {host}:{port}"
        try:
            sock = connect(host, port, self._timeout_s)  # the name lookup bounded too
        except OSError as e:
            raise TransferError(f"{peer}: cannot connect: {e}") from None
        try:
            wire.tune_socket(sock)
            auth.open_handshake(sock, self._secret, self._identity)
        except auth.HandshakeFailed as e:
            sock.close()
            separator = " " if e.reason.startswith("refused") else ": "
            raise TransferError(f"{peer}{separator}{e.reason}") from None
        except (OSError, wire.FrameError) as e:
            sock.close()
            raise TransferError(f"{peer}: handshake failed: {_describe(e)}") from None
        return sock

    def _pull_parts(
        self, pool: ConnectionPool, request: _Pull, parts: list[_Part]
    ) -> list[TransferError]:
        """Runs every part (the first in this thread); returns once none is still receiving."""
        try:
            futures = [
                self._helpers.submit(self._pull_part, pool, request, part) for part in parts[1:]
            ]
        except RuntimeError:  # shut down
            raise TransferError("transfer client is closed") from None
        errors: list[TransferError] = []
        try:
            self._pull_part(pool, request, parts[0])
        except TransferError as e:
            errors.append(e)
        finally:
            concurrent.futures.wait(futures)  # never return while a helper writes into the rows
        for future in futures:
            try:
                future.result()
            except TransferError as e:
                errors.append(e)
        return errors

    def _pull_part(self, pool: ConnectionPool, request: _Pull, part: _Part) -> None:
        req_id = request.req_id
        sock = pool.checkout()
        peer = f"peer {pool.host}:{pool.port}"
        reusable = False
        try:
            pull = wire.Pull(req_id, request.remote, part.start, part.stop, part.nbytes)
            sock.sendall(wire.encode_control(pull))
            header = wire.recv_header(sock)
            if header.kind == wire.Kind.REFUSAL:
                refusal = wire.recv_control(sock, header)
                assert isinstance(refusal, wire.Refusal)
                reusable = True
                raise TransferError(f"{peer} refused: {refusal.reason}")
            if header.kind != wire.Kind.DATA:
                raise wire.FrameError(f"expected DATA, got {header.kind.name}")
            if header.length != part.nbytes + wire.DIGEST_BYTES:
                raise TransferError(
                    f"{peer}: length mismatch for request {req_id!r}: "
                    f"{header.length - wire.DIGEST_BYTES} bytes sent, {part.nbytes} expected"
                )
            hasher = xxhash.xxh3_64()
            self._receive(sock, part, hasher, request)
            digest = bytearray(wire.DIGEST_BYTES)
            wire.recv_exact_into(sock, memoryview(digest))
            reusable = True
            if digest != hasher.digest():
                raise TransferError(
                    f"{peer}: checksum mismatch for request {req_id!r} "
                    f"(rows {part.start}..{part.stop})"
                )
        except (OSError, wire.FrameError) as e:
            raise TransferError(f"{peer}: pull of {req_id!r} failed: {_describe(e)}") from None
        finally:
            if reusable:
                pool.checkin(sock)
            else:
                sock.close()

    def _receive(self, sock: socket.socket, part: _Part, hasher: wire.Hasher, pull: _Pull) -> None:
        """``part``'s rows into the engine, a slice at a time, each committed (after
        ``pull.ready``) as the next arrives; every commit done on return, whatever failed."""
        if pull.ready is not None:
            self._rows.wait_for(pull.ready)
        try:
            for piece in slices(part.rows, self._rows.page_bytes, WRITE_SLICE_BYTES):
                wire.recv_rows(sock, self._rows.write_rows(piece), hasher)
                self._rows.commit(piece)
        finally:
            self._rows.flush()

    def _release(self, pool: ConnectionPool, req_id: str, ok: bool) -> None:
        """Best effort: an offer that is not released expires at its deadline on the server.
        After a failed pull only an idle connection is used (the peer may be unreachable)."""
        try:
            sock = pool.take_idle() or (pool.checkout() if ok else None)
        except TransferError as e:
            log.info("kvtier transfer: cannot release %r: %s", req_id, e)
            return
        if sock is None:
            return
        try:
            wire.send_control(sock, wire.Release(req_id, ok))
        except OSError as e:
            sock.close()
            log.info("kvtier transfer: cannot release %r: %s", req_id, e)
        else:
            pool.checkin(sock)


def _check_lengths(
    remote: Sequence[Sequence[int]], local: Sequence[Sequence[int]], groups: int
) -> None:
    if len(remote) != groups or len(local) != groups:
        raise ValueError(
            f"remote_block_ids has {len(remote)} groups, local_block_ids {len(local)}; "
            f"the layout has {groups}"
        )
    for g, (r, lo) in enumerate(zip(remote, local)):
        if len(r) != len(lo):
            raise ValueError(f"group {g}: {len(r)} remote_block_ids but {len(lo)} local_block_ids")


def _split(rows: Rows, page_bytes: tuple[int, ...], n: int, min_bytes: int = 1) -> list[_Part]:
    """Contiguous parts of about equal bytes: at most ``n``, none empty, none (but a single
    one) under ``min_bytes``. Part ``k`` ends at the first row where the bytes so far reach
    ``k / count`` of the total."""
    ends = np.cumsum(row_sizes(page_bytes, rows))
    total = int(ends[-1]) if len(ends) else 0
    count = max(1, min(n, len(rows), total // max(1, min_bytes)))
    parts: list[_Part] = []
    start = 0
    while start < len(rows):
        reach = -(-total * (len(parts) + 1) // count)
        stop = min(max(start, int(np.searchsorted(ends, reach))), len(rows) - 1) + 1
        before = int(ends[start - 1]) if start else 0
        parts.append(_Part(start, stop, int(ends[stop - 1]) - before, rows[start:stop]))
        start = stop
    return parts


def _describe(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "timed out"
    return str(e) or type(e).__name__
