"""What a chaos run asks: a multi-round chat and long documents, in tokens, chosen by a seed.

    Ask(id, workload, conversation, round, prompt, stream, target)   one request to send
    Workload(model, settings)
    .next()                      -> Ask   the next request (a chat round when a user is ready)
    .answered(ask, tokens)                its answer (None: it failed): the user's turn again

The chat (LMCache's multi-round QA, as ``bench fleet``'s): ``USERS`` users share a system prompt;
each conversation opens with a context of its own and asks ``ROUNDS`` questions, each after its
whole history (the earlier questions and answers, in tokens: the local random models' answers do
not tokenize back), then the user begins a new conversation. A user asks again only once its last
answer came (a failed one drops its question). The documents (long-doc QA): ``DOCUMENTS`` of
``DOCUMENT_TOKENS`` tokens, each request one of them and a new question. Each request is streamed
or not, and sent to the fleet or to the prefill→decode pair, as the seed draws.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import NamedTuple

from kvtier.apps.bench.chaos.settings import ChaosSettings
from kvtier.apps.prompts import make_prompt

USERS = 8
ROUNDS = 6
SYSTEM_TOKENS = 200
CONTEXT_TOKENS = 300
QUESTION_TOKENS = 16
DOCUMENTS = 6
DOCUMENT_TOKENS = 1000
CHAT_SHARE = 0.5  # of the requests, a chat round (when a user is ready)


class Ask(NamedTuple):
    id: int
    workload: str  # "chat" or "docs"
    conversation: int  # the chat's conversation, or the document
    round: int  # the chat's round (docs: 0)
    prompt: list[int]  # token ids
    stream: bool
    target: str  # "fleet" or "pd"


class Workload:
    """Deterministic for a seed, but for which users are ready (their answers' timing)."""

    def __init__(self, model: Path, settings: ChaosSettings) -> None:
        self.model = model
        self.settings = settings
        self.rng = random.Random(settings.seed + 1)
        self.system = make_prompt(model, SYSTEM_TOKENS, seed=11_000_000)
        self.documents = [make_prompt(model, DOCUMENT_TOKENS, seed=12_000_000 + d)
                          for d in range(DOCUMENTS)]  # fmt: skip
        self.histories: dict[int, list[int]] = {}  # user -> its conversation so far
        self.conversation = dict.fromkeys(range(USERS), -1)  # user -> its conversation
        self.rounds = dict.fromkeys(range(USERS), ROUNDS)  # user -> rounds asked in it
        self.ready = set(range(USERS))
        self.asking: dict[int, int] = {}  # ask id -> user
        self.sent = 0

    def next(self) -> Ask:
        chat = bool(self.ready) and self.rng.random() < CHAT_SHARE
        stream = self.rng.random() < self.settings.stream_share
        pd = self.settings.pd and self.rng.random() < self.settings.pd_share
        target = "pd" if pd else "fleet"
        ask_id, self.sent = self.sent, self.sent + 1
        if chat:
            user = self.rng.choice(sorted(self.ready))
            self.ready.discard(user)
            self.asking[ask_id] = user
            conversation, round_, prompt = self._chat_round(user, ask_id)
            return Ask(ask_id, "chat", conversation, round_, prompt, stream, target)
        document = self.rng.randrange(DOCUMENTS)
        question = make_prompt(self.model, QUESTION_TOKENS, seed=13_000_000 + ask_id, bos=False)
        return Ask(ask_id, "docs", document, 0, self.documents[document] + question, stream,
                   target)  # fmt: skip

    def answered(self, ask: Ask, tokens: list[int] | None) -> None:
        """A chat round's answer goes into its history (``None``: its question is dropped)."""
        user = self.asking.pop(ask.id, None)
        if user is None:
            return
        if tokens is not None and self._number(user) == ask.conversation:
            self.histories[user] = ask.prompt + tokens
            self.rounds[user] += 1
        self.ready.add(user)

    def _chat_round(self, user: int, ask_id: int) -> tuple[int, int, list[int]]:
        """(conversation, round, prompt): the history and a new question."""
        if self.rounds[user] >= ROUNDS:  # a new conversation: the system prompt, a new context
            self.conversation[user] += 1
            self.rounds[user] = 0
            seed = 14_000_000 + self._number(user)
            context = make_prompt(self.model, CONTEXT_TOKENS, seed=seed, bos=False)
            self.histories[user] = self.system + context
        question = make_prompt(self.model, QUESTION_TOKENS, seed=15_000_000 + ask_id, bos=False)
        return self._number(user), self.rounds[user], self.histories[user] + question

    def _number(self, user: int) -> int:
        """The user's conversation, numbered over every user's."""
        return self.conversation[user] * USERS + user
