"""Random bytes and mutated valid frames, before and after a valid handshake, sent to one live
server: it never crashes, refuses each with exactly one counted failure (``refused``,
``auth_failures`` or ``errors``), never allocates past its control-frame bound, and a valid client
still pulls byte-exact rows after every example."""

from __future__ import annotations

import itertools
import socket
import tracemalloc
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from peer_setup import IDENTITY, SECRET, WAIT_S, Engine, deadline, same_blocks

from kvtier.tiers.peer.net import TransferClient, TransferServer, auth, wire

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
REMOTE, LOCAL = [[1, 2], [3]], [[4, 5], [6]]
_ids = itertools.count()


class Peers:
    def __init__(self) -> None:
        self.prefill, self.decode = Engine(seed=1), Engine(seed=2)
        self.server = TransferServer(
            self.prefill.rows, IDENTITY, SECRET, offer_wait_s=0.0, io_timeout_s=WAIT_S
        )
        self.client = TransferClient(self.decode.rows, IDENTITY, SECRET, timeout_s=WAIT_S)

    def failures(self) -> int:
        c = self.server.counters
        return c.refused + c.auth_failures + c.errors

    def check_still_serving(self) -> None:
        req_id = f"healthy-{next(_ids)}"
        self.server.offer(req_id, REMOTE, deadline())
        assert self.client.pull(*self.server.address, req_id, REMOTE, LOCAL) == 2 * 1024 + 256
        assert same_blocks(self.prefill, REMOTE, self.decode, LOCAL)


@pytest.fixture(scope="module")
def peers() -> Iterator[Peers]:
    peers = Peers()
    yield peers
    peers.client.close()
    peers.server.close()
    peers.server.check_integrity()


def mutate(frame: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    data = bytearray(frame)
    for position, value in edits:
        data[position % len(data)] = value
    return bytes(data[:cut])


def send_and_drain(sock: socket.socket, data: bytes) -> list[wire.Kind]:
    """Send ``data``, end our side, read the server's frames until it closes."""
    kinds: list[wire.Kind] = []
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        while True:
            head = wire.recv_header(sock, max_control=1 << 30)
            kinds.append(head.kind)
            skip = bytearray(min(head.length, 1 << 20))
            left = head.length
            while left:
                chunk = memoryview(skip)[: min(left, len(skip))]
                wire.recv_exact_into(sock, chunk)
                left -= len(chunk)
    except (OSError, wire.FrameError):
        pass  # closed (EOF or reset), maybe before we had sent everything
    return kinds


def connect(peers: Peers) -> socket.socket:
    sock = socket.create_connection(peers.server.address, timeout=WAIT_S)
    return sock


edits = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4)
cuts = st.one_of(st.none(), st.integers(0, 200))


@FUZZ
@given(data=st.binary(min_size=1, max_size=300))
def test_random_bytes_before_the_handshake(peers: Peers, data: bytes) -> None:
    before = peers.failures()
    with connect(peers) as sock:
        send_and_drain(sock, data)
    assert peers.failures() == before + 1
    peers.check_still_serving()


@FUZZ
@given(edits=edits, cut=cuts)
def test_mutated_answers(peers: Peers, edits: list[tuple[int, int]], cut: int | None) -> None:
    before = peers.failures()
    with connect(peers) as sock:
        challenge = wire.recv_message(sock)
        assert isinstance(challenge, wire.Challenge)
        nonce = bytes(32)
        proof = auth._client_proof(SECRET, challenge.nonce, nonce, IDENTITY)
        answer = wire.encode_control(wire.Answer(nonce, list(IDENTITY.fields), proof))
        replies = send_and_drain(sock, mutate(answer, edits, cut))
    accepted = replies[:1] == [wire.Kind.ACCEPT]
    assert peers.failures() == before + (0 if accepted else 1)
    peers.check_still_serving()


@FUZZ
@given(data=st.one_of(st.binary(min_size=1, max_size=300), st.tuples(edits, cuts)))
def test_random_and_mutated_frames_after_the_handshake(
    peers: Peers, data: bytes | tuple[list[tuple[int, int]], int | None]
) -> None:
    req_id = f"fuzz-{next(_ids)}"
    peers.server.offer(req_id, REMOTE, deadline())
    if not isinstance(data, bytes):
        pull = wire.Pull(req_id, REMOTE, 0, 3, 2 * 1024 + 256)
        data = mutate(wire.encode_control(pull), *data)
    before = peers.failures()
    with connect(peers) as sock:
        auth.open_handshake(sock, SECRET, IDENTITY)
        replies = send_and_drain(sock, data)
    served = wire.Kind.DATA in replies
    assert peers.failures() == before + (0 if served or not data else 1)  # b"": a clean close
    peers.server.withdraw(req_id)
    peers.check_still_serving()


@pytest.mark.parametrize("kind", [wire.Kind.ANSWER, wire.Kind.PULL, wire.Kind.DATA])
@pytest.mark.parametrize("length", [2**62, 512 << 20])
def test_a_huge_declared_length_is_refused_without_allocating(
    peers: Peers, kind: wire.Kind, length: int
) -> None:
    before = peers.server.counters
    tracemalloc.start()
    try:
        with connect(peers) as sock:
            if kind != wire.Kind.ANSWER:
                auth.open_handshake(sock, SECRET, IDENTITY)
            flags = wire.CHECKSUM_XXH3_64 if kind == wire.Kind.DATA else 0
            send_and_drain(sock, wire.encode_header(kind, length, flags) + bytes(64))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    after = peers.server.counters
    assert after.refused == before.refused + 1 and after.errors == before.errors
    assert peak < 4 << 20
    peers.check_still_serving()
