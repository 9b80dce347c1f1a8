"""Every way a pull fails ends in a ``TransferError`` that says what failed, within the timeout;
the server counts it and keeps serving."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest
import xxhash
from peer_setup import IDENTITY, SECRET, WAIT_S, Engine, StallingRows, deadline, peers, wait_done

from kvtier.tiers.peer.net import PeerIdentity, TransferClient, TransferError, auth, server, wire
from kvtier.tiers.peer.net import client as client_module

REMOTE, LOCAL = [[1, 2], [3]], [[4, 5], [6]]


@pytest.fixture(autouse=True)
def split_every_pull(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts of any size, so these few-KiB pulls use every connection."""
    monkeypatch.setattr(client_module, "MIN_PART_BYTES", 1)


def test_wrong_secret_is_refused_on_both_sides() -> None:
    other = b"another-secret-0123456789abcdef"
    with peers(connections=1, client_secret=other) as (_, srv, decode, client):
        srv.offer("req", REMOTE, deadline())
        with pytest.raises(TransferError, match="refused: authentication failed"):
            client.pull(*srv.address, "req", REMOTE, LOCAL)
        assert srv.counters.auth_failures == 1 and decode.rows.commits == []
        assert srv.take_done() == []  # the offer is still there for the right client


def test_a_server_without_the_secret_is_not_trusted() -> None:
    _expect_failure(lambda sock, pull: None, "server's proof is wrong", handshake=_impostor)


def test_different_identity_is_refused_naming_the_fields() -> None:
    other = PeerIdentity(tuple((k, "4" if k == "tp_size" else v) for k, v in IDENTITY.fields))
    with peers(connections=1, client_identity=other) as (_, srv, _decode, client):
        srv.offer("req", REMOTE, deadline())
        with pytest.raises(TransferError, match=r"identity differs .*tp_size '4' != '1'"):
            client.pull(*srv.address, "req", REMOTE, LOCAL)
        assert srv.counters.refused == 1 and srv.counters.auth_failures == 0


def test_expired_offer_is_refused_and_reported_not_pulled() -> None:
    with peers() as (_, srv, decode, client):
        srv.offer("req", REMOTE, time.monotonic() - 0.001)
        with pytest.raises(TransferError, match="'req' expired"):
            client.pull(*srv.address, "req", REMOTE, LOCAL)
        assert srv.take_done() == [("req", False)]
        assert srv.counters.expired == 1 and decode.rows.commits == []


def test_take_done_expires_an_offer_nobody_pulled() -> None:
    with peers() as (_, srv, _decode, _client):
        srv.offer("soon", REMOTE, time.monotonic() + 0.05)
        srv.offer("later", REMOTE, deadline())
        give_up = time.monotonic() + WAIT_S
        while (done := srv.take_done()) == [] and time.monotonic() < give_up:
            time.sleep(0.01)
        assert done == [("soon", False)]
        srv.withdraw("later")
        assert srv.take_done() == [("later", False)] and srv.take_done() == []


def test_pull_before_offer_waits_for_it() -> None:
    with peers(offer_wait_s=WAIT_S, timeout_s=2 * WAIT_S) as (prefill, srv, decode, client):
        waiting = threading.Event()
        original = srv._offers.claim

        def claim(*args: object) -> object:
            waiting.set()
            return original(*args)  # type: ignore[arg-type]

        srv._offers.claim = claim  # type: ignore[method-assign]
        result: list[int] = []
        puller = threading.Thread(
            target=lambda: result.append(client.pull(*srv.address, "req", REMOTE, LOCAL))
        )
        puller.start()
        assert waiting.wait(WAIT_S)
        srv.offer("req", REMOTE, deadline())  # the prefill engine's next step
        puller.join(2 * WAIT_S)
        assert result == [2 * 1024 + 256] and wait_done(srv, 1) == [("req", True)]


def test_unknown_request_is_refused_after_offer_wait() -> None:
    with peers(offer_wait_s=0.2) as (_, srv, _decode, client):
        started = time.monotonic()
        with pytest.raises(TransferError, match="refused: unknown request 'nope'"):
            client.pull(*srv.address, "nope", REMOTE, LOCAL)
        assert 0.2 <= time.monotonic() - started < WAIT_S


def test_released_request_is_refused_at_once() -> None:
    with peers(offer_wait_s=WAIT_S) as (_, srv, _decode, client):
        srv.offer("req", REMOTE, deadline())
        client.pull(*srv.address, "req", REMOTE, LOCAL)
        assert wait_done(srv, 1) == [("req", True)]
        started = time.monotonic()
        with pytest.raises(TransferError, match="'req' released"):
            client.pull(*srv.address, "req", REMOTE, LOCAL)
        assert time.monotonic() - started < WAIT_S / 2


def test_blocks_not_offered_are_refused() -> None:
    with peers(connections=1) as (_, srv, decode, client):
        srv.offer("req", REMOTE, deadline())
        with pytest.raises(TransferError, match=r"blocks not offered .* group 0 \[9\]"):
            client.pull(*srv.address, "req", [[1, 9], [3]], LOCAL)
        assert srv.counters.refused == 1 and srv.counters.bytes_sent == 0
        assert decode.rows.commits == []
        assert wait_done(srv, 1) == [("req", False)]  # released by the failed pull


