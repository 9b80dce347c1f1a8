"""The proxy following an engine's KV events (``kvtier/apps/proxy/event_stream.py``) over real
ZMQ sockets: vLLM's own publisher (replayed from its buffer, then live), and a publisher that
loses batches (a gap: degraded, then exact again from the replay; or rebuilt when the buffer lost
them too)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

from kvtier.apps.ports import free_port
from kvtier.apps.proxy.event_sources import Source, unreachable
from kvtier.apps.proxy.event_stream import END, EventStream, Mode
from kvtier.apps.proxy.kv_events import Event, Kind
from kvtier.apps.proxy.prefix_index import PrefixIndex

BS = 4
WAIT_S = 10.0


def _block(i: int) -> BlockStored:
    """Block ``i`` of a prompt whose block ``i`` holds tokens 4i..4i+3 (engine hash i + 1)."""
    return BlockStored(block_hashes=[i + 1], parent_block_hash=i if i else None,
                       token_ids=list(range(4 * i, 4 * i + 4)), block_size=BS, lora_id=None,
                       medium="GPU", lora_name=None)  # fmt: skip


def _held(index: PrefixIndex, lock: threading.Lock, blocks: int) -> int:
    with lock:
        return index.runs(index.digests(list(range(4 * blocks))), ["e"])["e"].total


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.01)


@pytest.fixture
def stream_of() -> Iterator[Callable[[Source], tuple[EventStream, PrefixIndex, threading.Lock]]]:
    streams: list[EventStream] = []

    def start(source: Source) -> tuple[EventStream, PrefixIndex, threading.Lock]:
        index, lock = PrefixIndex(), threading.Lock()
        streams.append(EventStream("e", source, index, lock, timeout_s=2.0))
        streams[-1].start()
        return streams[-1], index, lock

    yield start
    for stream in streams:
        stream.stop()


def test_vllms_publisher_is_replayed_from_its_buffer_then_followed_live(  # type: ignore[no-untyped-def]
    stream_of, tmp_path: Path
) -> None:
    # vLLM binds its PUB socket only to a wildcard or a Unix socket (as ``kvtier serve`` does)
    source = Source(f"ipc://{tmp_path}/events", f"tcp://127.0.0.1:{free_port()}", "kv")
    publisher = ZmqEventPublisher(0, source.endpoint, source.replay, topic="kv")
    try:
        for i in range(3):  # published before anyone listens: only the replay has them
            publisher.publish(KVEventBatch(ts=time.time(), events=[_block(i)]))
        time.sleep(0.2)  # let the publisher's thread buffer them (the replay must find them)
        stream, index, lock = stream_of(source)
        _until(lambda: _held(index, lock, 3) == 3, "the replayed blocks")
        assert stream.mode is Mode.EXACT
        publisher.publish(KVEventBatch(ts=time.time(), events=[_block(3)]))
        _until(lambda: _held(index, lock, 4) == 4, "a live block")
        assert stream.gaps == 0
    finally:
        publisher.shutdown()


class _LossyPublisher:
    """A PUB socket and a replay ROUTER answering from ``buffer`` (seq -> batch), on a thread."""

    def __init__(self) -> None:
        self.source = Source(f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}", "")
        context = zmq.Context.instance()
        self.pub = context.socket(zmq.PUB)
        self.pub.bind(self.source.endpoint)
        self.router = context.socket(zmq.ROUTER)
        self.router.bind(self.source.replay or "")
        self.buffer: dict[int, bytes] = {}
        self.lock = threading.Lock()
        self.answering = threading.Event()  # cleared: replay requests go unanswered
        self.answering.set()
        self.dropped: set[int] = set()  # batch numbers (END: the end marker) the next replay drops
        self.asked: list[int] = []  # the batch number each replay request started from
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def batch(self, seq: int, block: int, send: bool = True) -> None:
        payload = msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=[_block(block)]))
        with self.lock:
            self.buffer[seq] = payload
        if send:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            if not self.answering.is_set():
                continue
            self.asked.append(int.from_bytes(start, "big"))
            with self.lock:
                batches = sorted((s, p) for s, p in self.buffer.items() if s >= self.asked[-1])
                batches.append((END, b""))
                dropped, self.dropped = self.dropped, set()
            for seq, payload in batches:
                if seq not in dropped:  # as a ROUTER past its high-water mark drops them
                    number = seq.to_bytes(8, "big", signed=True)
                    self.router.send_multipart([client, b"", b"", number, payload])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(0)
        self.router.close(0)


def test_a_gap_degrades_the_engine_until_the_replay_fills_it(stream_of) -> None:  # type: ignore[no-untyped-def]
    publisher = _LossyPublisher()
    try:
        publisher.batch(0, 0)
        stream, index, lock = stream_of(publisher.source)
        _until(lambda: _held(index, lock, 1) == 1 and stream.mode is Mode.EXACT, "batch 0")
        publisher.batch(1, 1, send=False)  # lost on the way; the replay has it
        # the subscription may start late: send batch 2 until the stream has seen it
        _until(lambda: publisher.batch(2, 2) or _held(index, lock, 3) == 3, "batch 1 replayed")
        assert stream.gaps >= 1 and stream.mode is Mode.EXACT
    finally:
        publisher.close()


def test_batches_the_buffer_lost_too_rebuild_the_engines_index(stream_of) -> None:  # type: ignore[no-untyped-def]
    publisher = _LossyPublisher()
    try:
        publisher.batch(0, 0)
        publisher.batch(1, 1)
        stream, index, lock = stream_of(publisher.source)
        _until(lambda: _held(index, lock, 2) == 2, "batches 0 and 1")
        with publisher.lock:  # the engine's buffer moved on: batch 2 is gone from it
            publisher.buffer = {3: publisher.buffer[0]}  # only a re-told block 0 is left
        _until(lambda: publisher.batch(4, 0) or stream.gaps > 0, "the gap seen")
        # forgotten and rebuilt from what the buffer holds: block 0, never block 1
        _until(lambda: stream.mode is Mode.EXACT and _held(index, lock, 2) == 1, "the rebuild")
    finally:
        publisher.close()


def test_a_replay_that_dropped_batches_is_taken_up_to_the_first_and_asked_again_from_it(  # type: ignore[no-untyped-def]
    stream_of,
) -> None:
    publisher = _LossyPublisher()
    try:
        for i in range(10):  # told before the proxy started: only the replay has them
            publisher.batch(i, i, send=False)
        publisher.dropped = {4, 7}  # the first replay loses batches 4 and 7
        stream, index, lock = stream_of(publisher.source)
        _until(lambda: stream.mode is Mode.EXACT, "the replay")
        assert _held(index, lock, 10) == 10  # every block, none missing past a dropped batch
        assert publisher.asked == [0, 4]
    finally:
        publisher.close()


def test_a_replay_that_lost_its_end_marker_is_asked_again_not_waited_out() -> None:
    publisher = _LossyPublisher()
    index, lock = PrefixIndex(), threading.Lock()
    stream = EventStream("e", publisher.source, index, lock, timeout_s=60.0)
    try:
        for i in range(3):
            publisher.batch(i, i, send=False)
        publisher.dropped = {END}
        stream.start()
        # quiet for QUIET_S after batch 2, not for timeout_s: asked again from batch 3
        _until(lambda: stream.mode is Mode.EXACT, "the replay")
        assert _held(index, lock, 3) == 3 and publisher.asked == [0, 3]
    finally:
        stream.stop()
        publisher.close()


def test_vllms_publisher_replays_a_full_buffer_to_two_streams_at_once_whole(
    tmp_path: Path,
) -> None:
    """10,000 batches, ten times the replay socket's high-water mark, asked for by two streams
    of one proxy at once (each placing its batches while the other receives): both whole."""
    found = [Source(f"ipc://{tmp_path}/events-{e}", f"ipc://{tmp_path}/replay-{e}", "")
             for e in range(2)]  # fmt: skip
    publishers = [ZmqEventPublisher(0, source.endpoint, source.replay) for source in found]
    index, lock = PrefixIndex(), threading.Lock()
    streams = [EventStream(f"e{e}", source, index, lock) for e, source in enumerate(found)]
    try:
        for publisher in publishers:
            for i in range(10_000):
                publisher.publish(KVEventBatch(ts=0.0, events=[_block(i)]))
        _until(lambda: all(len(p._buffer) == 10_000 for p in publishers), "the buffers full")
        for stream in streams:
            stream.start()
        _until(lambda: all(s.mode is Mode.EXACT for s in streams), "both replays")
        assert [s.batches for s in streams] == [10_000, 10_000]
        with lock:
            held = index.runs(index.digests(list(range(4 * 10_000))), ["e0", "e1"])
        assert [held[e].total for e in ("e0", "e1")] == [10_000, 10_000]
    finally:
        for stream in streams:
            stream.stop()
        for publisher in publishers:
            publisher.shutdown()


def test_a_unix_socket_of_another_machine_is_said_unreachable() -> None:
    unix = [Source("ipc:///tmp/kvtier-kv-events-1", "tcp://10.0.0.5:5558", "")]
    assert unreachable("http://127.0.0.1:8000", unix) == ""
    assert "Unix socket" in unreachable("http://10.0.0.5:8000", unix)
    assert unreachable("http://10.0.0.5:8000", [Source("tcp://10.0.0.5:5557", None, "")]) == ""
    assert "no KV events" in unreachable("http://127.0.0.1:8000", [])


def test_an_engine_of_another_block_size_is_refused_with_an_error_naming_both(  # type: ignore[no-untyped-def]
    stream_of, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = Source(f"ipc://{tmp_path}/events", f"tcp://127.0.0.1:{free_port()}", "")
    publisher = ZmqEventPublisher(0, source.endpoint, source.replay, topic="")
    try:
        stream, index, lock = stream_of(source)
        with lock:  # another engine told the fleet's index first: blocks of 4 tokens
            index.apply("other", [Event(Kind.STORED, (1,), None, (0, 1, 2, 3), BS, "GPU")])
        _until(lambda: stream.mode is Mode.EXACT, "the stream following")
        eight = BlockStored(block_hashes=[9], parent_block_hash=None, token_ids=list(range(8)),
                            block_size=8, lora_id=None, medium="GPU", lora_name=None)  # fmt: skip
        publisher.publish(KVEventBatch(ts=time.time(), events=[eight]))
        _until(lambda: stream.refused, "the engine refused")
        assert stream.mode is Mode.DOWN and "8 tokens" in stream.reason and "4" in stream.reason
        assert "--block-size" in caplog.text and index.hashes("e") == 0
    finally:
        publisher.shutdown()


def test_events_that_stopped_show_as_down_then_exact_when_they_answer_again() -> None:
    publisher = _LossyPublisher()
    index, lock = PrefixIndex(), threading.Lock()
    stream = EventStream("e", publisher.source, index, lock, timeout_s=0.5, check_s=0.2)
    try:
        publisher.batch(0, 0)
        stream.start()
        _until(lambda: stream.mode is Mode.EXACT and _held(index, lock, 1) == 1, "batch 0")
        publisher.answering.clear()  # the publisher is gone: its replay socket answers nothing
        _until(lambda: stream.mode is Mode.DOWN, "the quiet stream found down")
        assert "no answer" in stream.reason
        publisher.batch(1, 1, send=False)  # told while down: only its buffer has it
        publisher.answering.set()
        _until(lambda: stream.mode is Mode.EXACT and _held(index, lock, 2) == 2, "batch 1")
    finally:
        stream.stop()
        publisher.close()
