"""What a TTFT run measured: one results class for every TTFT bench, and a served request's check.

TierCheck.of(tier, full_chunks, before, after, sample, resident)   what kvtier's counters
                      say of one request: chunks found and loaded from the tier, found in
                      host memory instead, bad, failed; load seconds; tokens not computed
.served(least, chunk_tokens) -> bool   the request came from the tier: at least ``least``
                      chunks found and loaded, none bad or failed, the engine skipping them
.as_json()            its JSON (keys named after the tier: ``disk_loaded_chunks``)
TTFTResults           samples and checks by (measure, prompt length), other load by phase
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from kvtier.apps.bench.common.timing import median
from kvtier.apps.bench.ttft.timing import Sample

if TYPE_CHECKING:
    from kvtier.counters import KVTierStats


class TierCheck(NamedTuple):
    tier: str
    full_chunks: int  # whole chunks in the prompt
    hit_chunks: int  # found in the tier by the request's lookup
    loaded_chunks: int  # loaded from the tier
    cpu_hit_chunks: int  # found in host memory (for a tier below it: expected none)
    bad_chunks: int
    failed_loads: int
    load_s: float  # the tier's load seconds during the request
    cached_tokens: int  # prompt tokens the engine did not compute
    resident_before: float | None = None  # the tier's files in the page cache before (~0)

    @classmethod
    def of(
        cls,
        tier: str,
        full_chunks: int,
        before: KVTierStats,
        after: KVTierStats,
        sample: Sample,
        resident_before: float | None = None,
    ) -> TierCheck:
        was, now = before.tiers[tier], after.tiers[tier]
        return cls(
            tier, full_chunks, now.hit_chunks - was.hit_chunks,
            now.loaded_chunks - was.loaded_chunks, after.cpu.hit_chunks - before.cpu.hit_chunks,
            now.bad_chunks - was.bad_chunks, now.failed_loads - was.failed_loads,
            round(now.load_seconds - was.load_seconds, 4), sample.cached_tokens, resident_before,
        )  # fmt: skip

    def served(self, least: float, chunk_tokens: int) -> bool:
        found = min(self.hit_chunks, self.loaded_chunks)
        skipped = self.cached_tokens >= least * chunk_tokens
        return found >= least and not self.bad_chunks and not self.failed_loads and skipped

    def as_json(self) -> dict[str, Any]:
        found = {
            "full_chunks": self.full_chunks, f"{self.tier}_hit_chunks": self.hit_chunks,
            f"{self.tier}_loaded_chunks": self.loaded_chunks,
            "cpu_hit_chunks": self.cpu_hit_chunks, "bad_chunks": self.bad_chunks,
            "failed_loads": self.failed_loads, "load_s": self.load_s,
        }  # fmt: skip
        if self.resident_before is not None:
            found["resident_before"] = round(self.resident_before, 4)
        return found


@dataclass
class TTFTResults:
    """Everything one run measured, keyed by (measure, prompt length); lists in the order
    taken. ``other_load``: cores other work took, per phase of the run."""

    samples: dict[tuple[str, int], list[Sample]] = field(default_factory=lambda: defaultdict(list))
    checks: dict[tuple[str, int], list[TierCheck]] = field(
        default_factory=lambda: defaultdict(list)
    )
    other_load: dict[str, float | None] = field(default_factory=dict)

    def record(self, measure: str, length: int, sample: Sample) -> Sample:
        self.samples[measure, length].append(sample)
        return sample

    def seconds(self, measure: str, length: int) -> list[float]:
        return [s.seconds for s in self.samples[measure, length]]

    def median_s(self, measure: str, length: int) -> float:
        return median(self.seconds(measure, length))

    def measured(self, length: int) -> list[str]:
        """The measures taken at ``length``, in the order first taken."""
        return [m for (m, n), runs in self.samples.items() if n == length and runs]

    def check_list(self, measure: str) -> list[TierCheck]:
        """Every check of ``measure``, over all lengths."""
        return [c for (m, _), checks in self.checks.items() if m == measure for c in checks]

    def raw_seconds(self) -> dict[str, dict[int, list[float]]]:
        """Every sample's seconds, rounded: {measure: {length: [seconds]}}."""
        raw: dict[str, dict[int, list[float]]] = {}
        for (measure, length), runs in sorted(self.samples.items()):
            raw.setdefault(measure, {})[length] = [round(s.seconds, 4) for s in runs]
        return raw
