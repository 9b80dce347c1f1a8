"""This process made to import only what ``make test-gpu``'s machine has: a GPU run's imports
checked on the CPU, where every package of the project's venv is importable.

    allowed_modules() -> set[str]   top-level modules the GPU machine can import: the standard
                                    library's, kvtier's and the tests' own, those of the
                                    distributions it has (``MACHINE`` and what they require) and
                                    of those ``scripts/gpu-prepare`` brings
    install(allowed)                every other module absent from this process from now on, as
                                    it is there: ``import`` raises ``ModuleNotFoundError``,
                                    ``importlib.util.find_spec`` answers None
    restrict()                      ``install(allowed_modules())``
    gpu_run_modules() -> [name]     what ``make test-gpu`` imports of kvtier: its core (all but
                                    ``kvtier.vllm`` and ``kvtier.apps``), the modules it runs,
                                    and every kvtier module ``tests/gpu`` and ``kvtier bench gpu``
                                    name, at any depth (a test's own imports run only on a GPU)

``python gpu_machine.py`` installs it, imports ``gpu_run_modules()`` and collects ``tests/gpu``
as ``make test-gpu`` runs it, and prints a JSON object: per module that failed to import, its
error (Triton, which the GPU machine has, may be missing here: its absence is no failure), and
pytest's exit status for the collection.

The GPU session has one try of a few minutes; a module the run imports that the machine lacks
(a dependency added to kvtier's core, a bench module, ``tests/gpu`` or its conftest) would cost
it. A package imported only where present (``try: import x``) is absent here as it is there.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
MACHINE = ("torch", "numpy", "transformers", "safetensors", "triton")  # issue 37: what it has
PREPARE_LISTS = ("PURE", "CORE", "PLOT")  # scripts/gpu-prepare's arrays of what it brings
RUN = ("kvtier.apps.cli", "kvtier.apps.bench.gpu.markdown")  # make test-gpu's python -m
NAMING = ("tests/gpu", "kvtier/apps/bench/gpu")  # where the kvtier modules it imports are named


def prepared() -> list[str]:
    """The distributions ``scripts/gpu-prepare`` brings (its ``PURE``, ``CORE``, ``PLOT``)."""
    text = (ROOT / "scripts" / "gpu-prepare").read_text()
    names: list[str] = []
    for array in PREPARE_LISTS:
        found = re.search(rf"^{array}=\(([^)]*)\)", text, re.MULTILINE)
        if found is None:
            raise ValueError(f"scripts/gpu-prepare: no {array}=(...) array")
        names += [entry.split("==")[0] for entry in found[1].split()]
    return names


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _required(names: Sequence[str]) -> set[str]:
    """``names`` and every distribution they require here (markers evaluated, no extras), as
    normalized names; those not installed here count by name alone."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = _normal(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def allowed_modules() -> set[str]:
    dists = _required([*MACHINE, *prepared()])
    modules = {module for module, owners in metadata.packages_distributions().items()
               if any(_normal(owner) in dists for owner in owners)}  # fmt: skip
    own = {path.stem for path in (ROOT / "tests").glob("*.py")}
    return modules | own | _standard() | {"kvtier", "triton", "__main__"}


def _standard() -> set[str]:
    """The standard library's modules, private ones (``_sysconfigdata_*``) included."""
    folders = {Path(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
    folders |= {folder / "lib-dynload" for folder in list(folders)}
    files = {path.name.partition(".")[0] for folder in folders if folder.is_dir()
             for path in folder.iterdir()}  # fmt: skip
    return files | set(sys.stdlib_module_names) | set(sys.builtin_module_names)


class _Absent(importlib.abc.MetaPathFinder):
    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] in self.allowed:
            return None  # the other finders look for it
        raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU machine of "
                                  "make test-gpu: neither its own nor brought by "
                                  "scripts/gpu-prepare)", name=name)  # fmt: skip


def install(allowed: set[str]) -> None:
    absent = _Absent(allowed)
    sys.meta_path.insert(0, absent)
    find_spec = importlib.util.find_spec

    def present(name: str, package: str | None = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(".") and name.partition(".")[0] not in allowed:
            return None
        return find_spec(name, package)

    importlib.util.find_spec = present  # libraries ask it whether an optional package is there


def restrict() -> None:
    install(allowed_modules())


def gpu_run_modules() -> list[str]:
    found = set(RUN)
    for path in (ROOT / "kvtier").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[1] not in ("vllm", "apps"):
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    for folder in NAMING:
        for path in (ROOT / folder).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                found.update(name for name in names if name.partition(".")[0] == "kvtier")
    return sorted(found)


def main() -> int:
    restrict()
    failed: dict[str, str] = {}
    for name in gpu_run_modules():
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if (e.name or "").partition(".")[0] != "triton":
                failed[name] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - each failure is reported, the rest go on
            failed[name] = f"{type(e).__name__}: {e}"
    import pytest

    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the venv's plugins are not there
    collected = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider",
                             str(ROOT / "tests" / "gpu")])  # fmt: skip
    print(json.dumps({"failed": failed, "collected": int(collected)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
