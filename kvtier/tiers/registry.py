"""Which tiers kvtier knows, in the chain's order: its own, then those from outside.

    specs(extra)        -> [TierSpec[Any]]   kvtier's tiers, then the ``kvtier.tiers`` entry points
                                        (an installed package's), then ``extra`` (import paths
                                        ``"package.module:NAME"``, the extra-config key ``tiers``)
    load_spec(path, key) -> TierSpec[Any]    one import path, or a ValueError naming ``key``

The chain below host memory is the specs with a scheduler builder whose config is set, in this
order: disk first (local, read before the forward when short), then Redis (shared by a fleet),
then the outside tiers. A tier from outside is a module exporting a ``TierSpec``: kvtier's own
packages are written the same way (``kvtier/tiers/disk/__init__.py``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Sequence
from functools import cache
from typing import Any

from kvtier.tiers.base.spec import TierSpec

BUILTIN = (
    "kvtier.tiers.host:SPEC",
    "kvtier.tiers.disk:SPEC",
    "kvtier.tiers.redis:SPEC",
    "kvtier.tiers.peer:SPEC",
)
ENTRY_POINTS = "kvtier.tiers"  # [project.entry-points."kvtier.tiers"] name = "pkg.mod:SPEC"


def load_spec(path: str, key: str = "tiers") -> TierSpec[Any]:
    """The ``TierSpec`` at ``path`` (``"package.module:NAME"``); ValueError naming ``key``."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"kvtier: {key!r} must name a tier as 'package.module:NAME', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"kvtier: {key!r}: cannot import {module_name!r}: {error}") from error
    spec = getattr(module, attr, None)
    if not isinstance(spec, TierSpec):
        raise ValueError(f"kvtier: {key!r}: {path!r} is not a kvtier TierSpec ({spec!r})")
    return spec


@cache
def _installed() -> tuple[TierSpec[Any], ...]:
    found = importlib.metadata.entry_points(group=ENTRY_POINTS)
    return tuple(load_spec(entry.value, f"entry point {entry.name!r}") for entry in found)


def specs(extra: Sequence[str] = ()) -> list[TierSpec[Any]]:
    """Every known tier, in the chain's order; ValueError on two tiers of one name or section."""
    found = [load_spec(path, "builtin") for path in BUILTIN]
    found += _installed()
    found += [load_spec(path, "tiers") for path in extra]
    names: set[str] = set()
    sections: set[str] = set()
    for spec in found:
        if spec.name in names or (spec.section is not None and spec.section in sections):
            raise ValueError(f"kvtier: two tiers named {spec.name!r} (or with the config "
                             f"section {spec.section!r})")  # fmt: skip
        names.add(spec.name)
        if spec.section is not None:
            sections.add(spec.section)
    return found
