"""kvtier's configuration: vLLM's ``kv_connector_extra_config`` parsed once into frozen dataclasses.

Extra-config keys (names follow vLLM's native offloading where it has them)::

    key                default     meaning
    cpu_bytes_to_use   (required)  host budget of the whole engine (all ranks): int bytes or "4GiB"
    block_size         None        tokens per chunk, a multiple of the engine block size
    eviction_policy    "lru"       lru | arc
    store_threshold    1           store a chunk once it was looked up this many times
    min_async_load_tokens None     unset: the measured costs decide how much of a hit to load,
                                   and whether the request waits for it (the engine computes
                                   what loading would make slower). Set: the rules decide how
                                   (a load that makes the request wait adds at least this many
                                   tokens, a read from disk before the step's forward is
                                   shorter), the costs only decline a tier slower than computing
    hash_algo          "xxh3_128"  sha256 | xxh3_128
    shutdown_flush_s   4.0         the longest an engine's shutdown spends writing the host
                                   tier's chunks the disk or Redis tier lacks (0: none); vLLM
                                   gives worker processes VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS
                                   (5) to exit before it terminates them: raise both together
    reset_keeps_tiers  False       False: vLLM's connector reset (``reset_prefix_cache(
                                   reset_connector=True)``; ``pause_generation(clear_cache=
                                   True)`` around an RL weight update) renames the keys, so
                                   that no chunk computed before is loaded again. True: it
                                   empties the host tier only (benchmarks of the chain's hits;
                                   never where weights change in a running engine)
    tiers              []          tiers from outside kvtier, as import paths
                                   ``"package.module:NAME"`` of a ``TierSpec``
                                   (``tiers/registry.py``); each then takes its own section

and one section per tier (``tiers/<name>/config.py``), each absent by default:

    disk               {"path": str, "bytes": size, "write_through": bool = False}
    redis              {"url": "redis://..." (or rediss://, unix://), "timeout_s": 1.0,
                       "prefix", "ttl_s", "cluster", "seeds", ...}: ``RedisConfig``
    transfer           prefill→decode (kv_role kv_producer / kv_consumer): ``TransferConfig``;
                       its ``secret`` (or the environment variable KVTIER_TRANSFER_SECRET) is
                       required for those roles

An optional key set to ``None`` counts as absent. Every error is a ``ValueError`` starting with
``kvtier: `` that names the key (dotted for nested keys: ``disk.bytes``) and what is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from kvtier.config_parse import (
    as_bool,
    choice,
    mapping,
    non_empty_str,
    non_negative_float,
    optional,
    positive_int,
    positive_size,
    required,
)
from kvtier.sizes import ACCEPTED_SIZE_FORMS, parse_size
from kvtier.tiers.base.spec import TierSpec
from kvtier.tiers.registry import specs

__all__ = ["KVTierConfig", "parse_size"]

C = TypeVar("C")  # a tier's parsed config section

EVICTION_POLICIES = ("lru", "arc")
HASH_ALGOS = ("sha256", "xxh3_128")


@dataclass(frozen=True)
class KVTierConfig:
    """Everything kvtier reads from ``kv_connector_extra_config``, validated at construction.

    ``block_size`` is tokens per chunk; ``None`` means one engine block per chunk. The engine
    block size is not part of the config: ``block_size_factor(engine_block_size)`` checks the
    multiple and gives the number of engine blocks per chunk (``from_extra_config`` checks it
    once up front, so a parsed config never fails there for the same engine block size).

    A tier's section is ``section(spec)``, typed by its spec: None when absent, unless the
    spec has a default (the peer tier's).
    """

    cpu_bytes_to_use: int
    block_size: int | None = None
    eviction_policy: str = "lru"
    store_threshold: int = 1
    min_async_load_tokens: int | None = None
    hash_algo: str = "xxh3_128"
    shutdown_flush_s: float = 4.0
    reset_keeps_tiers: bool = False
    tiers: tuple[str, ...] = ()  # outside tiers' import paths
    sections: Mapping[str, Any] = field(default_factory=dict)  # tier section -> its config

    def __post_init__(self) -> None:
        positive_int(self.cpu_bytes_to_use, "cpu_bytes_to_use")
        if self.block_size is not None:
            positive_int(self.block_size, "block_size")
        choice(EVICTION_POLICIES)(self.eviction_policy, "eviction_policy")
        positive_int(self.store_threshold, "store_threshold")
        if self.min_async_load_tokens is not None:
            positive_int(self.min_async_load_tokens, "min_async_load_tokens")
        choice(HASH_ALGOS)(self.hash_algo, "hash_algo")
        non_negative_float(self.shutdown_flush_s, "shutdown_flush_s")

    def section(self, spec: TierSpec[C]) -> C | None:
        """``spec``'s config: its section, else its default (None: the tier is off)."""
        if spec.section is None:
            return spec.default
        found: C | None = self.sections.get(spec.section, spec.default)
        return found

    def chain(self) -> list[TierSpec[Any]]:
        """The configured tiers of the chain below host memory, in its order."""
        return [spec for spec in specs(self.tiers) if spec.in_chain and self.section(spec)]

    def sources(self) -> list[TierSpec[Any]]:
        """The request sources (tiers outside the chain, as the peer tier), in registry order:
        each builds nothing for an engine its role does not concern."""
        return [s for s in specs(self.tiers) if s.source is not None and self.section(s)]

    @classmethod
    def from_extra_config(
        cls, extra: Mapping[str, object] | None, engine_block_size: int
    ) -> KVTierConfig:
        """Parse vLLM's ``kv_connector_extra_config`` (``None`` counts as ``{}``).

        Raises ``ValueError`` naming the key on an unknown key, a missing ``cpu_bytes_to_use``,
        a wrong type, a value out of range, or a ``block_size`` that is not a multiple of
        ``engine_block_size``.
        """
        raw = {} if extra is None else extra
        no_tiers: tuple[str, ...] = ()
        tiers = optional(mapping(raw, "", ("tiers",), strict=False), "", "tiers", _paths, no_tiers)
        known = [spec for spec in specs(tiers) if spec.section is not None]
        fixed = tuple(f.name for f in fields(cls) if f.name != "sections")
        raw = mapping(raw, "", (*fixed, *(spec.section or "" for spec in known)))
        if raw.get("cpu_bytes_to_use") is None:
            raise ValueError(
                "kvtier: 'cpu_bytes_to_use' is required: the host-memory budget of the whole "
                f"engine (all ranks), {ACCEPTED_SIZE_FORMS}"
            )
        config = cls(
            cpu_bytes_to_use=required(raw, "", "cpu_bytes_to_use", positive_size),
            block_size=optional(raw, "", "block_size", positive_int, None),
            eviction_policy=optional(raw, "", "eviction_policy", choice(EVICTION_POLICIES), "lru"),
            store_threshold=optional(raw, "", "store_threshold", positive_int, 1),
            min_async_load_tokens=optional(raw, "", "min_async_load_tokens", positive_int, None),
            hash_algo=optional(raw, "", "hash_algo", choice(HASH_ALGOS), "xxh3_128"),
            shutdown_flush_s=optional(raw, "", "shutdown_flush_s", non_negative_float, 4.0),
            reset_keeps_tiers=optional(raw, "", "reset_keeps_tiers", as_bool, False),
            tiers=tiers,
            sections={  # only those set: an absent section reads as its spec's default
                spec.section: spec.parse(raw[spec.section], spec.section)
                for spec in known
                if spec.section is not None and spec.parse and raw.get(spec.section) is not None
            },
        )
        config.block_size_factor(engine_block_size)
        return config

    def block_size_factor(self, engine_block_size: int) -> int:
        """Engine blocks per chunk: ``block_size // engine_block_size``, or 1 without a block_size.

        Raises ``ValueError`` when ``block_size`` is not a positive multiple of
        ``engine_block_size``.
        """
        positive_int(engine_block_size, "engine block size")
        if self.block_size is None:
            return 1
        if self.block_size % engine_block_size != 0:
            raise ValueError(
                "kvtier: 'block_size' must be a positive multiple of the engine block size "
                f"{engine_block_size}, got {self.block_size}"
            )
        return self.block_size // engine_block_size


def _paths(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"kvtier: {key!r} must be a list of 'package.module:NAME', got {value!r}")
    return tuple(non_empty_str(path, key) for path in value)
