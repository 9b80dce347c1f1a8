"""kv-aware's decision, compiled (``_scoring.c``; see ``scoring.choose`` given ``Held``)."""

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_runs import Holders

def pack(masks: tuple[Any, int, str | None], engines: int) -> bytes: ...
def decide(
    stretches: Sequence[tuple[Holders, int]],
    fleet: Positions,
    loads: tuple[Sequence[Any], Sequence[Any], Sequence[Any]],
    blind: Collection[int],
    prompt_tokens: int,
    block_size: int,
    load_bound: float,
    turn: int,
    weights: Mapping[str, float],
    other_weight: float,
) -> tuple[int, int, bool]: ...
