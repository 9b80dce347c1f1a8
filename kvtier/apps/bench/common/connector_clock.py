"""The time a KV connector's calls take on the engine's thread, measured where it is spent.

    ConnectorClock(connectors)    wraps each connector's vLLM connector API methods (those
                                  ``KVConnectorBase_V1`` defines) on the object itself, timed on
                                  the thread that made the clock
    .seconds                      the time inside them so far: outermost calls only (a call one
                                  makes to another is not counted twice)
    engine_connectors(llm)        the connectors of an in-process ``vllm.LLM``: its scheduler's
                                  and, when its worker runs in this process, the worker's

What a wall-clock ratio of throughputs cannot tell apart from the machine's noise, this tells
directly: a connector's own share of the engine's thread. Calls from other threads (a
connector's copy lanes, say) are not counted: they run beside the engine, not in its step.
Any connector can be clocked, one that does nothing too (the clock's own cost: a few
microseconds a step).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any


class ConnectorClock:
    def __init__(self, connectors: Iterable[Any]) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

        self.seconds = 0.0
        self._thread = threading.get_ident()
        self._depth = 0
        api = [name for name, value in vars(KVConnectorBase_V1).items()
               if inspect.isfunction(value) and not name.startswith("_")]  # fmt: skip
        for connector in connectors:
            for name in api:
                method = getattr(connector, name, None)
                if inspect.ismethod(method):
                    setattr(connector, name, self._timed(method))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth or threading.get_ident() != self._thread:
                return method(*args, **kwargs)
            self._depth = 1
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self._depth = 0

        return timed


def engine_connectors(llm: Any) -> list[Any]:
    """The KV connectors an in-process ``vllm.LLM`` calls on this thread (none: no connector)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    from kvtier.vllm.access import scheduler_connector

    scheduler = scheduler_connector(llm)
    found = [] if scheduler is None else [scheduler]
    if has_kv_transfer_group():
        found.append(get_kv_transfer_group())
    return found
