"""Where a pool's engines hold a prompt's KV, and which of them a request goes to.

    Placement(pool, policy, connect_timeout_s)
    await tokens(path, request, headers) -> [int] | None   the prompt as the engines see it
    root(request)                        -> int             where its blocks' digests start
    choose(tokens, root)                 -> Choice          the engine, why, what it holds
    sending(choice)                                         its tokens queued while sent
    await track(engine, up)                                 follow its events, or forget them
    mode(url) -> Mode;  index, lock (for /metrics);  await aclose()

Every engine's KV events (``event_stream.py``, found from the engine's URL: vLLM's
``/kv_event_sources``) go into one index (``prefix_index.py``). A prompt is tokenized as the
engine will, by the engine's own ``/tokenize`` (its tokenizer and, for a chat request, its chat
template): never a silent miss from a tokenizer or template that differs; a request that cannot
be tokenized is routed by load. A request's LoRA adapter (its ``model``, where an engine lists
it as an adapter, an event named it, or it is none of the base models the engines list) and
``cache_salt`` name its KV as much as its tokens do:
they pick the *root* its blocks' digests chain from, as they change the engines' block hashes
(``prefix_index.py``). ``choose`` scores the engines up with ``scoring.choose``: the
runs the index finds (the run of most engines, the others with the engines that have them) and
each engine's counts, with no object per engine and no look at every engine's streams per
request (which engines' indexes are not exact is kept, worked out again only when a stream's
mode or the engines up change: each stream tells the placement). An engine that goes down is
forgotten (a restarted engine comes back empty); once it is up again its events are followed
anew. One that only stalls (its /health unanswered in time) is skipped but keeps its index: a
single slow probe on a busy machine costs the traffic of its outage, not a rebuild. Nothing
here is kept that the events cannot rebuild but counts of this proxy's own traffic: several
proxies behind one address hold the same index and send a cached prefix to the same engine,
each balancing the load it sees (docs/DESIGN.md §9).

The fleet proxy places whole requests (``fleet.py``); the prefill→decode proxy places the
prefill hop (``router.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from operator import attrgetter
from typing import Any, NamedTuple

import httpx

from kvtier.apps.proxy.balancer import Engine, Pool
from kvtier.apps.proxy.errors import EnginesDown
from kvtier.apps.proxy.event_sources import Source, served, sources, unreachable
from kvtier.apps.proxy.event_stream import EventStream, Mode
from kvtier.apps.proxy.positions import Positions
from kvtier.apps.proxy.prefix_index import PrefixIndex, root_of
from kvtier.apps.proxy.scoring import Held, Loads, choose

logger = logging.getLogger(__name__)

RECENT = 64  # requests over which "sent lately" is counted (a new conversation's tie-break)
_DECAY = 1.0 - 1.0 / RECENT
_URL, _IN_FLIGHT = attrgetter("url"), attrgetter("in_flight")

# what /tokenize takes of a chat request, to apply the chat template as the completion will
# (``response_format``: vLLM 0.34's templates may render it; older ones ignore it)
CHAT_KEYS = (
    "messages", "add_generation_prompt", "continue_final_message", "chat_template",
    "chat_template_kwargs", "tools", "add_special_tokens", "mm_processor_kwargs",
    "response_format",
)  # fmt: skip


class Choice(NamedTuple):
    url: str
    reason: str  # scoring's, or "no-tokens" (kv-aware, but the prompt could not be tokenized)
    predicted: int  # prompt tokens the engine is expected to hold
    uncached: int  # those it is expected to compute

    def header(self, went: str, resent: int = 0) -> tuple[bytes, bytes]:
        """``x-kvtier-route``: where the request ``went`` (the choice, unless it was retried
        elsewhere), why, and the cached tokens predicted there; ``resent=N`` when it went
        there after N engines failed it (``resend.py``)."""
        reason, predicted = (self.reason, self.predicted) if went == self.url else ("retry", 0)
        said = f"{went}; {reason}; predicted_cached_tokens={predicted}"
        if resent:
            said += f"; resent={resent}"
        return b"x-kvtier-route", said.encode()


class Placement:
    def __init__(self, pool: Pool, policy: str, connect_timeout_s: float) -> None:
        self.pool, self.policy, self.connect_timeout_s = pool, policy, connect_timeout_s
        urls = [engine.url for engine in pool.engines]
        self.index = PrefixIndex()
        self.served: dict[str, frozenset[str]] = {}  # each engine's base models, as listed last
        self.bases: frozenset[str] = frozenset()  # all of them, by every name
        self._told: set[frozenset[str]] = set()  # lists said to differ from another
        self.lock = threading.Lock()  # the index, between the streams' threads and requests
        self.streams: dict[str, list[EventStream]] = {url: [] for url in urls}
        self.no_events: dict[str, str] = dict.fromkeys(urls, "not asked yet")
        self.queued = dict.fromkeys(urls, 0)  # prompt tokens sent, not yet answered
        self.recent = dict.fromkeys(urls, 0.0)  # requests sent lately, decaying
        self.positions = Positions(urls)  # the engines up, by position (a new one as they change)
        self._turn = 0
        self._modes = 0  # bumped when an engine's streams or their modes change
        self._blind: tuple[Positions, int, list[int]] = (self.positions, -1, [])

    def mode(self, url: str) -> Mode:
        """``url``'s index: exact when every stream of it is, else degraded, or down."""
        streams = self.streams[url]
        if not streams or any(s.mode is Mode.DOWN for s in streams):
            return Mode.DOWN
        return Mode.DEGRADED if any(s.mode is Mode.DEGRADED for s in streams) else Mode.EXACT

    def root(self, request: dict[str, Any]) -> int:
        """Where the digests of ``request``'s blocks start: from its LoRA adapter (its
        ``model``, if an adapter) and its ``cache_salt``."""
        model, salt = request.get("model"), request.get("cache_salt")
        lora = model if isinstance(model, str) and self._adapter(model) else None
        return root_of(lora, salt if isinstance(salt, str) else None)

    def _adapter(self, model: str) -> bool:
        """Whether ``model`` names a LoRA adapter: one an event or an engine named, or, once
        engines listed their base models, any other name (vLLM serves no other model): an
        adapter loaded since (``/v1/load_lora_adapter``), none of whose blocks is known."""
        return model in self.index.adapters or (bool(self.bases) and model not in self.bases)

    def choose(self, tokens: list[int] | None, root: int = 0) -> Choice:
        """The engine up that takes a prompt of ``tokens`` (None: not known) whose blocks'
        digests start at ``root``; raises ``EnginesDown`` (from the pool) when none is up."""
        up = self.pool.up()
        if not up:
            raise EnginesDown(self.pool.side, self.pool.down_reasons())
        n = len(tokens) if tokens is not None else 0
        urls = list(map(_URL, up))
        if self.positions.names != urls:  # an engine went down or came back
            self.positions = Positions(urls)
        with self.lock:
            block_size = self.index.block_size
            stretches = (
                self.index.prompt_stretches(tokens, self.positions, root)
                if tokens is not None and block_size and self.policy == "kv-aware"
                else None
            )
        cached = None
        if stretches is not None:  # engines whose index is not exact count as holding nothing
            cached = Held(stretches, self.positions, self._blind_now())
        loads = Loads(list(map(_IN_FLIGHT, up)), list(map(self.queued.__getitem__, urls)),
                      list(map(self.recent.__getitem__, urls)))  # fmt: skip
        decision = choose(self.policy, loads, n, block_size or 1, self._turn, cached)
        self._turn += 1
        # a count over about the last RECENT requests
        self.recent = dict(zip(self.recent, map(_DECAY.__mul__, self.recent.values())))
        url = up[decision.index].url
        self.recent[url] += 1.0
        unknown = tokens is None and self.policy == "kv-aware" and decision.reason != "no-index"
        reason = "no-tokens" if unknown else decision.reason
        return Choice(url, reason, decision.cached_tokens, n - decision.cached_tokens)

    def _blind_now(self) -> list[int]:
        """The positions of the engines up (``self.positions``) whose index is not exact:
        worked out again only when the engines up, their streams or a stream's mode changed
        since (not an engine at a time for every request)."""
        positions, modes, blind = self._blind
        if positions is not self.positions or modes != self._modes:
            modes = self._modes  # read first: a change while reading is seen next time
            names = enumerate(self.positions.names)
            blind = [i for i, url in names if self.mode(url) is not Mode.EXACT]
            self._blind = (self.positions, modes, blind)
        return blind

    def _stream(self, url: str, source: Source) -> EventStream:
        """A stream of ``url``'s events into the index (not started), telling of its mode."""
        return EventStream(url, source, self.index, self.lock, changed=self._changed)

    def _changed(self) -> None:
        """An engine's streams, or a stream's mode, changed (from any thread)."""
        self._modes += 1

    def sending(self, choice: Choice) -> _Queued:
        """``with placement.sending(choice):`` while the request computes its prompt there."""
        return _Queued(self.queued, choice)

    async def tokens(
        self, path: str, request: dict[str, Any], headers: dict[str, str]
    ) -> list[int] | None:
        """The prompt's token ids as the engines see them; None when they cannot be had (or
        are not needed: a policy that ignores them)."""
        if self.policy != "kv-aware" or not any(self.mode(u) is Mode.EXACT for u in self.streams):
            return None  # not needed: no index to look them up in
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # a batch: routed by its first prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if path.endswith("/chat/completions"):
            body = {key: request[key] for key in CHAT_KEYS if key in request}
        elif isinstance(prompt, str):
            body = {"prompt": prompt, "add_special_tokens": request.get("add_special_tokens", True)}
        else:
            return None
        body["model"] = request.get("model")
        up = [engine for engine in self.pool.engines if self.pool.is_up(engine)]
        if not up:
            return None
        engine = up[self._turn % len(up)]
        try:
            answer = await engine.client.post("/tokenize", json=body, headers=headers)
            tokens = answer.json().get("tokens") if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("kvtier proxy: /tokenize on %s failed: %s", engine.url, exc)
            return None
        return tokens if isinstance(tokens, list) else None

    async def track(self, engine: Engine, up: bool, stalled: bool = False) -> None:
        """An engine's /health passed (``up``): its events followed if they are not yet. It
        failed: the engine is forgotten (a restarted engine comes back empty), unless the probe
        only went unanswered in time (``stalled``: a pause, a busy machine): skipped by the
        pool, it keeps its index, since its KV is still there and its events, still followed,
        tell what changes."""
        if not up and not stalled and self.streams[engine.url]:
            await asyncio.to_thread(self._unfollow, engine.url)
        elif up and not self.streams[engine.url]:
            await asyncio.to_thread(self._follow, engine.url)

    def _follow(self, url: str) -> None:
        try:
            found = sources(url, self.connect_timeout_s)
        except (OSError, ValueError, KeyError) as exc:
            self.no_events[url] = f"/kv_event_sources: {exc}"
            return
        why = unreachable(url, found)
        if why:
            if why != self.no_events[url]:  # said once, not at every /health
                logger.warning("kvtier proxy: %s: %s; routed by load", url, why)
            self.no_events[url] = why
            return
        models = served(url, self.connect_timeout_s)
        with self.lock:
            self._compare(url, models.bases)
            self.bases = frozenset().union(*self.served.values())
            self.index.adapters |= models.adapters
        self.streams[url] = [self._stream(url, source) for source in found]
        self._changed()
        for stream in self.streams[url]:
            stream.start()
        self.no_events[url] = ""

    def _compare(self, url: str, bases: frozenset[str]) -> None:
        """One proxy routes one model: engines listing other base models (by name) are said,
        once for each two lists, as a request naming one may reach an engine without it."""
        if not bases:  # not listed (``--api-key``): nothing to keep or compare
            return
        self.served[url] = bases
        for other, theirs in self.served.items():
            if theirs != bases and not {theirs, bases} <= self._told:
                self._told |= {theirs, bases}
                logger.warning("kvtier proxy: %s serves %s, %s serves %s: every engine of a proxy "
                               "must serve the same model under the same names "
                               "(--served-model-name)", url, sorted(bases), other,
                               sorted(theirs))  # fmt: skip

    def _unfollow(self, url: str) -> None:
        streams, self.streams[url] = self.streams[url], []
        self._changed()
        for stream in streams:
            stream.stop()
        with self.lock:
            self.index.drop(url)

    async def aclose(self) -> None:
        for url in self.streams:
            await asyncio.to_thread(self._unfollow, url)


class _Queued:
    def __init__(self, queued: dict[str, int], choice: Choice) -> None:
        self.queued, self.choice = queued, choice

    def __enter__(self) -> None:
        self.queued[self.choice.url] += self.choice.uncached

    def __exit__(self, *_: object) -> None:
        self.queued[self.choice.url] -= self.choice.uncached
