"""No regret, in real vLLM: a kvtier hit costs no scheduling step and leaves the engine one token.

A hit in the host tier loads synchronously (vLLM runs the request in the step that loads it), up
to the prompt's last token at any prompt length (the prompt's tail is kept too), and extends the
engine's own prefix hit the same way, unless the loads measured by then say that a tail of a few
tokens costs more to load than to compute; outputs equal the reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import connector, engine, generate, kvtier_transfer, prompts, settle

from kvtier.vllm import KVTierConnector

LENGTHS = [100, 250, 333, 64, 45, 97]  # mostly unaligned to the 32-token engine block
BLOCK = 32  # the engine's block


@pytest.fixture
def hits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None, bool]]:
    """(request length, tokens kvtier answered, asynchronously?) of every lookup (a spy on our
    own adapter, not on vLLM)."""
    seen: list[tuple[int, int | None, bool]] = []
    lookup = KVTierConnector.get_num_new_matched_tokens

    def spy(self: KVTierConnector, request: Any, num_computed_tokens: int) -> Any:
        hit, load_async = lookup(self, request, num_computed_tokens)
        seen.append((request.num_tokens, None if hit is None else num_computed_tokens + hit,
                     load_async))  # fmt: skip
        return hit, load_async

    monkeypatch.setattr(KVTierConnector, "get_num_new_matched_tokens", spy)
    return seen


@pytest.mark.parametrize("chunk", [32, 64])
def test_a_kvtier_hit_leaves_only_the_last_token_and_costs_no_step(
    tiny_model: Path, reference: Any, hits: list[tuple[int, int | None, bool]], chunk: int
) -> None:
    token_prompts = prompts(tiny_model, LENGTHS, seed=91)
    expected = reference(tiny_model, token_prompts)
    with engine(tiny_model, kv_transfer_config=kvtier_transfer(block_size=chunk)) as llm:
        assert generate(llm, token_prompts) == expected
        settle(llm)
        llm.reset_prefix_cache()
        hits.clear()
        assert generate(llm, token_prompts) == expected  # from kvtier alone
        assert sorted(hits) == sorted((n, n - 1, False) for n in LENGTHS)
        settle(llm)
        hits.clear()
        assert generate(llm, token_prompts) == expected  # the engine's own hit, then kvtier's
        # kvtier's part is the tail alone now: loaded to the last token, or computed where the
        # loads measured in the pass before say a job of those few tokens costs more
        own = {n: (n - 1) // BLOCK * BLOCK for n in LENGTHS}
        assert sorted(n for n, _, _ in hits) == sorted(LENGTHS)
        assert all(not late and hit in (n - 1, own[n]) for n, hit, late in hits), hits
        settle(llm)
        scheduler = connector(llm).scheduler
        assert scheduler.manager.num_pinned == 0
        assert not scheduler.requests
        scheduler.check_integrity()
