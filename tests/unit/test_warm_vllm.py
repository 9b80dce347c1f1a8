"""``scripts/warm-vllm`` (run by ``make models``) warms what the tests' engines use: it inspects
the class of every model ``make models`` builds, and every module it imports exists in this vLLM."""

from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path

from kvtier.apps.models import MODEL_NAMES, model_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "warm-vllm"


def test_every_local_models_class_is_inspected() -> None:
    warm = runpy.run_path(str(SCRIPT))
    built = {name: json.loads((model_path(name) / "config.json").read_text())["architectures"]
             for name in MODEL_NAMES}  # fmt: skip
    assert all(set(architectures) <= set(warm["ARCHITECTURES"])
               for architectures in built.values()), built  # fmt: skip


def test_every_module_it_imports_exists() -> None:
    warm = runpy.run_path(str(SCRIPT))
    assert [name for name in warm["SERVED"] if importlib.util.find_spec(name) is None] == []
