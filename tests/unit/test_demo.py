"""The host-tier demo: later rounds are served from kvtier and every loaded byte is verified."""

from __future__ import annotations

from pathlib import Path

from kvtier import demo


def test_demo_serves_shared_prefixes_from_the_host_tier(tmp_path: Path) -> None:
    stats = demo.run(users=3, rounds=3, out_dir=tmp_path)
    assert [s.round for s in stats] == [0, 1, 2]
    assert stats[0].hit_chunks > 0  # users after the first share the system prompt
    assert all(s.hit_rate > 0.5 for s in stats[1:])  # each user's history comes back
    assert (tmp_path / "demo.png").stat().st_size > 0
