"""A ``--model`` argument: a local model's name (``kvtier.apps.models``) or its directory.

    model_arg(value) -> str | Path    the directory when it is one, else the name
    model_dir(value) -> Path          the directory either way (a named model built if missing)

A directory is one that holds a ``config.json``.
"""

from __future__ import annotations

from pathlib import Path


def model_arg(value: str) -> str | Path:
    """``value`` as a directory when it holds a ``config.json``, else as a model's name."""
    return Path(value) if (Path(value) / "config.json").is_file() else value


def model_dir(value: str) -> Path:
    """``value``'s directory: itself when it holds a ``config.json``, else the local model of
    that name (``kvtier.apps.models``, built if missing)."""
    from kvtier.apps.models import model_path

    found = model_arg(value)
    return found if isinstance(found, Path) else model_path(found)
