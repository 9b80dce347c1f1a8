"""``TransferServer``: the prefill rank's side; keeps offers and serves authenticated pulls."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields

import xxhash

from kvtier.tiers.peer.net import auth, wire
from kvtier.tiers.peer.net.base import (
    SLICE_BYTES,
    BlockRows,
    PeerIdentity,
    Rows,
    request_rows,
    row_bytes,
    slices,
)
from kvtier.tiers.peer.net.offers import OfferTable, Refused

log = logging.getLogger(__name__)

ACCEPT_TICK_S = 0.5  # how often the accept loop checks for close() if shutdown did not wake it
CLOSE_JOIN_S = 2.0  # close() waits at most this long for the server's threads
READ_SLICE_BYTES = SLICE_BYTES  # rows read at once while serving (CUDA: staged in pinned memory)


@dataclass(frozen=True)
class ServerCounters:
    connections: int = 0  # accepted (refused ones included)
    auth_failures: int = 0  # wrong proof in the handshake
    refused: int = 0  # bad frames, differing identities, refused pulls, too many connections
    pulls: int = 0  # pull parts served
    bytes_sent: int = 0  # row bytes served
    expired: int = 0  # offers whose deadline passed
    errors: int = 0  # connections ended by an I/O failure or an unexpected exception


class TransferServer:
    """Serves one prefill rank's offered blocks to authenticated decode ranks (pull model).

    Binds and starts accepting in the constructor. Each connection is served by its own thread
    (at most ``max_connections``; more are refused); a failure in one closes only that one.
    ``offer``/``withdraw``/``take_done`` are for the engine's thread. ``close`` is idempotent and
    returns within a few seconds whatever the peers do.
    """

    def __init__(
        self,
        rows: BlockRows,
        identity: PeerIdentity,
        secret: bytes,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_connections: int = 64,
        offer_wait_s: float = 5.0,
        io_timeout_s: float = 10.0,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if offer_wait_s < 0 or io_timeout_s <= 0:
            raise ValueError(
                f"bad timeouts: offer_wait_s={offer_wait_s} io_timeout_s={io_timeout_s}"
            )
        self._rows = rows
        self._identity = identity
        self._secret = auth.check_secret(secret)
        self._max_connections = max_connections
        self._offer_wait_s = offer_wait_s
        self._io_timeout_s = io_timeout_s
        self._offers = OfferTable()
        self._lock = threading.Lock()
        self._counts = {f.name: 0 for f in fields(ServerCounters)}
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._closed = False
        self._listener = socket.create_server((host, port), backlog=max_connections)
        self._listener.settimeout(ACCEPT_TICK_S)
        self._address: tuple[str, int] = self._listener.getsockname()[:2]
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"kvtier-transfer-accept-{self._address[1]}", daemon=True
        )
        self._acceptor.start()

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def counters(self) -> ServerCounters:
        with self._lock:
            counts = dict(self._counts)
        counts["expired"] = self._offers.expired
        return ServerCounters(**counts)

    def offer(self, req_id: str, block_ids: Sequence[Sequence[int]], deadline: float) -> None:
        """Let a decode pull these blocks (per group) of ``req_id`` until ``time.monotonic()``
        passes ``deadline``; the engine keeps them until ``take_done`` reports the request."""
        if len(block_ids) != len(self._rows.groups):
            raise ValueError(
                f"offer {req_id!r}: {len(block_ids)} lists of block ids, {len(self._rows.groups)} "
                "groups"
            )
        self._offers.offer(req_id, block_ids, deadline)

    def take_done(self) -> list[tuple[str, bool]]:
        """Offers ended since the last call, each once, once no connection reads their blocks:
        ``(req_id, True)`` pulled and released, ``(req_id, False)`` expired, withdrawn, or
        released by a client whose pull failed. Expires overdue offers first."""
        return self._offers.take_done()

    def wait_done(self, timeout: float) -> None:
        """Block until ``take_done`` has something to report, at most ``timeout`` (an idle
        engine waiting for its offers to be pulled)."""
        self._offers.wait_done(timeout)

    def withdraw(self, req_id: str) -> None:
        self._offers.withdraw(req_id)

    def check_integrity(self) -> None:
        self._offers.check_integrity()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for sock in self._connections:
                _shutdown(sock)
            threads = list(self._connections.values())
        self._offers.close()
        _shutdown(self._listener)
        self._listener.close()
        give_up = time.monotonic() + CLOSE_JOIN_S
        for thread in [self._acceptor, *threads]:
            thread.join(max(0.0, give_up - time.monotonic()))

    def __enter__(self) -> TransferServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- connections ------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed:
                    return
                log.exception("kvtier transfer: accept failed on %s", self._address)
                time.sleep(ACCEPT_TICK_S)  # e.g. out of file descriptors: do not spin
                continue
            self._count("connections")
            with self._lock:
                admitted = not self._closed and len(self._connections) < self._max_connections
                if admitted:
                    thread = threading.Thread(
                        target=self._serve, args=(sock, peer), name="kvtier-transfer-conn",
                        daemon=True,
                    )  # fmt: skip
                    self._connections[sock] = thread
                    thread.start()
            if not admitted:
                self._count("refused")
                log.warning("kvtier transfer: refused %s: too many connections", peer)
                _send_refusal(sock, "too many connections")
                sock.close()

    def _serve(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        try:
            self._rows.bind_thread()
            wire.tune_socket(sock)
            sock.settimeout(self._io_timeout_s)
            auth.serve_handshake(sock, self._secret, self._identity)
            while True:
                header = wire.recv_header(sock, idle=True)
                message = wire.recv_control(sock, header)
                if isinstance(message, wire.Pull):
                    self._serve_pull(sock, message)
                elif isinstance(message, wire.Release):
                    self._offers.release(message.req_id, message.ok)
                else:
                    raise wire.FrameError(f"unexpected {header.kind.name} frame")
        except wire.PeerClosed:
            pass
        except auth.HandshakeFailed as e:
            self._count("auth_failures" if e.auth else "refused")
            log.warning("kvtier transfer: refused %s: %s", peer, e.reason)
            _send_refusal(sock, e.reason)
        except wire.FrameError as e:
            self._count("refused")
            log.info("kvtier transfer: refused %s: %s", peer, e)
            _send_refusal(sock, f"malformed frame: {e}")
        except OSError as e:
            if not self._closed:
                self._count("errors")
                log.info("kvtier transfer: connection from %s failed: %s", peer, e)
        except Exception:
            self._count("errors")
            log.exception("kvtier transfer: connection from %s failed", peer)
        finally:
            with self._lock:
                self._connections.pop(sock, None)
                sock.close()

    def _serve_pull(self, sock: socket.socket, pull: wire.Pull) -> None:
        try:
            offer = self._offers.claim(pull.req_id, pull.block_ids, self._offer_wait_s)
        except Refused as e:
            self._refuse_pull(sock, str(e))
            return
        try:
            rows = request_rows(self._rows.groups, pull.block_ids)
            if not pull.start <= pull.stop <= len(rows):
                raise Refused(f"rows [{pull.start}, {pull.stop}) of {len(rows)}")
            part = rows[pull.start : pull.stop]
            nbytes = row_bytes(self._rows.page_bytes, part)
            if nbytes != pull.nbytes:
                raise Refused(f"length mismatch: {pull.nbytes} bytes asked, {nbytes} here")
        except Refused as e:
            self._offers.unclaim(offer)
            self._refuse_pull(sock, str(e))
            return
        try:
            self._send(sock, part, nbytes)
        finally:
            self._offers.unclaim(offer)

    def _send(self, sock: socket.socket, rows: Rows, nbytes: int) -> None:
        hasher = xxhash.xxh3_64()
        head = wire.encode_header(wire.Kind.DATA, nbytes + wire.DIGEST_BYTES, wire.CHECKSUM_XXH3_64)
        pieces = slices(rows, self._rows.page_bytes, READ_SLICE_BYTES)
        try:
            for i, piece in enumerate(pieces):
                views = self._rows.read_rows(piece)
                if i + 1 < len(pieces):
                    self._rows.read_ahead(pieces[i + 1])  # read while this piece is sent
                wire.send_rows(sock, head, views, hasher)
                head = b""
        finally:
            self._rows.flush()  # no read of the engine's blocks left once the offer is let go
        if head:
            sock.sendall(head)  # no rows
        with self._lock:  # counted before the client can see the end of the data
            self._counts["pulls"] += 1
            self._counts["bytes_sent"] += nbytes
        sock.sendall(hasher.digest())

    def _refuse_pull(self, sock: socket.socket, reason: str) -> None:
        self._count("refused")
        log.info("kvtier transfer: refused a pull: %s", reason)
        wire.send_control(sock, wire.Refusal(reason))

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or already closed


def _send_refusal(sock: socket.socket, reason: str) -> None:
    try:
        sock.settimeout(0.5)
        wire.send_control(sock, wire.Refusal(reason))
    except OSError:
        pass  # the peer is gone already; the refusal is counted by the caller
