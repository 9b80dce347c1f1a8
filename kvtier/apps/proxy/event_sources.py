"""Where an engine publishes its KV events, and whether the proxy can follow them from here.

    sources(url, timeout_s)    -> [Source]  where an engine publishes (vLLM's /kv_event_sources)
    unreachable(url, sources)  -> str       why they cannot be followed from here ("": they can)
    served(url, timeout_s)     -> Served    the base models and LoRA adapters it serves

Each source found is followed by an ``EventStream`` (``event_stream.py``).
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import NamedTuple
from urllib.parse import urlsplit

from kvtier.apps.proxy.engine_url import split

logger = logging.getLogger(__name__)


class Source(NamedTuple):
    """Where one data-parallel rank of an engine publishes its events."""

    endpoint: str
    replay: str | None
    topic: str


def sources(url: str, timeout_s: float) -> list[Source]:
    """The event sources ``url``'s engine publishes on (empty: it publishes none): each of the
    server's data-parallel engines', or one's (``http://host:port#dp1``). A wildcard host
    (``tcp://*:5557``, ``0.0.0.0``) is the engine's own, as reached at ``url``.

    Raises ``OSError`` when the engine cannot be asked, ``ValueError`` when the server has no
    engine of the rank named."""
    root, rank = split(url)
    with urllib.request.urlopen(root + "/kv_event_sources", timeout=timeout_s) as answer:
        found = json.loads(answer.read())
    if rank is not None:
        if str(rank) not in found:
            ranks = ", ".join(sorted(found, key=int)) or "none"
            raise ValueError(f"the server has no data-parallel engine {rank} (its: {ranks})")
        found = {str(rank): found[str(rank)]}
    host = urlsplit(url).hostname or "127.0.0.1"
    out = []
    for rank in sorted(found, key=int):
        config = found[rank] or {}
        if not config.get("enable_kv_cache_events") or config.get("publisher") != "zmq":
            continue
        replay = config.get("replay_endpoint")
        out.append(Source(_reachable(config["endpoint"], host),
                          _reachable(replay, host) if replay else None,
                          config.get("topic") or ""))  # fmt: skip
    return out


def unreachable(url: str, found: list[Source]) -> str:
    """Why the proxy cannot follow these sources of the engine at ``url`` ("" when it can): none,
    or a Unix socket (``kvtier serve``'s default) of an engine on another machine."""
    if not found:
        return "the engine publishes no KV events (--kv-events-config)"
    local = urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")
    if not local and any(source.endpoint.startswith("ipc://") for source in found):
        return (
            "it publishes its KV events on a Unix socket, which only its own machine reaches "
            "(kvtier serve --host 0.0.0.0, or a --kv-events-config on tcp://*)"
        )
    return ""


def _reachable(endpoint: str, host: str) -> str:
    for wildcard in ("://*:", "://0.0.0.0:", "://[::]:"):
        endpoint = endpoint.replace(wildcard, f"://{host}:")
    return endpoint


class Served(NamedTuple):
    """What an engine's ``/v1/models`` lists: its base models (by every name it serves them
    under) and its LoRA adapters (an entry with a parent); both empty where it cannot say."""

    bases: frozenset[str]
    adapters: frozenset[str]


def served(url: str, timeout_s: float) -> Served:
    """The models the engine at ``url`` serves. Nothing where it cannot be asked (an engine
    behind ``--api-key``): the adapters are then learned from the events that name them."""
    try:
        with urllib.request.urlopen(split(url)[0] + "/v1/models", timeout=timeout_s) as answer:
            models = json.loads(answer.read()).get("data")
    except (OSError, ValueError, AttributeError) as exc:
        logger.debug("kvtier proxy: %s/v1/models: %s", url, exc)
        models = None
    listed = models if isinstance(models, list) else []
    cards = [m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
    bases = frozenset(m["id"] for m in cards if not m.get("parent"))
    return Served(bases, frozenset(m["id"] for m in cards if m.get("parent")))
