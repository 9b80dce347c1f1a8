"""The trace ``kvtier bench fleet``'s simulation plays: multi-round chats arriving over time.

    Workload(...)                              its shape (frozen; per engine, scaled with the fleet)
    TRACES[name]                      -> Workload  the traces ``kvtier bench fleet --trace`` names
    arrivals(workload, engines, seed)  -> [Arrival]   when each session starts, in order
    Trace(workload, seed).session(arrival) -> Session  a session's tokens, rounds and block keys

Two traces are named (``TRACES``): ``chat`` (the default: 4 system prompts of 512 tokens, a
200-400-token context, 4-8 rounds) and ``mrqa``, LMCache's ``multi_round_qa`` in the proportions
its own CI runs it (``--shared-system-prompt 1000 --user-history-prompt 2000 --answer-len 100
--num-rounds 5``: one system prompt, a 2,000-token history per user, 5 rounds), at half the
chat's session rate so that round-robin's engines, computing ~2,200 of each ~3,300-token prompt,
stay below saturation (~2/3 busy) as they do on the chat trace (~1/2 busy).

Sessions start as a Poisson process (``session_rate`` per engine), ``sessions_per_engine`` of
them per engine. Each opens with one of ``systems`` shared system prompts, then a context of its
own, then ``rounds`` rounds: a round's prompt is the whole history (system prompt, context, the
questions and answers so far) and a new question; its answer joins the history when the request
finishes, and the next round is sent a think time later (exponential). Token ids are random, from
a generator seeded by the trace's seed and the session's number: the same seed, the same trace,
whichever policy plays it and in whatever order its sessions are opened.

A block's *key* is the simulator's own identity of a block of tokens (a hash chained over the
blocks before it): the engines' caches are keyed by it; the proxy's index never sees it.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass
from typing import NamedTuple

SEED_STRIDE = 1_000_003  # seeds of one trace's sessions: seed * SEED_STRIDE + session number


@dataclass(frozen=True)
class Workload:
    systems: int = 4  # shared system prompts
    system_tokens: int = 512
    context_tokens: tuple[int, int] = (200, 400)  # each a uniform range, ends included
    rounds: tuple[int, int] = (4, 8)
    question_tokens: tuple[int, int] = (20, 40)
    answer_tokens: tuple[int, int] = (80, 120)
    think_ms: float = 10_000.0  # mean time between an answer and the next question
    # a session lives ~60 s (6 rounds, 5 think times): ~80 alive per engine, sending it ~7.5
    # requests/s, so ~14 in flight (of 2 s each, with EngineSpec's defaults), as a busy engine
    # runs (with ~3.5 in flight, max / mean in flight is noise: 1.13 for round-robin itself)
    sessions_per_engine: int = 128
    session_rate: float = 1.28e-3  # sessions started per ms, per engine
    warmup: float = 0.6  # the first part of the arrivals' span (~60 s), not measured
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("context_tokens", "rounds", "question_tokens", "answer_tokens"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                raise ValueError(f"{name} must be a range 0 < low <= high; got {(low, high)}")
        if self.systems < 1 or self.sessions_per_engine < 1 or self.block_size < 1:
            raise ValueError("systems, sessions_per_engine and block_size must be >= 1")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be in [0, 1); got {self.warmup}")


MULTI_ROUND_QA = Workload(
    systems=1,
    system_tokens=1000,
    context_tokens=(2000, 2000),
    rounds=(5, 5),
    question_tokens=(20, 40),
    answer_tokens=(100, 100),
    session_rate=0.6e-3,
)
TRACES: dict[str, Workload] = {"chat": Workload(), "mrqa": MULTI_ROUND_QA}


class Arrival(NamedTuple):
    at_ms: float
    session: int


@dataclass(frozen=True)
class Session:
    number: int
    tokens: list[int]  # system prompt, context, then each round's question and answer
    keys: list[int]  # the key of each full block of ``tokens``
    prompt_ends: list[int]  # per round: its prompt is tokens[:end]
    answer_ends: list[int]  # per round: the history once it is answered is tokens[:end]
    think_ms: list[float]  # per round after the first: the wait before it is sent

    @property
    def rounds(self) -> int:
        return len(self.prompt_ends)


def arrivals(workload: Workload, engines: int, seed: int) -> list[Arrival]:
    """``sessions_per_engine * engines`` session starts, a Poisson process, in time order."""
    rng = random.Random(seed)
    rate, at, out = workload.session_rate * engines, 0.0, []
    for number in range(workload.sessions_per_engine * engines):
        at += rng.expovariate(rate)
        out.append(Arrival(at, number))
    return out


class Trace:
    """The sessions of one seed; the shared system prompts are drawn once."""

    def __init__(self, workload: Workload, seed: int) -> None:
        self.workload = workload
        self.seed = seed
        rng = random.Random(seed)
        self.systems = []  # (tokens, keys) per system prompt
        for _ in range(workload.systems):
            tokens = _tokens(rng, workload.system_tokens)
            self.systems.append((tokens, _keys(tokens, [], workload.block_size)))

    def session(self, arrival: Arrival) -> Session:
        w = self.workload
        rng = random.Random(self.seed * SEED_STRIDE + arrival.session)
        system, system_keys = self.systems[rng.randrange(len(self.systems))]
        tokens = system + _tokens(rng, rng.randint(*w.context_tokens))
        prompt_ends, answer_ends, think = [], [], []
        for round_ in range(rng.randint(*w.rounds)):
            tokens += _tokens(rng, rng.randint(*w.question_tokens))
            prompt_ends.append(len(tokens))
            tokens += _tokens(rng, rng.randint(*w.answer_tokens))
            answer_ends.append(len(tokens))
            if round_:
                think.append(rng.expovariate(1.0 / w.think_ms))
        keys = _keys(tokens, system_keys, w.block_size)
        return Session(arrival.session, tokens, keys, prompt_ends, answer_ends, think)


def _tokens(rng: random.Random, count: int) -> list[int]:
    """``count`` token ids, each in [0, 65536)."""
    return array("H", rng.randbytes(2 * count)).tolist()


def _keys(tokens: list[int], known: list[int], size: int) -> list[int]:
    """The keys of ``tokens``' full blocks, the first ``len(known)`` of them ``known``."""
    keys = list(known)
    for start in range(len(keys) * size, len(tokens) - size + 1, size):
        keys.append(hash((keys[-1] if keys else 0, *tokens[start : start + size])))
    return keys
