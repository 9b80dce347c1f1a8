"""The code's shape, as docs/DESIGN.md §6 states it, checked on the source itself: the three
connectors name no tier, no file is over 300 lines without saying why, no module-level import
cycle, and vLLM is imported only under ``kvtier/vllm/`` and by the applications."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "kvtier"
CONNECTORS = ("worker/connector.py", "scheduler/connector.py", "vllm/connector.py")
MAX_LINES = 300
REASON = "Over 300 lines because"
VLLM_ALLOWED = ("kvtier.vllm", "kvtier.apps")


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _top_level_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules imported when ``path`` is imported (not inside functions, not for typing);
    ``from package import module`` imports the module."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
                for alias in inner.names:
                    submodule = f"{inner.module}.{alias.name}"
                    names.add(submodule if submodule in modules else inner.module)
            elif isinstance(inner, ast.Import):
                names.update(alias.name for alias in inner.names)
    return names


def test_the_connectors_name_no_tier() -> None:
    for name in CONNECTORS:
        text = (ROOT / name).read_text()
        found = [line for line in text.splitlines() if re.search("disk|redis|peer", line)]
        assert found == [], f"{name} names a tier: {found}"


def test_no_file_is_over_300_lines_without_a_reason() -> None:
    long = []
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if text.count("\n") > MAX_LINES and REASON not in docstring:
            long.append(str(path.relative_to(ROOT)))
    assert long == []


def test_no_module_level_import_cycle() -> None:
    modules = _modules()
    graph = {
        name: {m for m in _top_level_imports(path, modules) if m in modules and m != name}
        for name, path in modules.items()
    }
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            raise AssertionError(" -> ".join([*stack[stack.index(name) :], name]))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*stack, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_vllm_is_imported_only_by_its_adapter_and_the_applications() -> None:
    outside = [
        name
        for name, path in _modules().items()
        if not name.startswith(VLLM_ALLOWED)
        and re.search(r"^\s*(import vllm|from vllm[ .])", path.read_text(), re.MULTILINE)
    ]
    assert outside == []
