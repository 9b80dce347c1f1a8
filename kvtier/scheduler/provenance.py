"""Where a request's prompt KV came from, and what the scheduler half remembers of finished jobs.

    JobLog.finished(job, state)            every job the scheduler half completes (one hook)
    JobLog.seconds                         durations of finished jobs, per tier (histograms)
    JobLog.loads(req_id) -> LoadRecord     a live request's load seconds and failed tiers
    JobLog.forget(req_id)                  the request finished: drop its record
    provenance(state, record, prompt_tokens, tiers) -> Provenance
    Provenance.as_params() -> dict         what vLLM hands the client (``kv_transfer_params``)

Every prompt token is counted once: from the engine's own prefix cache (its hit when kvtier looked
the request up), from a kvtier tier, or computed. A tier whose load failed is computed, and so is
every tier after it (the engine recomputes from the first block that failed to load). Tokens a
tier held that the engine computed instead, as loading them was predicted slower, are computed
too, and named per tier in ``declined``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.counters import JobSeconds
from kvtier.scheduler.job_table import Job, JobKind
from kvtier.scheduler.request import RequestState

# the tier a job reads (loads) or writes (stores)
JOB_TIERS = {
    JobKind.LOAD: "cpu",
    JobKind.STORE: "cpu",
}
LOAD_KINDS = (JobKind.LOAD, JobKind.TIER_LOAD, JobKind.SOURCE_LOAD)
# the keys of ``Provenance.as_params()["kvtier"]`` that name no tier (every other is a tier's)
NOT_TIERS = (
    "prompt_tokens", "engine_cached_tokens", "failed_tokens", "computed", "load_ms", "declined",
)  # fmt: skip


@dataclass
class LoadRecord:
    """A live request's finished loads: seconds (slowest rank, summed over its load jobs) and
    the tiers whose load failed."""

    seconds: float = 0.0
    failed: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Provenance:
    """Where one request's prompt KV came from; the token counts sum to ``prompt_tokens``."""

    prompt_tokens: int
    engine_cached_tokens: int  # the engine's own prefix cache
    tiers: dict[str, int]  # tokens each configured kvtier tier loaded (0 when none), in order
    failed_tokens: int  # tokens kvtier planned to load but whose load failed: computed
    computed_tokens: int  # everything the engine computed, ``failed_tokens`` included
    load_seconds: float  # kvtier's loads for this request (summed over its load jobs)
    # of ``computed_tokens``, those a tier held and the engine computed instead, per tier:
    # loading them was predicted slower (``hit_benefit.py``)
    declined: dict[str, int] = field(default_factory=dict)

    def as_params(self) -> dict[str, object]:
        """``{"kvtier": {...}}``, as returned in a completion's ``kv_transfer_params``
        (``declined`` only when a tier's tokens were computed instead)."""
        found: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "engine_cached_tokens": self.engine_cached_tokens,
            **self.tiers,
            "failed_tokens": self.failed_tokens,
            "computed": self.computed_tokens,
            "load_ms": round(self.load_seconds * 1e3, 3),
        }
        if self.declined:
            found["declined"] = dict(self.declined)
        return {"kvtier": found}


class JobLog:
    """Durations of finished jobs until taken, and each live request's load record.

    A record exists only between a request's first finished load and ``forget`` (called when the
    request finishes); a load finishing after that (an aborted request) leaves none behind.
    """

    def __init__(self) -> None:
        self.seconds = JobSeconds()
        self._loads: dict[str, LoadRecord] = {}

    def __len__(self) -> int:
        return len(self._loads)

    def finished(self, job: Job, state: RequestState | None) -> None:
        """Every rank finished ``job``; ``state`` is its request's, if it still has one."""
        tier = job.tier or JOB_TIERS.get(job.kind, job.kind.value)
        load, outcome = job.kind in LOAD_KINDS, job.outcome
        if not outcome.failed:
            self.seconds.add(tier, outcome.seconds, load=load)
        if load and state is not None and not state.finished:
            record = self._loads.setdefault(job.req_id, LoadRecord())
            record.seconds += outcome.seconds
            if outcome.failed:
                record.failed.add(tier)

    def loads(self, req_id: str) -> LoadRecord:
        return self._loads.get(req_id) or LoadRecord()

    def forget(self, req_id: str) -> None:
        self._loads.pop(req_id, None)


def provenance(
    state: RequestState, record: LoadRecord, prompt_tokens: int, tiers: Sequence[str]
) -> Provenance:
    """The provenance of ``state``'s last admission: its local hit, then ``loaded_tokens`` (in
    load order), each clamped so that nothing counts past ``prompt_tokens``."""
    engine = min(state.num_computed_tokens, prompt_tokens)
    left = prompt_tokens - engine
    served = dict.fromkeys(tiers, 0)
    failed, broken = 0, False
    for tier, planned in state.loaded_tokens.items():
        tokens = min(planned, left)
        left -= tokens
        broken = broken or tier in record.failed
        if broken:
            failed += tokens
        else:
            served[tier] = served.get(tier, 0) + tokens
    declined, room = {}, left + failed  # never more than what was computed
    for part in state.declined:
        if part.tier and min(part.tokens, room) > 0:
            declined[part.tier] = min(part.tokens, room)
            room -= declined[part.tier]
    return Provenance(
        prompt_tokens, engine, served, failed, left + failed, record.seconds, declined
    )
