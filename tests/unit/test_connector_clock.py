"""``ConnectorClock``: the time the engine's thread spends in a connector's vLLM API calls,
outermost calls only, other threads' calls and private methods left out."""

from __future__ import annotations

import threading
import time

from kvtier.apps.bench.common.connector_clock import ConnectorClock

INNER_S = 0.02


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


class Connector:
    """Methods named as vLLM's connector API has them, and one it does not have."""

    def __init__(self) -> None:
        self.outer_span = 0.0

    def build_connector_meta(self) -> str:
        started = time.perf_counter()
        self.wait_for_save()  # an API call inside another: counted once, in the outer
        self.outer_span = time.perf_counter() - started
        return "meta"

    def wait_for_save(self) -> None:
        _spin(INNER_S)

    def helper(self) -> None:
        _spin(INNER_S)


def test_outermost_calls_on_the_clocks_thread_are_timed() -> None:
    connector = Connector()
    clock = ConnectorClock([connector])
    assert clock.seconds == 0.0
    assert connector.build_connector_meta() == "meta"  # results pass through
    # the outer call's own span, not the inner's added to it (that would be >= span + INNER_S)
    assert connector.outer_span <= clock.seconds < connector.outer_span + INNER_S / 2
    before = clock.seconds
    connector.helper()  # not the API
    assert clock.seconds == before
    other = threading.Thread(target=connector.wait_for_save)  # a lane's call: beside the step
    other.start()
    other.join()
    assert clock.seconds == before
    connector.wait_for_save()
    assert clock.seconds >= before + INNER_S


def test_a_raising_call_is_timed_and_the_next_is_counted_again() -> None:
    class Failing(Connector):
        def wait_for_save(self) -> None:
            _spin(INNER_S)
            raise RuntimeError("copy failed")

    connector = Failing()
    clock = ConnectorClock([connector])
    try:
        connector.wait_for_save()
    except RuntimeError:
        pass
    assert clock.seconds >= INNER_S
    first = clock.seconds
    try:
        connector.build_connector_meta()
    except RuntimeError:
        pass
    assert clock.seconds >= first + INNER_S  # the depth was reset: the outer call counted
