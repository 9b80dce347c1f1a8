"""Where prompts' KV came from, as a table a person reads at a glance.

    add_up(params) -> ProvenanceTotals   sums completions' ``kv_transfer_params`` (kvtier's part)
    provenance_table(title, rows) -> Table   one row per (label, totals): the share of each source

A completion served by an engine with kvtier carries ``kv_transfer_params["kvtier"]``:
``prompt_tokens``, ``engine_cached_tokens``, one count per tier (``cpu``, ``disk``, ...),
``failed_tokens``, ``computed`` and ``load_ms``, and ``declined`` (per tier, the tokens it held
that the engine computed instead, as loading was predicted slower) when there are any (see
``kvtier.scheduler.provenance``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rich.table import Table

from kvtier.scheduler.provenance import NOT_TIERS

TIER_TITLES = {"cpu": "host\nmemory", "disk": "disk"}


@dataclass(frozen=True)
class ProvenanceTotals:
    requests: int = 0
    prompt_tokens: int = 0
    engine_cached_tokens: int = 0
    tiers: dict[str, int] = field(default_factory=dict)  # tokens per kvtier tier
    failed_tokens: int = 0  # planned loads that failed (the engine computed them)
    computed_tokens: int = 0
    load_ms: float = 0.0  # summed over the requests
    declined_tokens: int = 0  # of ``computed_tokens``: a tier held them, loading was slower


def add_up(params: Iterable[Mapping[str, object] | None]) -> ProvenanceTotals:
    """The sum over completions' ``kv_transfer_params``; those without kvtier's part are skipped."""
    requests = prompt = engine = failed = computed = declined = 0
    load_ms = 0.0
    tiers: dict[str, int] = {}
    for entry in params:
        found = entry.get("kvtier") if entry else None
        if not isinstance(found, Mapping):
            continue
        requests += 1
        prompt += int(found["prompt_tokens"])
        engine += int(found["engine_cached_tokens"])
        failed += int(found.get("failed_tokens", 0))
        computed += int(found["computed"])
        load_ms += float(found.get("load_ms", 0.0))
        named = found.get("declined")
        if isinstance(named, Mapping):
            declined += sum(int(tokens) for tokens in named.values())
        for tier, tokens in found.items():
            if tier not in NOT_TIERS:
                tiers[tier] = tiers.get(tier, 0) + int(tokens)
    return ProvenanceTotals(requests, prompt, engine, tiers, failed, computed, load_ms, declined)


def provenance_table(title: str, rows: Sequence[tuple[str, ProvenanceTotals]]) -> Table:
    """Tokens (and share of the prompt tokens) from the engine's cache, each tier, computed
    (and of those, computed instead of loaded, as loading was predicted slower: when any)."""
    tiers = list(dict.fromkeys(tier for _, totals in rows for tier in totals.tiers))
    table = Table(title=title)
    table.add_column("", justify="right")
    for column in ("requests", "prompt\ntokens", "engine's\nown cache"):
        table.add_column(column, justify="right")
    for tier in tiers:
        table.add_column(TIER_TITLES.get(tier, tier), justify="right", style="green")
    instead = any(totals.declined_tokens for _, totals in rows)
    columns = ("computed", "computed\ninstead", "load ms\nper request")
    for column in columns if instead else (columns[0], columns[2]):
        table.add_column(column, justify="right")
    for label, totals in rows:

        def share(tokens: int, total: int = totals.prompt_tokens) -> str:
            return f"{tokens} ({tokens / total:.0%})" if total else str(tokens)

        per_request = totals.load_ms / totals.requests if totals.requests else 0.0
        table.add_row(
            label, str(totals.requests), str(totals.prompt_tokens),
            share(totals.engine_cached_tokens), *(share(totals.tiers.get(t, 0)) for t in tiers),
            share(totals.computed_tokens),
            *([share(totals.declined_tokens)] if instead else []), f"{per_request:.2f}",
        )  # fmt: skip
    return table
