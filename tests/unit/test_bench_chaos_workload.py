"""``kvtier bench chaos``'s workload: a chat whose rounds grow each user's history by its answer,
a user asking again only once answered, and long documents, drawn from the seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.bench.chaos.workload import (
    DOCUMENT_TOKENS,
    QUESTION_TOKENS,
    USERS,
    Workload,
)
from kvtier.apps.bench.common.models import model_dir


@pytest.fixture(scope="module")
def model() -> Path:
    return model_dir("tiny")


def test_the_same_seed_asks_the_same_and_every_request_is_one_or_the_other(model: Path) -> None:
    first, second = Workload(model, ChaosSettings(seed=2)), Workload(model, ChaosSettings(seed=2))
    asks = [first.next() for _ in range(6)]
    assert asks == [second.next() for _ in range(6)]
    assert [a.id for a in asks] == list(range(6))
    for ask in asks:
        assert ask.workload in ("chat", "docs") and ask.target in ("fleet", "pd")
        if ask.workload == "docs":
            assert len(ask.prompt) == DOCUMENT_TOKENS + QUESTION_TOKENS


def test_a_users_next_round_is_its_history_its_answer_and_a_new_question(model: Path) -> None:
    workload = Workload(model, ChaosSettings(seed=0))
    workload.rng.random = lambda: 0.0  # type: ignore[method-assign]  # chat, streamed, to the pair
    first = workload.next()
    assert first.workload == "chat" and first.round == 0 and first.stream and first.target == "pd"
    asked = {first.conversation % USERS}
    while len(asked) < USERS:  # every other user asked once: none is ready until answered
        asked.add(workload.next().conversation % USERS)
    assert workload.next().workload == "docs"
    workload.answered(first, [7, 8])
    again = workload.next()
    assert again.conversation == first.conversation and again.round == 1
    assert again.prompt[: len(first.prompt) + 2] == first.prompt + [7, 8]
    assert len(again.prompt) == len(first.prompt) + 2 + QUESTION_TOKENS


def test_a_failed_round_drops_its_question_and_the_user_asks_that_round_again(
    model: Path,
) -> None:
    workload = Workload(model, ChaosSettings(seed=0))
    workload.rng.random = lambda: 0.0  # type: ignore[method-assign]
    first = workload.next()
    for _ in range(USERS - 1):
        workload.next()
    workload.answered(first, None)
    again = workload.next()
    assert again.conversation == first.conversation and again.round == 0
    assert again.prompt[:-QUESTION_TOKENS] == first.prompt[:-QUESTION_TOKENS]
    assert again.prompt != first.prompt  # a new question
