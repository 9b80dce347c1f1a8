"""What the benchmarks' JSON says of the CPU they ran on: its model and the vector instructions
that decide vLLM's CPU kernels (a bfloat16 model computes several times slower without
AVX-512's bfloat16 instructions or AMX, so two runs compare only on alike CPUs)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

ISA = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # the flags told, those present
CPUINFO = Path("/proc/cpuinfo")


def cpu(cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """``{"model": ..., "isa": [...]}`` from ``cpuinfo`` (Linux); elsewhere the platform's
    processor name and no flags."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return {"model": platform.processor() or None, "isa": []}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's fields are enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name"), "isa": [flag for flag in ISA if flag in flags]}
