"""The newest ``vllm`` release on PyPI, as source: what GPU users install, read or run on the CPU.

    newest_source() -> (version, root)    ``root / "vllm"`` is its package's Python source

Read from its source distribution (the wheel is a CUDA build), once per release: the package's
files are cached under ``~/.cache/kvtier/vllm-src/<version>``. Only its Python can run here:
put ``root`` first on ``sys.path`` (``PYTHONPATH``) in a process of its own.
"""

from __future__ import annotations

import functools
import io
import json
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

PYPI = "https://pypi.org/pypi/vllm/json"
CACHE = Path.home() / ".cache" / "kvtier" / "vllm-src"


@functools.cache  # one answer per test process
def newest_source() -> tuple[str, Path]:
    with urllib.request.urlopen(PYPI, timeout=60) as answer:
        release = json.load(answer)
    version = release["info"]["version"]
    root = CACHE / version
    if (root / "vllm" / "__init__.py").exists():
        return version, root
    (sdist,) = [f["url"] for f in release["urls"] if f["packagetype"] == "sdist"]
    with urllib.request.urlopen(urllib.parse.urljoin(PYPI, sdist), timeout=300) as answer:
        data = answer.read()
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=CACHE, prefix=f".{version}-"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        top = f"vllm-{version}/vllm/"
        members = [m for m in tar.getmembers() if m.name.startswith(top) and m.isfile()]
        tar.extractall(staging, members, filter="data")
    try:  # another test process may have cached it meanwhile: keep the first
        (staging / f"vllm-{version}").rename(root)
    except OSError:
        pass
    shutil.rmtree(staging, ignore_errors=True)
    return version, root