def test_server_closed_in_the_middle_of_a_pull(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "READ_SLICE_BYTES", 512)  # one row per read: header, row, stall
    prefill = Engine(seed=1)
    stall, stalled = threading.Event(), threading.Event()
    prefill.rows = StallingRows(prefill.views, stall, stalled)
    with peers(connections=1, prefill=prefill) as (_, srv, decode, client):
        srv.offer("req", REMOTE, deadline())
        errors: list[BaseException] = []

        def pull() -> None:
            try:
                client.pull(*srv.address, "req", REMOTE, LOCAL)
            except TransferError as e:
                errors.append(e)

        puller = threading.Thread(target=pull)
        started = time.monotonic()
        puller.start()
        assert stalled.wait(WAIT_S)
        closer = threading.Thread(target=srv.close)
        closer.start()
        puller.join(WAIT_S)
        stall.set()
        closer.join(WAIT_S)
        assert not puller.is_alive() and not closer.is_alive()
        assert len(errors) == 1 and "closed by the peer" in str(errors[0])
        assert time.monotonic() - started < WAIT_S and decode.rows.commits == []


def test_checksum_mismatch_fails_the_pull() -> None:
    """The slices landed (committed as they arrived), the pull fails: the engine computes the
    blocks again."""

    def corrupt(sock: socket.socket, pull: wire.Pull) -> None:
        data = bytes(pull.nbytes)
        head = wire.encode_header(wire.Kind.DATA, len(data) + 8, wire.CHECKSUM_XXH3_64)
        sock.sendall(head + data + xxhash.xxh3_64(b"other bytes").digest())

    _expect_failure(corrupt, "checksum mismatch", landed=True)


def test_wrong_length_is_refused_before_receiving() -> None:
    def longer(sock: socket.socket, pull: wire.Pull) -> None:
        sock.sendall(wire.encode_header(wire.Kind.DATA, pull.nbytes + 9, wire.CHECKSUM_XXH3_64))

    _expect_failure(longer, "length mismatch")


def test_silent_server_times_out() -> None:
    _expect_failure(lambda sock, pull: None, "timed out", timeout_s=0.3)


def test_too_many_connections_are_refused() -> None:
    with peers(connections=1, max_connections=1) as (_, srv, decode, client):
        srv.offer("req", REMOTE, deadline())
        # a connection that never authenticates holds the only place (admitted at accept)
        with socket.create_connection(srv.address, timeout=5):
            hog_deadline = time.monotonic() + 5
            while srv.counters.connections < 1 and time.monotonic() < hog_deadline:
                time.sleep(0.005)
            with pytest.raises(TransferError, match="too many connections"):
                client.pull(*srv.address, "req", REMOTE, LOCAL)
        assert srv.counters.refused == 1 and decode.rows.commits == []


def test_close_is_bounded_and_idempotent() -> None:
    with peers() as (_, srv, _decode, client):
        srv.offer("req", REMOTE, deadline())
        client.pull(*srv.address, "req", REMOTE, LOCAL)  # leaves idle pooled connections
        started = time.monotonic()
        srv.close()
        srv.close()
        assert time.monotonic() - started < server.CLOSE_JOIN_S + 0.5
        with pytest.raises(TransferError, match="cannot connect|closed by the peer"):
            client.pull(*srv.address, "req", REMOTE, LOCAL)


# --- helpers ----------------------------------------------------------------------------------


Respond = Callable[[socket.socket, wire.Pull], None]


class FakeServer:
    """Runs ``handshake`` on one connection, then answers its PULL with ``respond`` and keeps the
    connection open until closed."""

    def __init__(self, respond: Respond, handshake: Callable[[socket.socket], object]) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(WAIT_S)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._respond, self._handshake = respond, handshake
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        with sock:
            sock.settimeout(WAIT_S)
            try:
                self._handshake(sock)
                pull = wire.recv_message(sock)
                assert isinstance(pull, wire.Pull)
                self._respond(sock, pull)
            except (OSError, auth.HandshakeFailed):
                pass
            self._closing.wait(WAIT_S)

    def close(self) -> None:
        self._closing.set()
        self._listener.close()
        self._thread.join(WAIT_S)


def _genuine(sock: socket.socket) -> None:
    auth.serve_handshake(sock, SECRET, IDENTITY)


def _impostor(sock: socket.socket) -> None:
    """Accepts any client without the secret: sends a made-up proof."""
    wire.send_control(sock, wire.Challenge(wire.VERSION, bytes(32)))
    wire.recv_message(sock)
    wire.send_control(sock, wire.Accept(bytes(32)))


def _expect_failure(
    respond: Respond,
    message: str,
    timeout_s: float = WAIT_S,
    handshake: Callable[[socket.socket], object] = _genuine,
    landed: bool = False,
) -> None:
    """``respond``'s failure raises ``TransferError`` matching ``message`` within the timeout;
    ``landed``: the data was received (committed) before the failure, else none was."""
    decode = Engine(seed=2)
    fake = FakeServer(respond, handshake)
    client = TransferClient(decode.rows, IDENTITY, SECRET, timeout_s=timeout_s, connections=1)
    started = time.monotonic()
    with pytest.raises(TransferError, match=message):
        client.pull(*fake.address, "req", REMOTE, LOCAL)
    assert time.monotonic() - started < timeout_s + 1.0
    assert bool(decode.rows.commits) == landed
    client.close()
    fake.close()
