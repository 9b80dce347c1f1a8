"""A source of a request's KV named by the request itself, outside the tier chain.

The chain is looked up by block hashes; a request source is named by the request: a decode
engine's request carries its prefill engine's params, and its prompt is pulled from there (the
peer tier, ``kvtier/tiers/peer/planner.py``). A source may also hold finished requests' blocks
for another engine (a prefill engine's offers). The scheduler half owns the requests, jobs and
counts (``scheduler/sources.py``); a source only answers for its own requests:

    name                                       its stats, provenance, medium and messages' key
    lookup(params, prompt_tokens, computed) -> int   tokens it loads for a request with these
                                               params beyond ``computed`` (0: not its request)
    plan_load(request, tokens) -> SourceLoad | None  the load into the blocks the engine gave
                                               (tokens 0: the engine took none, e.g. vLLM 0.34
                                               for prompt logprobs: free what was kept; no load)
    holds(req_id)            -> bool           a finished request's blocks are kept for it
    pending                  -> bool           work that keeps the engine stepping
    take_messages()          -> [object]       this step's messages to its worker side
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from kvtier.addresses import EngineBlocks, TransferSpec


class SourceRequest(NamedTuple):
    """A request a source claimed, once the engine allocated its blocks."""

    req_id: str
    params: Mapping[str, Any]
    block_ids: Sequence[Sequence[int]]  # per group, the whole request
    num_computed_tokens: int


class SourceLoad(NamedTuple):
    """A source's load of a request: ``src`` into ``dst``. ``kept``: what it loads stays the
    source's (the engine's tiers do not store it again: the prefill engine keeps a prompt it
    offered, and its next turn is prefilled there)."""

    src: TransferSpec
    dst: EngineBlocks
    kept: bool = True


class RequestSource(Protocol):
    @property
    def name(self) -> str: ...

    def lookup(
        self, params: Mapping[str, Any] | None, num_prompt_tokens: int, num_computed_tokens: int
    ) -> int: ...

    def plan_load(self, request: SourceRequest, num_external_tokens: int) -> SourceLoad | None: ...

    def holds(self, req_id: str) -> bool: ...

    @property
    def pending(self) -> bool: ...

    def take_messages(self) -> list[object]: ...
