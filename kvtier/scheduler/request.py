"""What the scheduler half remembers of one request."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.keys import SALT_BYTES, ChunkKey, ChunkKeyMaker
from kvtier.scheduler.hit import Declined


@dataclass(slots=True)
class RequestState:
    """One request: its chunk keys, how far it was stored, and its transfers in flight.

    ``block_hashes`` is the engine's own list (one hash per full engine block), which grows as
    tokens are appended; keys are derived from it lazily. ``stored_upto[g]``: chunks of group ``g``
    below it are stored, loaded or given up, not offered again (unless a store is cut for
    room or found untrustworthy: ``StorePlanner``, ``failed_loads.py`` lower it).

    ``block_ids[g]`` is kept up to date incrementally (the engine's new blocks appended each step,
    the whole table only when the engine hands it over again), so a step's work is proportional
    to what changed, never to the request's length. ``dropped[g]``: blocks of group ``g`` below
    it may have left a sliding window (the engine may have freed them although ``block_ids`` still
    names them): they are never read.
    """

    req_id: str
    block_hashes: Sequence[bytes]
    num_groups: int
    # the engine's own list of the request's token ids, growing as ``block_hashes`` does (empty:
    # not given; its chunks are then never described to a router, ``prefix_events.py``)
    token_ids: Sequence[int] = ()
    # what else names the KV of its engine blocks ``[first, end)`` (an adapter, a salt): told
    # to a router with its chunks as it is (None: nothing; opaque here, the adapter's)
    block_tags: Callable[[int, int], object] | None = None
    # what names its KV that its block hashes do not (``ChunkKeyMaker.keys``' salt): set before
    # its first key is made
    key_salt: bytes = b""
    keys: list[list[ChunkKey]] = field(init=False)
    stored_upto: list[int] = field(init=False)
    block_ids: list[list[int]] = field(init=False)  # per group, as the engine allocated them
    planned: list[int] = field(init=False)  # per group: leading blocks build_plan has seen
    dropped: list[int] = field(init=False)  # per group: leading blocks never to read (window)
    skipped_upto: list[int] = field(init=False)  # per group: chunks below it counted skipped
    table_set: bool = False  # on_alloc set ``block_ids``: the next step reads the whole table
    # a lower bound of the tokens computed (after a step) at which ``build_plan`` must look at
    # the request again (a chunk or the tail to store; 0: at its next step); exact after it did
    due: int = 0
    lookup_start: int = 0  # chunk index where the last lookup started (the local hit)
    lookup_end: int = 0  # full prompt chunks at the last lookup; 0 once counted
    num_computed_tokens: int = 0  # the engine's local hit at the last lookup
    load_async: bool = False  # the last lookup's hit is loaded while the request waits
    # the prompt's tail (its blocks after the last full chunk, to ``tail_end`` tokens): kept in
    # the host tier so a hit at any length leaves the engine only the last token to compute
    tail_key: ChunkKey | None = None
    tail_end: int = 0
    tail_done: bool = False  # stored, loaded or given up: never offered again
    # provenance of the prompt's KV: tokens each kvtier tier loads ("cpu", "disk", ...), summing
    # to the engine's num_external_tokens; set when the load is planned
    loaded_tokens: dict[str, int] = field(default_factory=dict)
    # what the last lookup's hit left to compute, per tier, as loading it was predicted slower
    declined: tuple[Declined, ...] = ()
    # a request source's claim (``request_source.py``), e.g. the params of a pull from a prefill
    # engine, until its load is planned
    source: str | None = None  # the request source that claimed it (its load not planned yet)
    source_params: Mapping[str, Any] | None = None
    store_jobs: set[int] = field(default_factory=set)
    load_jobs: set[int] = field(default_factory=set)  # one per tier it loads from
    finished: bool = False

    def __post_init__(self) -> None:
        self.keys = [[] for _ in range(self.num_groups)]
        self.stored_upto = [0] * self.num_groups
        self.block_ids = [[] for _ in range(self.num_groups)]
        self.planned = [0] * self.num_groups
        self.dropped = [0] * self.num_groups
        self.skipped_upto = [0] * self.num_groups

    @property
    def idle(self) -> bool:
        return not self.store_jobs and not self.load_jobs

    def salt_apart(self) -> None:
        """Name its chunks with keys no lookup will ask for, from now on: the engine's keys were
        renamed under it (a connector reset, around a weight update), and what it computes may
        attend to KV of the weights before. Its next lookup (preempted, it starts over) salts it
        as before, in the new names."""
        self.key_salt = secrets.token_bytes(SALT_BYTES)
        self.keys = [[] for _ in range(self.num_groups)]
        self.tail_key = None

    def load_keys(self, maker: ChunkKeyMaker, group: int, num_chunks: int) -> list[ChunkKey]:
        """Keys of the first ``num_chunks`` chunks to load: the full chunks, then the tail."""
        full = len(self.block_hashes) // maker.block_size_factor
        keys = self.group_keys(maker, group, min(num_chunks, full))
        if num_chunks > full and self.tail_key is not None:
            return [*keys, self.tail_key]
        return keys

    def group_keys(self, maker: ChunkKeyMaker, group: int, num_chunks: int) -> list[ChunkKey]:
        """Keys of the first ``num_chunks`` chunks of ``group`` (computed once, then cached).

        A copy: O(num_chunks), for lookups and loads; a step's stores use ``chunk_keys``.
        """
        return self.chunk_keys(maker, group, num_chunks)[:num_chunks]

    def chunk_keys(self, maker: ChunkKeyMaker, group: int, num_chunks: int) -> list[ChunkKey]:
        """The cached keys of ``group``, at least its first ``num_chunks`` (read-only; no copy).

        Computes only the keys not cached yet: O(new chunks), whatever the request's length.
        """
        keys = self.keys[group]
        have = len(keys)
        if have < num_chunks:
            start = have * maker.block_size_factor
            end = num_chunks * maker.block_size_factor
            keys += maker.keys(self.block_hashes[start:end], group, salt=self.key_salt)
        return keys
