"""The config's parsers: ``(value, dotted key) -> typed value``, or a ``ValueError`` naming the key.

Shared by ``config.py`` (the top level) and each tier's config section (``tiers/<name>/config.py``).
Every error starts with ``kvtier: `` and names the key (dotted for nested keys: ``disk.bytes``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, TypeVar

from kvtier.sizes import ACCEPTED_SIZE_FORMS, parse_size

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
Parser = Callable[[object, str], T]


# --- one parser per type: (value, dotted key) -> typed value, or ValueError naming the key ---


def positive_int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"kvtier: {key!r} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"kvtier: {key!r} must be a positive integer, got {value}")
    return value


def positive_size(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"kvtier: {key!r} must be {ACCEPTED_SIZE_FORMS}, got {value!r}")
    size = parse_size(value, key)
    if size == 0:
        raise ValueError(f"kvtier: {key!r} must be more than 0 bytes, got {value!r}")
    return size


def positive_float(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"kvtier: {key!r} must be a positive number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"kvtier: {key!r} must be a positive number, got {value!r}")
    return float(value)


def non_negative_float(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"kvtier: {key!r} must be a number >= 0, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"kvtier: {key!r} must be a number >= 0, got {value!r}")
    return float(value)


def port(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
        raise ValueError(f"kvtier: {key!r} must be a port 0..65535 (0: ephemeral), got {value!r}")
    return value


def as_bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"kvtier: {key!r} must be true or false, got {value!r}")
    return value


def non_empty_str(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"kvtier: {key!r} must be a non-empty string, got {value!r}")
    return value


def choice(choices: tuple[str, ...]) -> Parser[str]:
    def parse(value: object, key: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"kvtier: {key!r} must be one of {', '.join(choices)}; got {value!r}")
        return value

    return parse


# --- mappings: accepted keys, required and optional values; key "" is the top level ---


def keys(cls: type[DataclassInstance]) -> tuple[str, ...]:
    """Accepted keys of a config dataclass: its field names."""
    return tuple(f.name for f in fields(cls))


def dotted(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def mapping(
    raw: object, key: str, accepted: tuple[str, ...], strict: bool = True
) -> Mapping[str, object]:
    """``raw`` as a mapping whose keys are all in ``accepted`` (``strict``; else any keys)."""
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"kvtier: {key or 'kv_connector_extra_config'!r} must be a mapping with keys "
            f"{', '.join(accepted)}; got {raw!r}"
        )
    for name in raw if strict else ():
        if name not in accepted:
            close = difflib.get_close_matches(str(name), accepted, n=1)
            hint = f"; did you mean {dotted(key, close[0])!r}?" if close else ""
            raise ValueError(
                f"kvtier: unknown key {dotted(key, str(name))!r}{hint} "
                f"(accepted keys: {', '.join(dotted(key, a) for a in accepted)})"
            )
    return raw


def required(raw: Mapping[str, object], key: str, name: str, parse: Parser[T]) -> T:
    """``parse`` of ``raw[name]``; absent or ``None`` is an error."""
    value = raw.get(name)
    if value is None:
        raise ValueError(f"kvtier: {dotted(key, name)!r} is required")
    return parse(value, dotted(key, name))


def optional(raw: Mapping[str, object], key: str, name: str, parse: Parser[T], default: T) -> T:
    """``parse`` of ``raw[name]``, or ``default`` when it is absent or ``None``."""
    value = raw.get(name)
    return default if value is None else parse(value, dotted(key, name))
