"""Byte sizes written the way people write them: ``4GiB``, ``512MB``, ``1.5 GiB``, ``1024``.

Units (case-insensitive): ``B``; ``KB MB GB TB`` = powers of 1000; ``KiB MiB GiB TiB`` = powers
of 1024. A bare number is bytes. Bare ``K``/``M``/``G``/``T`` are refused: whether ``2G`` means
2*10**9 or 2*2**30 is a guess, and a wrong guess silently sizes a cache by 7%.
"""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

# number (digits, optional decimals), optional spaces, optional unit letters
_SIZE_RE = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[A-Za-z]*)\s*")

ACCEPTED_SIZE_FORMS = (
    "an int (bytes) or a string such as '4GiB', '512MB', '1.5 GiB', '1024' "
    "(units B; KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024)"
)


def parse_size(value: int | str, key: str) -> int:
    """Return ``value`` as a whole number of bytes (>= 0).

    ``key`` is the config key being parsed; it only names the culprit in the error. Raises
    ``ValueError`` for a bool, a negative size, an unknown unit, or a size that is not a whole
    number of bytes (``"1.5B"``).
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"kvtier: {key!r} must be {ACCEPTED_SIZE_FORMS}, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"kvtier: {key!r} must not be negative, got {value}")
        return value
    match = _SIZE_RE.fullmatch(value)
    if match is None:
        if value.strip().startswith("-"):
            raise ValueError(f"kvtier: {key!r} must not be negative, got {value!r}")
        raise ValueError(f"kvtier: {key!r} must be {ACCEPTED_SIZE_FORMS}, got {value!r}")
    unit = match["unit"].lower()
    if unit in ("k", "m", "g", "t"):
        raise ValueError(
            f"kvtier: {key!r} has ambiguous unit {match['unit']!r} in {value!r}: write "
            f"{match['number']}{unit.upper()}B (powers of 1000) or {match['number']}"
            f"{unit.upper()}iB (powers of 1024)"
        )
    multiplier = _UNITS.get(unit)
    if multiplier is None:
        raise ValueError(
            f"kvtier: {key!r} has unknown unit {match['unit']!r} in {value!r}; "
            f"expected {ACCEPTED_SIZE_FORMS}"
        )
    size = Fraction(match["number"]) * multiplier  # exact: no float rounding
    if size.denominator != 1:
        raise ValueError(f"kvtier: {key!r} must be a whole number of bytes, got {value!r}")
    return size.numerator
