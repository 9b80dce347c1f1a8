"""kv-aware's passes over the fleet, compiled (``_scoring.c``; see ``scoring._pick``)."""

def pick(
    in_flight: list[int],
    queued: list[int],
    recent: list[float],
    held: list[int],
    cost: list[float],
    bound: float,
    turn: int,
) -> tuple[int, bool]: ...
