"""The kernel's page cache of files, for benchmarks that time cold reads (Linux; no root needed).

    drop(paths)              evict the files' clean pages (``posix_fadvise(DONTNEED)``)
    resident(paths) -> float the fraction of the files' pages in the page cache (``mincore``)
    files(root)     -> list  every regular file under a directory
    drop_tree(root) -> float ``os.sync()``, then ``drop`` every file under ``root``: what stays
                             resident (~0)

``drop`` only evicts clean pages: call ``os.sync()`` first. ``resident`` is how a benchmark shows
that a drop worked and that a timed read really read a file.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)


def files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


def drop_tree(root: Path) -> float:
    os.sync()
    found = files(root)
    drop(found)
    return resident(found)


def drop(paths: Iterable[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(paths: Iterable[Path]) -> float:
    """Pages of ``paths`` in the page cache / their pages (1.0 when there is nothing to map)."""
    cached = total = 0
    for path in paths:
        in_cache, pages = _resident_pages(path)
        cached, total = cached + in_cache, total + pages
    return cached / total if total else 1.0


def _resident_pages(path: Path) -> tuple[int, int]:
    """(pages in the page cache, pages) of one file. Mapping it touches no page."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        start = ctypes.c_char.from_buffer(mm)  # ACCESS_COPY: writable, so ctypes can take it
        try:
            failed = _libc.mincore(ctypes.c_void_p(ctypes.addressof(start)),
                                   ctypes.c_size_t(size), vector)  # fmt: skip
        finally:
            del start  # the mapping cannot close while ctypes holds it
    if failed:
        raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
    return sum(byte & 1 for byte in vector), pages
