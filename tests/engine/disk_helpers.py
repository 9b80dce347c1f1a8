"""Helpers of the disk-tier engine tests: engine processes, the tier's files, faults to inject."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtier.tiers.chunk_format import HEADER_BYTES, ChunkError, verify_file
from kvtier.tiers.disk.names import scan

CHUNK = 64  # tokens per chunk: two engine blocks of 32
JOB = Path(__file__).with_name("disk_job.py")


def disk_extra(path: Path, cpu: str = "64MiB", **disk: Any) -> dict[str, Any]:
    """kvtier's extra config with a disk tier in ``path`` (256 MiB unless ``bytes`` is given)."""
    return {
        "cpu_bytes_to_use": cpu,
        "block_size": CHUNK,
        "disk": {"path": str(path), "bytes": "256MiB", **disk},
    }


def start_job(
    work: Path,
    name: str,
    model: Path,
    token_prompts: Sequence[list[int]],
    extra: dict[str, Any],
    rounds: int = 1,
    prefix: Sequence[str] = (),
    settle: bool = True,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``disk_job.py`` in a new process (``prefix``: a command to run it under)."""
    job, out = work / f"{name}.job.json", work / f"{name}.out.json"
    spec = {"model": str(model), "prompts": list(token_prompts), "rounds": rounds}
    job.write_text(json.dumps(spec | {"extra": extra, "settle": settle}))
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115  (closed with the process)
    command = [*prefix, sys.executable, str(JOB), str(job), str(out)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=JOB.parent)
    log.close()
    return process, out


def finish_job(process: subprocess.Popen[bytes], out: Path, timeout: float = 300) -> Any:
    """Wait for a job; its JSON result, or AssertionError with the end of its log."""
    code = process.wait(timeout=timeout)
    if code != 0 or not out.exists():
        log = out.with_name(out.name.replace(".out.json", ".log")).read_text(errors="replace")
        raise AssertionError(f"engine process exited with {code}:\n{log[-6000:]}")
    return json.loads(out.read_text())


def run_job(*args: Any, **kwargs: Any) -> Any:
    return finish_job(*start_job(*args, **kwargs))


def chunk_files(root: Path) -> set[Path]:
    return {Path(entry.path) for entry, chunk in scan(root) if chunk is not None}


def tier_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def bad_files(root: Path) -> list[Path]:
    """Chunk files that fail verification (``kvtier inspect --verify``)."""
    bad = []
    for path in chunk_files(root):
        try:
            verify_file(path)
        except (ChunkError, OSError):
            bad.append(path)
    return bad


def copy_tier(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- faults ------------------------------------------------------------------------------------


def flip_payload_byte(path: Path, offset: int = 100) -> None:
    with open(path, "r+b") as file:
        file.seek(HEADER_BYTES + offset)
        byte = file.read(1)
        file.seek(HEADER_BYTES + offset)
        file.write(bytes([byte[0] ^ 0x01]))


def truncate(path: Path, size: int | None = None) -> None:
    os.truncate(path, path.stat().st_size - 1 if size is None else size)


def swap_names(a: Path, b: Path) -> None:
    temp = a.with_name(a.name + ".swap")
    a.rename(temp)
    b.rename(a)
    temp.rename(b)
