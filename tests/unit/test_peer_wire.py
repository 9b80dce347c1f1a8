"""The frame codec and the row scatter/gather, on their own (no server)."""

from __future__ import annotations

import socket
import threading

import msgspec
import pytest
import xxhash

from kvtier.tiers.peer.net import streams, wire


def header(magic: bytes = b"KVT1", kind: int = 5, flags: int = 0, reserved: int = 0,
           length: int = 10) -> bytes:  # fmt: skip
    return wire.HEADER.pack(magic, kind, flags, reserved, length)


def test_a_valid_header_decodes() -> None:
    assert wire.decode_header(header()) == wire.Header(wire.Kind.PULL, 0, 10)
    data = header(kind=6, flags=wire.CHECKSUM_XXH3_64, length=1 << 40)
    assert wire.decode_header(data) == wire.Header(wire.Kind.DATA, 1, 1 << 40)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (header(magic=b"KVT2"), "bad magic"),
        (header(kind=0), "unknown frame kind 0"),
        (header(kind=99), "unknown frame kind 99"),
        (header(reserved=1), "reserved"),
        (header(flags=1), "PULL frame with flags"),
        (header(kind=6, flags=0), "DATA frame with flags"),
        (header(kind=6, flags=1, length=7), "no checksum"),
        (header(length=2**62), r"declares 4611686018427387904 bytes \(bound 1048576\)"),
        (header(length=wire.MAX_CONTROL_BYTES + 1), "bound"),
        (header()[:15], "header of 15 bytes"),
    ],
)
def test_a_bad_header_is_refused_from_its_bytes_alone(data: bytes, message: str) -> None:
    with pytest.raises(wire.FrameError, match=message):
        wire.decode_header(data)


def test_a_data_frame_is_never_read_as_control() -> None:
    left, right = socket.socketpair()
    with left, right:
        huge = wire.Header(wire.Kind.DATA, wire.CHECKSUM_XXH3_64, 2**62)
        with pytest.raises(wire.FrameError, match="not a control frame"):
            wire.recv_control(left, huge)  # refused before allocating or reading


def test_control_messages_round_trip() -> None:
    pull = wire.Pull("req-1", [[1, 2], []], 0, 3, 1536)
    frame = wire.encode_control(pull)
    assert wire.decode_control(wire.decode_header(frame[:16]), frame[16:]) == pull


@pytest.mark.parametrize(
    "payload",
    [
        {"req_id": "r", "block_ids": [[-1]], "start": 0, "stop": 1, "nbytes": 1},
        {"req_id": "r", "block_ids": [[1]], "start": 0, "stop": 1, "nbytes": 1, "extra": 1},
        {"req_id": "r", "block_ids": "no", "start": 0, "stop": 1, "nbytes": 1},
        {"req_id": "r"},
        [1, 2, 3],
    ],
)
def test_malformed_control_payloads_are_refused(payload: object) -> None:
    data = msgspec.msgpack.encode(payload)
    with pytest.raises(wire.FrameError, match="malformed PULL payload"):
        wire.decode_control(wire.Header(wire.Kind.PULL, 0, len(data)), data)
    with pytest.raises(wire.FrameError):
        wire.decode_control(wire.Header(wire.Kind.PULL, 0, 3), b"\xc1\x00\x00")


def test_rows_move_through_partial_sends_and_receives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams, "IOV_MAX", 3)  # many batches
    monkeypatch.setattr(streams, "BATCH_BYTES", 1000)
    source = bytes(range(256)) * 400  # 102400 bytes
    cuts = [0, 7, 5000, 5001, 40000, 70000, len(source)]  # rows of odd sizes
    received = bytearray(len(source))
    views = [memoryview(received)[a:b] for a, b in zip(cuts, cuts[1:])]
    left, right = socket.socketpair()
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # partial sends
    right.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sent_hash, got_hash = xxhash.xxh3_64(), xxhash.xxh3_64()
    rows = [memoryview(source)[a:b] for a, b in zip([0, 3, 9000, 9001], [3, 9000, 9001, None])]
    sender = threading.Thread(target=wire.send_rows, args=(left, b"HEAD", rows, sent_hash))
    with left, right:
        sender.start()
        head = bytearray(4)
        wire.recv_exact_into(right, memoryview(head))
        wire.recv_rows(right, views, got_hash)
        sender.join(5)
    assert head == b"HEAD" and bytes(received) == source
    assert sent_hash.digest() == got_hash.digest() == xxhash.xxh3_64(source).digest()
