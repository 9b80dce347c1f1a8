"""kvtier's log records where vLLM shows its own."""

from __future__ import annotations

import logging


def route_to_vllm_logging() -> bool:
    """Give the ``kvtier`` logger vLLM's handlers and level, when no one configured logging.

    vLLM configures only its ``vllm`` logger (its handlers, its level, no propagation), so the
    records of ``kvtier.*`` reach only the root logger, which has no handler in vLLM's processes:
    Python then shows warnings alone, without vLLM's format. This changes nothing when the
    ``kvtier`` or the root logger already has a handler (an application or pytest configured
    logging: it shows kvtier's records once, its own way), nor when vLLM's logger has none. Only
    the ``kvtier`` logger is touched, and only once. True when it was routed.
    """
    ours, theirs = logging.getLogger("kvtier"), logging.getLogger("vllm")
    if ours.handlers or logging.getLogger().handlers or not theirs.handlers:
        return False
    for handler in theirs.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(theirs.level)
    return True
