"""kv-aware's passes over the fleet, compiled (``_scoring.c``; see ``scoring._pick``)."""

from collections.abc import Iterable, Sequence
from typing import Any

def pick(
    loads: tuple[Sequence[Any], Sequence[Any], Sequence[Any]],
    held: int,
    cost: float,
    apart: Sequence[tuple[int, float, Iterable[int]]],
    bound: float,
    turn: int,
) -> tuple[int, int, bool]: ...
