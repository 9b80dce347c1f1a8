"""Which vLLM configurations recompute a failed synchronous load right (``vllm/recovery.py``)."""

from __future__ import annotations

import pytest
from vllm.config import VllmConfig

from kvtier.vllm.recovery import recovers_sync_loads


def test_v1_without_asynchronous_scheduling_recovers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config = VllmConfig()
    assert not config.scheduler_config.async_scheduling  # the CPU platform's
    assert recovers_sync_loads(config) is None


def test_model_runner_v2_and_asynchronous_scheduling_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = VllmConfig()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # as on CUDA, where it is the default
    assert recovers_sync_loads(config) == "Model Runner V2"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config.scheduler_config.async_scheduling = True  # CUDA's default
    assert recovers_sync_loads(config) == "asynchronous scheduling"
