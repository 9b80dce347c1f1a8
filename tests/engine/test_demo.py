"""``kvtier demo`` in real vLLM: later chat rounds come from kvtier, token for token the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.apps import demo
from kvtier.apps.bench.common.engine_env import in_process_env


def test_demo_serves_chat_history_from_kvtier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in in_process_env().items():  # what the demo sets; restored after the test
        monkeypatch.setenv(name, value)
    results = demo.run(users=2, rounds=3, out_dir=tmp_path)
    assert [r.round for r in results] == [0, 1, 2]
    assert all(r.identical for r in results)
    assert all(r.hit_rate > 0.5 for r in results[1:])  # each user's history comes back
    assert (tmp_path / "demo.png").stat().st_size > 0
