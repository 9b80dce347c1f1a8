"""The cost decision: how far into its run a hit loads, and how, by predicted benefit.

    choose_by_benefit(run, request, policy, tail_ready, costs) -> Hit

A hit stays a prefix: it ends at the start of the run (no hit), or where one tier's part of the
run ends (the host part, the tail after it, each tier of the chain), or where the part a load may
read before the forward ends. For an end covering ``n`` tokens beyond the engine's hit, ``t_i``
of them in tier ``i`` (``costs``, seconds):

    benefit = MARGIN * compute * n - sum_i load_i(t_i) - (wait, if the load makes it wait)

and the end with the largest positive benefit wins (a tie: the longer one); none: no hit.
MARGIN > 1 leans towards loading: a load is declined only when predicted clearly slower than
computing its tokens, not within the noise of the measurements.

The load runs before the step's forward (no wait) when the rules allow it (one group, the
request's length known, no network tier: ``run.sync_end``) and its read from the chain is short:
predicted to stall the step no longer than a wait would cost the request. Otherwise the request
waits for it. Asking again next step, for a store in flight or a remote tier still looking up,
is worth it when the tokens it may add save more than a wait costs.

With ``min_async_load_tokens`` set, the rules decide how, as before: a read from the chain
before the forward is shorter than it, a load that makes the request wait (and asking again)
adds at least as many tokens, and a wait costs nothing more; the costs then decide only whether
a tier's part is slower to load than to compute.

The chunks of the run past the chosen end, up to the longest end the rules allow, are declined:
loading them was predicted slower than computing them (``Hit.declined``, per tier).
"""

from __future__ import annotations

from typing import NamedTuple

from kvtier.scheduler.costs import CostView
from kvtier.scheduler.hit import Declined, Hit, HitPolicy, HitRequest, HitRun

MARGIN = 1.25  # a load is declined only when predicted to cost more than 1.25x the compute
HOST = "cpu"  # the host tier's name in the costs and the stats


class _Option(NamedTuple):
    end: int  # chunk index
    tokens: int
    load_async: bool
    benefit: float  # seconds
    parts: dict[str, int]  # tokens from each tier (the host first), in the run's order


def choose_by_benefit(
    run: HitRun, request: HitRequest, policy: HitPolicy, tail_ready: bool, costs: CostView
) -> Hit:
    """The hit to answer for ``run`` by its predicted benefit (see the module's docstring)."""
    host_end = run.host_end
    if tail_ready and host_end == request.full:
        host_end += 1  # the tail, in host memory after a full run
    weigh = _Weighing(request, policy, costs, _bounds(run, host_end), run)
    ends = sorted({stop for _, stop in weigh.bounds} | {weigh.sync_end, run.end})
    options = [
        option for end in ends if end > request.first and (option := weigh.option(end)) is not None
    ]
    best = max(options, key=lambda o: (o.benefit, o.end), default=None)
    chosen = best if best is not None and best.benefit > 0 else None
    loaded = chosen.tokens if chosen is not None else 0
    if run.pending and weigh.could_pay(
        weigh.tokens(request.full) - max(loaded, weigh.tokens(run.end))
    ):
        return Hit(None)  # a remote tier may hold more than it would cost to wait for
    if run.retry and not loaded and weigh.could_pay(weigh.tokens(request.full)):
        return Hit(None)  # the next chunk's store is in flight: worth a step
    declined = weigh.declined(options, chosen, run.host_end)
    if chosen is None:
        return Hit(0, declined=declined)
    tiers = tuple(tier for tier, count in chosen.parts.items() if count)
    return Hit(chosen.tokens, chosen.load_async, tiers, declined)


def _bounds(run: HitRun, host_end: int) -> list[tuple[str, int]]:
    """Each tier's part of the run as (tier, chunk index where it ends), the host part first."""
    bounds = [(HOST, host_end)]
    stop = host_end
    for tier, end in run.parts:
        stop = max(stop, min(end, run.end))
        bounds.append((tier, stop))
    if stop < run.end:  # a run whose chain part names no tier: one part, costed as free
        bounds.append(("", run.end))
    return bounds


class _Weighing:
    """One request's run, weighed end by end."""

    def __init__(
        self,
        request: HitRequest,
        policy: HitPolicy,
        costs: CostView,
        bounds: list[tuple[str, int]],
        run: HitRun,
    ) -> None:
        self.request, self.policy, self.costs, self.bounds = request, policy, costs, bounds
        self.sync_end = run.end if run.sync_end is None else run.sync_end

    def tokens(self, end: int) -> int:
        return self.request.covered(end, self.policy.chunk_tokens)

    def could_pay(self, extra: int) -> bool:
        """Whether ``extra`` more tokens would be worth asking again next step (a wait)."""
        min_async = self.policy.min_async_load_tokens
        if min_async is not None:
            return extra >= min_async
        return MARGIN * self.costs.compute * extra > self.costs.wait

    def option(self, end: int) -> _Option | None:
        """The hit ending at chunk ``end``: its tokens, mode and benefit (None: the rules
        forbid it, or it adds no token)."""
        count = self.tokens(end)
        if count <= 0:
            return None
        parts, before = {}, 0
        for tier, stop in self.bounds:
            upto = self.tokens(min(end, stop))
            parts[tier] = max(0, upto - before)
            before = max(before, upto)
        costs, policy, min_async = self.costs, self.policy, self.policy.min_async_load_tokens
        reads = {tier: costs.load(tier, n) for tier, n in parts.items() if n}
        chain_tokens = count - parts[HOST]
        chain_read = sum(seconds for tier, seconds in reads.items() if tier != HOST)
        short = chain_read <= costs.wait if min_async is None else chain_tokens < min_async
        sync = (
            policy.sync_capable
            and self.request.num_tokens is not None
            and (chain_tokens == 0 or (end <= self.sync_end and short))
        )
        if not sync and min_async is not None and count < min_async:
            return None
        wait = 0.0 if sync or min_async is not None else costs.wait  # set: the rule's floor
        cost = sum(reads.values()) + wait
        return _Option(end, count, not sync, MARGIN * costs.compute * count - cost, parts)

    def declined(
        self, options: list[_Option], chosen: _Option | None, host_chunks_end: int
    ) -> tuple[Declined, ...]:
        """Per tier, the chunks (and tokens) between the chosen end and the longest one the
        rules allow."""
        if not options:
            return ()
        longest = max(options, key=lambda o: o.end)
        first = self.request.first
        start = first if chosen is None else chosen.end
        if longest.end <= start:
            return ()
        found, low = [], first
        for tier, stop in self.bounds:
            high = min(stop, host_chunks_end) if tier == HOST else stop  # the tail is no chunk
            chunks = max(0, min(high, longest.end) - max(low, start))
            tokens = longest.parts.get(tier, 0) - (chosen.parts.get(tier, 0) if chosen else 0)
            if chunks or tokens > 0:
                found.append(Declined(tier, chunks, max(0, tokens)))
            low = max(low, stop)
        return tuple(found)
