"""``kvtier proxy --engine``: two ``kvtier serve`` engines behind one proxy.

A multi-round chat (12 users, a shared system prompt, each user's own context, histories growing
over 6 rounds, 2 in flight), in tokens (``bench/fleet_chat.py``: the random model's answers do
not tokenize back): with ``kv-aware`` the fleet computes at most half the prompt tokens it
computes with ``round-robin`` (vLLM's ``prompt_tokens_by_source``), neither engine serves twice
the other's requests, the cached tokens the proxy predicts are those the engine reports, and the
outputs equal a single engine's without kvtier.

Then the faults, each within a bounded wait: a proxy restarted rebuilds its index from the
engines' replay; an engine reset behind the proxy's back costs misses, never an error; an engine
stalled (SIGSTOP) with requests in flight costs no client error, their answers come from the
other, and it rejoins when it runs again; an engine killed with requests in flight costs no
client error, is dropped from the index and its traffic moves (last: it kills one of the
module's two).

The fleet is ``bench/fleet_real.py``'s: each engine on a core of its own, as engines on machines
of their own (on two shared cores one engine's steps starve the other's and a router rightly
sends the busy one less), each cache smaller than the workload: the engine's own 160 blocks of 32
tokens (a user's history is about 20; a GPU's cache holds a fraction of a fleet's
conversations) and a host tier of 64 chunks.
"""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from kvtier.apps.bench.common.servers import (
    KVTIER,
    WAIT_S,
    WORKER_IN_CORE,
    Server,
    launch,
    sample,
    stop,
    wait,
)
from kvtier.apps.bench.fleet.real.chat import Answer, ask, chat_workload
from kvtier.apps.bench.fleet.real.fleet import (
    Asked,
    index_modes,
    reset_caches,
    run_policy,
    started_fleet,
)
from kvtier.apps.ports import free_port
from kvtier.apps.prompts import make_prompt

pytestmark = pytest.mark.engine

ANSWER = 48  # tokens per answer: a history grows by an answer and a short question per round
CONTEXT = 1200  # characters of each user's own context (about 300 tokens)
ENGINE_BLOCKS = 160  # the engine's own cache, in blocks of 32 tokens
HOST_CHUNKS = 64  # kvtier's host tier, in chunks of 32 tokens
LONG = 256  # tokens of an answer in flight when its engine fails: it computes for seconds


# The policies compared by their routing alone: no request sent twice (a hedge) or moved for a
# /health probe slowed by a busy machine (stalled), each of which computes a prompt again on
# another engine; those are this module's fault tests.
ROUTING_ONLY = ("--hedge-after-p99", "0", "--health-timeout-s", "60")


class Fleet(NamedTuple):
    engines: list[Server]
    work: Path
    model: Path


