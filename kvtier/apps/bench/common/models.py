"""A ``--model`` argument: a local model's name (``kvtier.apps.models``) or its directory."""

from __future__ import annotations

from pathlib import Path


def model_arg(value: str) -> str | Path:
    """``value`` as a directory when it holds a ``config.json``, else as a model's name."""
    return Path(value) if (Path(value) / "config.json").is_file() else value
