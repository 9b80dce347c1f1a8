"""The benchmarks' JSON names the CPU and the vector instructions vLLM's CPU kernels depend on."""

from __future__ import annotations

from pathlib import Path

from kvtier.apps.bench.common.machine import cpu

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
model name\t: another
flags\t\t: avx512f avx512_bf16 amx_bf16
"""


def test_the_first_processors_model_and_flags_are_told(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert cpu(info) == {"model": "AMD EPYC", "isa": ["avx2"]}
    info.write_text(CPUINFO.replace("avx avx2 fma", "avx2 avx512f avx512_bf16 amx_bf16"))
    assert cpu(info)["isa"] == ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]


def test_no_cpuinfo_is_the_platforms_name_and_no_flags(tmp_path: Path) -> None:
    assert cpu(tmp_path / "missing")["isa"] == []
