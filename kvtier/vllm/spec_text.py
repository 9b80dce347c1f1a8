"""A KV cache group's spec as text that names its KV the same in every vLLM release.

    spec_text(spec) -> str   e.g. "FullAttentionSpec(block_size=32, num_kv_heads=2, ...)"

The layout fingerprint names each group by its spec. A spec's ``repr`` lists every field, and
releases add fields (0.34 added ``is_draft`` and ``kv_head_major_slots`` to every attention
spec): by ``repr``, engines of two releases would share no chunk, and a disk tier would be lost
at each upgrade. So the text lists only the fields not at their defaults: a field a release adds
at a default meaning "as before" leaves it unchanged; one set otherwise names other KV. What the
bytes look like in memory (strides, page order) is checked apart, on every record, by each rank.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def spec_text(spec: Any) -> str:
    return _text(spec)


def _text(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [
            f"{field.name}={_text(getattr(value, field.name))}"
            for field in dataclasses.fields(value)
            if field.repr and not _at_default(field, getattr(value, field.name))
        ]
        return f"{type(value).__name__}({', '.join(fields)})"
    if isinstance(value, dict):
        items = sorted((str(key), _text(item)) for key, item in value.items())
        return "{" + ", ".join(f"{key!r}: {item}" for key, item in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_text(item) for item in value) + "]"
    return repr(value)


def _at_default(field: dataclasses.Field[Any], value: Any) -> bool:
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        return False
    try:
        return bool(value == default) and type(value) is type(default)
    except Exception:  # noqa: BLE001 - a value that cannot be compared is shown
        return False