@pytest.fixture(scope="module")
def fleet(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    with started_fleet(tiny_model, "float32", ENGINE_BLOCKS, HOST_CHUNKS, work, 2048,
                       env=WORKER_IN_CORE) as engines:  # fmt: skip
        yield Fleet(engines, work, tiny_model)


def _run(fleet: Fleet, policy: str) -> tuple[list[Answer], int]:
    """The chat through a proxy of ``policy``, on engines whose caches were emptied: its
    answers, and the prompt tokens the fleet computed."""
    answers: list[Answer] = []
    declined = _declined(fleet)

    def chat(url: str, pool: ThreadPoolExecutor) -> Asked:
        answers.extend(chat_workload(url, users=12, rounds=6, pool=pool, answer_tokens=ANSWER,
                                     tokens=fleet.model, context_chars=CONTEXT))  # fmt: skip
        return [], [], [], 0

    ran = run_policy(fleet.engines, policy, chat, fleet.work, 2, ROUTING_ONLY)
    log = (fleet.work / f"proxy-{policy}.log").read_text().splitlines()
    warned = [line for line in log if " WARNING " in line]
    print(f"{policy}: computed {ran.computed}, the proxy's decisions {ran.reasons}, hits the "
          f"engines computed instead {_declined(fleet) - declined:.0f}, the proxy's warnings "
          f"{len(warned)}", *warned[:5], sep="\n  ")  # fmt: skip
    return answers, ran.computed


def _declined(fleet: Fleet) -> float:
    """The chunks the engines found in a tier and computed instead (their costs' choice)."""
    name = "vllm:kvtier_hit_decisions_total"
    return sum(sample(e.url, name, decision="compute") for e in fleet.engines)


def test_kv_aware_routing_computes_at_most_half_the_prompt_tokens_of_round_robin(
    fleet: Fleet, reference: Any
) -> None:
    spread, spread_computed = _run(fleet, "round-robin")
    aware, aware_computed = _run(fleet, "kv-aware")
    assert [a.tokens for a in aware] == [a.tokens for a in spread]  # the same conversations
    print(f"computed: kv-aware {aware_computed}, round-robin {spread_computed}, "
          f"ratio {aware_computed / spread_computed:.3f}")  # fmt: skip
    assert aware_computed <= 0.5 * spread_computed, (aware_computed, spread_computed)
    served = [sum(a.engine == e.url for a in aware) for e in fleet.engines]
    assert max(served) <= 2 * min(served), served
    prompts = [a.prompt for a in aware]
    assert reference(fleet.model, prompts, ANSWER) == [a.tokens for a in aware]
    # the index is right: the cached tokens the proxy predicted are those the engine reported
    right = sum(a.predicted == len(a.prompt) - a.computed for a in aware)
    assert right >= 0.9 * len(aware), [(a.predicted, len(a.prompt) - a.computed) for a in aware]
    assert sum(a.predicted for a in aware) > 0


@contextmanager
def _proxy(fleet: Fleet, name: str, health_timeout_s: float = 2.0) -> Iterator[Server]:
    """A ``kv-aware`` proxy following every engine's events (exact) before it is yielded."""
    port = free_port()
    command = [KVTIER, "proxy", "--engine", *(e.url for e in fleet.engines), "--port", str(port),
               "--health-interval-s", "0.5",
               "--health-timeout-s", str(health_timeout_s)]  # fmt: skip
    proxy = launch(command, port, fleet.work / f"proxy-{name}.log")
    try:
        wait(lambda: index_modes(proxy) == ["exact"] * len(fleet.engines), WAIT_S, "an exact index")
        yield proxy
    finally:
        stop(proxy)


def _ask(
    proxy: Server, prompt: list[int], tokens: int = 8, stream: bool = False, **extra: Any
) -> Answer:
    with httpx.Client(base_url=proxy.url, timeout=WAIT_S, trust_env=False) as client:
        return ask(client, "tiny", {"prompt": prompt, **extra}, 0, 0, tokens, stream)[0]


def _documents(fleet: Fleet, count: int, tokens: int = 300) -> list[list[int]]:
    return [make_prompt(fleet.model, tokens, seed=4_100 + d) for d in range(count)]


def _more(fleet: Fleet, prompt: list[int], seed: int) -> list[int]:
    """``prompt`` and 20 tokens more: its blocks, and one that no engine holds."""
    return prompt + make_prompt(fleet.model, 20, seed=seed, bos=False)


def test_a_restarted_proxy_rebuilds_its_index_and_an_engine_reset_behind_it_costs_only_misses(
    fleet: Fleet, reference: Any
) -> None:
    reset_caches(fleet.engines)
    documents = _documents(fleet, 4)
    # no engine taken for down while busy (2 cores shared): a request sent on to the other
    # engine would leave its prefix on both, and the second proxy free to pick either
    patient = WAIT_S
    with _proxy(fleet, "first", patient) as first:
        placed = [_ask(first, doc).engine for doc in documents]
    assert set(placed) == {e.url for e in fleet.engines}  # spread over both
    with _proxy(fleet, "second", patient) as second:  # its index only from the replay
        again = [_ask(second, _more(fleet, doc, 1)) for doc in documents]
        assert [a.engine for a in again] == placed
        assert all(a.reason == "prefix" and a.predicted == 288 for a in again), again
        assert all(len(a.prompt) - a.computed == a.predicted for a in again), again
        # one engine's caches emptied behind the proxy's back: the proxy still predicts hits,
        # the engine computes the whole prompt, and the client gets its answer
        behind = next(e for e in fleet.engines if e.url == placed[0])
        reset_caches([behind], step=False)
        missed = _ask(second, _more(fleet, documents[0], 2))
        assert missed.engine == behind.url and missed.predicted == 288
        assert missed.computed == len(missed.prompt)  # a miss, not an error
        assert reference(fleet.model, [missed.prompt], 8) == [missed.tokens]


def test_a_cached_prefix_is_met_only_under_its_cache_salt(fleet: Fleet, reference: Any) -> None:
    """A tenant's prompt (vLLM's ``cache_salt``) is predicted cached only for that tenant, as
    the engine's block hashes have it: another tenant's, or none, is routed by load and
    computed, and no prediction is wrong."""
    reset_caches(fleet.engines)
    (document,) = _documents(fleet, 1, tokens=300)
    with _proxy(fleet, "salts", WAIT_S) as proxy:
        first = _ask(proxy, document, cache_salt="tenant-1")
        assert first.predicted == 0 and first.computed == len(document)
        again = _ask(proxy, _more(fleet, document, 3), cache_salt="tenant-1")
        assert (again.engine, again.reason, again.predicted) == (first.engine, "prefix", 288)
        assert len(again.prompt) - again.computed == 288
        for salt in ("tenant-2", None):  # the same tokens: nothing of theirs is cached
            other = _ask(proxy, _more(fleet, document, 4), **({"cache_salt": salt} if salt else {}))
            assert (other.reason, other.predicted) == ("load", 0), other
            assert other.computed == len(other.prompt), other
        assert reference(fleet.model, [other.prompt], 8) == [other.tokens]


def _in_flight_on(
    proxy: Server,
    victim: Server,
    prompts: list[list[int]],
    fault: Callable[[], None],
    streamed: bool = False,
) -> list[Answer]:
    """``prompts`` asked at once (with ``streamed``, every other one streamed), each placed on
    ``victim`` (its prefix is there); ``fault`` done once the victim computes some of them.
    Every answer."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        asked = [pool.submit(_ask, proxy, prompt, LONG, streamed and i % 2 == 1)
                 for i, prompt in enumerate(prompts)]  # fmt: skip
        wait(lambda: sample(victim.url, "vllm:num_requests_running") > 0, WAIT_S,
             "the victim to compute a request")  # fmt: skip
        fault()
        return [future.result() for future in asked]


def test_an_engine_stalled_with_requests_in_flight_costs_no_client_error_and_rejoins(
    fleet: Fleet, reference: Any
) -> None:
    reset_caches(fleet.engines)
    documents = _documents(fleet, 4, tokens=200)
    with _proxy(fleet, "stall") as proxy:
        placed = [_ask(proxy, doc).engine for doc in documents]
        victim = next(e for e in fleet.engines if e.url == placed[0])
        on_victim = [_more(fleet, d, 5) for d, at in zip(documents, placed) if at == victim.url]

        def stall() -> None:
            """Stopped until the proxy found it and its first request (not streamed) moved; a
            stream that had started waits for it."""
            os.killpg(victim.process.pid, signal.SIGSTOP)
            try:
                wait(lambda: _up(proxy, victim) == 0.0 and _resent(proxy, "stalled") >= 1,
                     WAIT_S, "the stalled engine skipped, its request moved")  # fmt: skip
            finally:
                os.killpg(victim.process.pid, signal.SIGCONT)

        answers = _in_flight_on(proxy, victim, on_victim, stall, streamed=True)
        wait(lambda: _up(proxy, victim) == 1.0 and index_modes(proxy) == ["exact"] * 2, WAIT_S,
             "the stalled engine taken again, its index followed anew")  # fmt: skip
    assert reference(fleet.model, [a.prompt for a in answers], LONG) == [a.tokens for a in answers]


def test_an_engine_killed_is_dropped_from_the_index_and_its_traffic_moves(
    fleet: Fleet, reference: Any
) -> None:
    """Last in the module: it kills one of the fleet's engines, with requests in flight there."""
    reset_caches(fleet.engines)
    documents = _documents(fleet, 4, tokens=200)
    with _proxy(fleet, "kill") as proxy:
        placed = [_ask(proxy, doc).engine for doc in documents]
        victim = next(e for e in fleet.engines if e.url == placed[0])
        survivor = next(e for e in fleet.engines if e is not victim)
        on_victim = [_more(fleet, d, 6) for d, at in zip(documents, placed) if at == victim.url]
        killed = _in_flight_on(
            proxy, victim, on_victim, lambda: os.killpg(victim.process.pid, signal.SIGKILL)
        )
        wait(lambda: index_modes(proxy) == ["exact" if e is survivor else "down"
                                      for e in fleet.engines], WAIT_S,
             "the killed engine's index dropped")  # fmt: skip
        # moved because its connection broke, or because its probe had failed first: on a
        # busy machine the victim's /health may time out while it computes (stalled)
        resent = _resent(proxy, "broke") + _resent(proxy, "stalled")
        moved = [_ask(proxy, _more(fleet, doc, 3)) for doc in documents]
    assert resent >= 1 and all(a.engine == survivor.url for a in killed), killed
    assert reference(fleet.model, [a.prompt for a in killed], LONG) == [a.tokens for a in killed]
    assert all(a.engine == survivor.url for a in moved), moved
    assert reference(fleet.model, [a.prompt for a in moved], 8) == [a.tokens for a in moved]


def _up(proxy: Server, engine: Server) -> float:
    """The proxy's ``kvtier_proxy_engine_up`` of ``engine`` (1: taken for requests)."""
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=WAIT_S) as answer:
        text = answer.read().decode()
    said = f'kvtier_proxy_engine_up{{side="engine",url="{engine.url}"}} '
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(said))


def _resent(proxy: Server, cause: str) -> float:
    return sample(proxy.url, "kvtier_proxy_resent_requests_total", cause=cause)
