"""vLLM's ``kv_transfer_config`` for the connectors the benchmarks and the demo run.

    kvtier_config(extra, role="kv_both")  ``KVTierConnector`` with ``extra`` as its
                                          ``kv_connector_extra_config`` (copied)
    example_config(path)                  vLLM's ``ExampleConnector``, its files under ``path``

A returned dict is the caller's to change.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

KVTIER_CONNECTOR = "KVTierConnector"
ROLES = ("kv_both", "kv_producer", "kv_consumer")


def kvtier_config(extra: Mapping[str, Any], role: str = "kv_both") -> dict[str, Any]:
    if role not in ROLES:
        raise ValueError(f"kv_role must be one of {ROLES}, got {role!r}")
    return {
        "kv_connector": KVTIER_CONNECTOR,
        "kv_connector_module_path": "kvtier.vllm",
        "kv_role": role,
        "kv_connector_extra_config": copy.deepcopy(dict(extra)),
    }


def example_config(path: Path) -> dict[str, Any]:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(path)},
    }
