"""The proxy's settings, checked once: engine URLs per side (or a fleet's), and time limits."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.apps.proxy.engine_url import engine_url

LIMITS = ("timeout_s", "connect_timeout_s", "backoff_s", "prefill_timeout_s", "health_interval_s",
          "health_timeout_s", "first_byte_timeout_s")  # fmt: skip
FLEET_LIMITS = tuple(key for key in LIMITS if key != "prefill_timeout_s")


@dataclass(frozen=True)
class ProxyConfig:
    """Which engines serve each side, and how long the proxy waits for them.

    URLs are normalized at construction (``host:port`` gains ``http://``, a trailing ``/`` goes;
    ``#dp<rank>``: one engine of a data-parallel server, ``engine_url.py``); a bad one raises
    ``ValueError`` naming its side.
    """

    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    timeout_s: float = 300.0  # a whole request, prefill and decode (the stream included)
    connect_timeout_s: float = 5.0  # one connection attempt
    backoff_s: float = 2.0  # an engine that could not be connected to (or a failed prefill) is
    #                         skipped this long
    prefill_timeout_s: float = 60.0  # the prefill hop, within timeout_s; past it the decode
    #                                  engine computes the prompt itself
    health_interval_s: float = 2.0  # how often each engine's /health is asked; one that fails
    #                                 it is skipped until it passes again
    policy: str = "kv-aware"  # how the prefill engine is chosen (scoring.POLICIES)
    health_timeout_s: float = 3.0  # a /health probe unanswered this long: the engine stalled
    first_byte_timeout_s: float = 120.0  # a decode engine silent this long after a request
    #                                      was sent: the request goes to another
    retries: int = 2  # times a request goes to another decode engine (resend.py)
    hedge_after_p99: float = 2.0  # a decode answer's first byte later than this x the recent
    #                               99th percentile: sent to a second engine too (0: never)

    def __post_init__(self) -> None:
        _check_policy(self.policy)
        for side in ("prefill", "decode"):
            object.__setattr__(self, side, _engine_urls(side, getattr(self, side)))
        _check_limits(self, LIMITS)


@dataclass(frozen=True)
class FleetConfig:
    """A fleet of ``kv_both`` engines, each taking whole requests, and how one is chosen
    (``scoring.POLICIES``). URLs and limits are checked as ``ProxyConfig``'s."""

    engines: tuple[str, ...]
    policy: str = "kv-aware"
    timeout_s: float = 300.0
    connect_timeout_s: float = 5.0
    backoff_s: float = 2.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 3.0
    first_byte_timeout_s: float = 120.0
    retries: int = 2
    hedge_after_p99: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "engines", _engine_urls("engine", self.engines))
        _check_policy(self.policy)
        _check_limits(self, FLEET_LIMITS)


def _check_limits(config: ProxyConfig | FleetConfig, keys: tuple[str, ...]) -> None:
    for key in keys:
        if not getattr(config, key) > 0:
            raise ValueError(f"{key} must be > 0, got {getattr(config, key)!r}")
    if isinstance(config.retries, bool) or not (
        isinstance(config.retries, int) and config.retries >= 0
    ):
        raise ValueError(f"retries must be an integer >= 0, got {config.retries!r}")
    if not config.hedge_after_p99 >= 0:
        raise ValueError(f"hedge_after_p99 must be >= 0, got {config.hedge_after_p99!r}")


def _check_policy(policy: str) -> None:
    from kvtier.apps.proxy.scoring import POLICIES

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")


def _engine_urls(side: str, urls: tuple[str, ...]) -> tuple[str, ...]:
    if not urls:
        raise ValueError(f"{side}: give at least one engine URL")
    normalized = tuple(engine_url(url, side) for url in urls)
    for url in normalized:
        if normalized.count(url) > 1:
            raise ValueError(f"{side}: {url} is given twice")
    return normalized
