"""The benchmarks' PNGs: matplotlib without a display, and one way to save a figure.

pyplot()              -> module   ``matplotlib.pyplot`` on the Agg backend (ImportError when
                                  matplotlib is absent: the GPU machine may lack it)
save(figure, path, dpi=120)       laid out tightly, written to ``path`` (its folder made),
                                  closed
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure: Any, path: Path, dpi: int = 120) -> None:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    pyplot().close(figure)
