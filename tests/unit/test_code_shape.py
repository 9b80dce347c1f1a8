"""The code's shape, as docs/DESIGN.md §6 states it, checked on the source itself: the three
connectors name no tier, no file is over 300 lines without saying why, no module-level import
cycle, and vLLM is imported only under ``kvtier/vllm/`` and by the applications."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
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


# The layers, lowest first: a module imports only from its own layer or below (every import,
# inside functions and for typing too). The halves never import each other.
LAYERS = (
    (
        "base",
        (
            "kvtier.addresses",
            "kvtier.checkpoint",
            "kvtier.config_parse",
            "kvtier.connect",
            "kvtier.counters",
            "kvtier.keys",
            "kvtier.layout",
            "kvtier.media",
            "kvtier.sizes",
            "kvtier.step_plan",
            "kvtier.pages",
        ),
    ),
    ("tier contracts", ("kvtier.tiers.base", "kvtier.tier_api")),
    ("tiers", ("kvtier.tiers",)),
    ("config", ("kvtier.config",)),
    ("halves", ("kvtier.scheduler", "kvtier.worker")),
    ("vllm", ("kvtier.vllm",)),
    ("apps", ("kvtier.apps",)),
)
FACADE = "kvtier"  # the package itself: ``kvtier.stats(llm)`` reaches the adapter lazily
APART = (("kvtier.scheduler", "kvtier.worker"), ("kvtier.worker", "kvtier.scheduler"))


def _layer(module: str) -> int:
    """The index of the layer ``module`` belongs to (the longest prefix that names it)."""
    best, found = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found >= 0, f"{module} is in no layer of test_code_shape.LAYERS"
    return found


def _all_imports(path: Path) -> set[str]:
    """Every kvtier module ``path`` imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("kvtier.")}


def test_every_import_points_down_the_layers() -> None:
    wrong = []
    for name, path in sorted(_modules().items()):
        if name == FACADE:
            continue
        mine = _layer(name)
        for imported in sorted(_all_imports(path)):
            theirs = _layer(imported)
            apart = any(name.startswith(a) and imported.startswith(b) for a, b in APART)
            if theirs > mine or apart:
                wrong.append(f"{name} ({LAYERS[mine][0]}) imports {imported} "
                             f"({LAYERS[theirs][0]})")  # fmt: skip
    assert wrong == []


def test_a_tier_imports_no_other_tier() -> None:
    """Each tier's package imports the contracts (``tiers.base``), never another tier."""
    wrong = []
    for name, path in sorted(_modules().items()):
        parts = name.split(".")
        if len(parts) < 3 or parts[1] != "tiers" or parts[2] in ("base", "registry"):
            continue
        for imported in _all_imports(path):
            other = imported.split(".")
            if len(other) > 2 and other[1] == "tiers" and other[2] not in ("base", parts[2]):
                wrong.append(f"{name} imports {imported}")
    assert wrong == []


LIGHT = ("config", "build", "messages")  # what a tier's package may load for its spec


def test_the_config_loads_neither_torch_nor_a_tier_implementation() -> None:
    """``import kvtier.config`` and a config with every tier's section parsed (what a launcher
    does to check one) stay light: the tiers' specs are imported, their implementations only
    when a tier is built, and torch not at all."""
    code = (
        "import sys, kvtier.config\n"
        "kvtier.config.KVTierConfig.from_extra_config({'cpu_bytes_to_use': '1GiB',"
        " 'disk': {'path': '/nonexistent', 'bytes': '1GiB'}, 'redis': {'url': 'redis://x:1'},"
        " 'transfer': {'secret': 's' * 32}}, 16)\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "torch" not in loaded
    heavy = [
        name for name in loaded
        if name.startswith("kvtier.tiers.") and not name.startswith("kvtier.tiers.base")
        and name != "kvtier.tiers.registry" and len(name.split(".")) > 3
        and name.split(".")[-1] not in LIGHT
    ]  # fmt: skip
    assert heavy == []


def test_the_outside_tier_under_tests_imports_only_the_public_module() -> None:
    """``tests/engine/memory_tier.py`` is written as a tier from outside kvtier would be."""
    path = ROOT.parent / "tests" / "engine" / "memory_tier.py"
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    from_kvtier = {name for name in imported if name and name.startswith("kvtier")}
    assert from_kvtier == {"kvtier"}  # ``from kvtier import tier_api``
    assert "from kvtier import tier_api as api" in path.read_text()
