"""A source of a request's KV outside the tier chain, as the scheduler half sees it.

The chain is looked up by block hashes; a request source is named by the request itself: a
decode engine's request carries its prefill engine's params, and its prompt is pulled from
there (the peer tier, ``kvtier/tiers/peer/planner.py``). A source may also hold finished
requests' blocks for another engine (a prefill engine's offers).

    name                                 its stats, provenance, medium and messages' key
    plan_load(state, tokens) -> LoadJob  the request's load, if the source claims it (else None)
    complete_load(job)                   every rank finished its load (``JobKind.SOURCE_LOAD``)
    holds(req_id)            -> bool     a finished request's blocks are kept for the source
    pending                  -> bool     work that keeps the engine stepping
    take_messages()          -> [object] this step's messages to its worker side
"""

from __future__ import annotations

from typing import Protocol

from kvtier.scheduler.job_table import Job
from kvtier.scheduler.request import RequestState
from kvtier.step_plan import LoadJob


class RequestSource(Protocol):
    @property
    def name(self) -> str: ...

    def plan_load(self, state: RequestState, num_external_tokens: int) -> LoadJob | None: ...

    def complete_load(self, job: Job) -> None: ...

    def holds(self, req_id: str) -> bool: ...

    @property
    def pending(self) -> bool: ...

    def take_messages(self) -> list[object]: ...
