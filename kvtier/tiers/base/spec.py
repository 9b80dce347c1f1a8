"""A tier, as kvtier plugs it in: one ``TierSpec`` per package (``kvtier/tiers/<name>/``).

A spec is everything the rest of kvtier knows about a tier:

    name            its stats, log line, ``/metrics`` label (``tier``), provenance, and the
                    medium of its chunks in a transfer (``TierChunks.tier``)
    section         its key in ``kv_connector_extra_config`` (None: it takes no config)
    parse(raw, key) that section parsed, or a ValueError naming the key (``config_parse.py``):
                    a ``TierSpec[C]`` parses a ``C``, and ``KVTierConfig.section(spec)`` gives
                    it back typed
    default         its config when the section is absent (None: the tier is off)
    hit_source      the vLLM ``CacheHitSource`` its loaded tokens count under
    scheduler(ctx)  the scheduler half's index (``tiers/base/index.py``), or None: the tier
                    is off (e.g. a store that did not answer and is not required)
    source(ctx)     a request source instead (``tiers/base/source.py``: the peer tier), or None
    worker(ctx)     one worker rank's side (``WorkerTier``), or None

Specs with a ``scheduler`` builder form the chain below host memory, in the order of
``registry.py``; those with a ``source`` builder are request sources beside it; both halves loop
over them and name no tier. The host tier's spec names it and its hit source (every engine has
one, built by the halves themselves).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from kvtier.keys import LayoutFingerprint
from kvtier.tiers.base.chunk_tier import FlushTier
from kvtier.tiers.base.handler import TransferHandler
from kvtier.tiers.base.index import TierIndex
from kvtier.tiers.base.records import HostRecords
from kvtier.tiers.base.source import RequestSource

if TYPE_CHECKING:  # (the engine's views are torch's: not imported to parse a config)
    from kvtier.layout import KVLayout

C = TypeVar("C")  # a tier's parsed config section


@dataclass(frozen=True)
class SchedulerContext(Generic[C]):
    """What a tier's scheduler-side index is built from, in the engine's scheduler process."""

    config: C  # the tier's config section, parsed
    world_size: int  # worker ranks: a chunk is loadable when every rank's share is there
    fingerprint: bytes  # the keys' namespace: tiers shared by several models keep apart (until
    # the engine's ranks tell their layouts, which rename it: ``Namespaced``)
    chunk_bytes: int  # one rank's bytes of one chunk, an upper bound (record headers included)
    role: str = "kv_both"  # the engine's kv_role: kv_producer, kv_consumer for prefill->decode
    engine_id: str = ""  # the engine's id, as vLLM names it
    tp_size: int = 1
    block_tokens: int = 0  # tokens per engine block
    windows: tuple[int | None, ...] = ()  # per KV cache group: its sliding window (tokens)


@dataclass(frozen=True)
class WorkerContext(Generic[C]):
    """What one worker rank's side of a tier is built from."""

    config: C
    layout: KVLayout  # this rank's engine KV tensors, as block views
    host: HostRecords  # this rank's host tier: writes read their chunks from it
    rank: int  # among all ranks (pipeline stage, then tensor rank): names its share of a chunk
    fingerprint: LayoutFingerprint  # this rank's: records are checked against it
    factor: int  # engine blocks per chunk
    role: str = "kv_both"  # the engine's kv_role
    # this rank among every rank of the server's data-parallel engines (rank 0 of engine d is
    # d × its ranks): what sets a listener's port apart from every other rank's
    server_rank: int = 0


@dataclass
class WorkerTier:
    """One worker rank's side of a tier: its handler pair and what a shutdown flush writes.

    ``load`` moves the tier's chunks into engine blocks (medium ``name`` -> engine), ``write``
    host-tier chunks into the tier (host -> ``name``); either may be None. ``flush``: the tier
    as a shutdown writes the host chunks it lacks (None: nothing written at shutdown).
    A tier with more to do each step (the peer tier's offers) subclasses it.
    """

    name: str
    load: TransferHandler | None = None
    write: TransferHandler | None = None
    flush: FlushTier | None = None
    on_close: Callable[[], None] | None = None

    def begin_step(self, messages: Sequence[object]) -> None:
        """This step's messages from the tier's scheduler side (``StepPlan.messages``)."""
        if messages:
            raise ValueError(f"kvtier: tier {self.name!r} takes no messages, got {messages!r}")

    def holding(self) -> set[str]:
        """Finished requests whose blocks the tier still needs (a peer's offers)."""
        return set()

    def wait_idle(self, timeout_s: float) -> None:
        """Nothing is in flight but what the tier waits for: block up to ``timeout_s``."""

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()


@dataclass(frozen=True)
class TierSpec(Generic[C]):
    """A tier's names, config section and builders (module docstring)."""

    name: str
    hit_source: str = "EXTERNAL_UNSPECIFIED"
    section: str | None = None
    parse: Callable[[object, str], C] | None = None
    default: C | None = None
    scheduler: Callable[[SchedulerContext[C]], TierIndex | None] | None = None
    source: Callable[[SchedulerContext[C]], RequestSource | None] | None = None
    worker: Callable[[WorkerContext[C]], WorkerTier | None] | None = None
    doc: str = field(default="", compare=False)  # one line for the config's documentation

    @property
    def in_chain(self) -> bool:
        return self.scheduler is not None
