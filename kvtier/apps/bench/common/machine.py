"""What the benchmarks' JSON says of the machine they ran on.

    cpu(cpuinfo)            -> {"model", "isa"}   the CPU's model and the vector instructions that
                                                  decide vLLM's CPU kernels
    describe(torch_too)     -> dict               the JSON's ``machine``: cpus, platform, cpu (and,
                                                  ``torch_too``, torch's version, the CUDA device;
                                                  ``cpus`` is then torch's threads)
    one_line(machine)       -> str                ``machine`` as the Markdown reports say it

A bfloat16 model computes several times slower without AVX-512's bfloat16 instructions or AMX,
so two runs compare only on alike CPUs.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
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


def describe(torch_too: bool = True) -> dict[str, Any]:
    if not torch_too:
        return {"cpus": os.cpu_count(), "platform": platform.platform(), "cpu": cpu()}
    import torch

    return {
        "cpus": torch.get_num_threads(),
        "platform": platform.platform(),
        "cpu": cpu(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def one_line(machine: Mapping[str, Any] | None) -> str:
    """``"AMD EPYC 7B13 (avx2), 2 CPUs, Linux-6.1-x86_64, torch 2.13.0+cpu"``; what is missing
    is left out ("not recorded" when nothing is)."""
    if not machine:
        return "not recorded"
    found = machine.get("cpu") or {}
    isa = ", ".join(found.get("isa") or [])
    parts = [f"{found.get('model') or 'unknown CPU'}" + (f" ({isa})" if isa else "")]
    if machine.get("cpus") is not None:
        parts.append(f"{machine['cpus']} CPUs")
    parts += [str(machine[key]) for key in ("platform",) if machine.get(key)]
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}")
    if machine.get("cuda"):
        parts.append(str(machine["cuda"]))
    return ", ".join(parts)
