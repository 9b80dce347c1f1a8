"""A multi-round chat (the shape of LMCache's ``multi_round_qa``) against an OpenAI endpoint.

    chat_workload(url, users, rounds, pool)                  -> [Answer]   chat completions
    chat_workload(url, users, rounds, pool, tokens=MODEL)    -> [Answer]   the same, in tokens
    ask(client, model, body, user, round, answer_tokens, stream) -> (Answer, text)   one request

``users`` share one system prompt; each user's first message opens with a context of its own
(LMCache's ``--user-history-prompt``: what the user brings, a document or an earlier
conversation); each round every user asks a new question after its history (its context, its
questions and the answers so far), the users in an order shuffled each round (seeded, so
two runs ask the same), as many in flight as ``pool`` has threads. Answers are greedy, of
``answer_tokens`` tokens. Each answer records the prompt's token ids and the answer's (vLLM's
``return_token_ids``), and, through ``kvtier proxy --engine``, the engine it went to and the
cached tokens the proxy predicted (``x-kvtier-route``).

In tokens (``tokens``: the model's directory, for its tokenizer), each prompt is token ids sent
to ``/v1/completions``: the last prompt, its answer's tokens, then the question's. That is a chat
whose answers tokenize back to the tokens generated, as a trained model's do: the local random
models' answers are random tokens, which their text does not tokenize back to, so in chat
completions every answer is computed again the next round, wherever the request goes.
"""

from __future__ import annotations

import functools
import json
import random
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx

from kvtier.apps.corpus import corpus_lines

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SYSTEM_CHARS = 1000  # about 250 tokens of the local models' tokenizer
QUESTION_CHARS = 50  # about 12 tokens
TIMEOUT_S = 120.0


class Answer(NamedTuple):
    user: int
    round: int
    prompt: list[int]  # the prompt's token ids, as the engine computed them
    tokens: list[int]  # the answer's
    engine: str  # where it went ("" without a fleet proxy)
    reason: str  # why the proxy chose it ("" without one)
    predicted: int  # the cached tokens the proxy predicted (0 without one)
    computed: int  # the prompt tokens the engine computed (kvtier's provenance; -1: not said)
    ttft_s: float  # to the answer's first byte (not streamed: its whole answer)


def chat_workload(
    url: str,
    users: int,
    rounds: int,
    pool: Executor,
    answer_tokens: int = 16,
    seed: int = 0,
    model: str = "tiny",
    tokens: Path | None = None,
    context_chars: int = 0,
    stream: bool = False,
) -> list[Answer]:
    """Every user's rounds, in the order they were asked. ``context_chars``: each user's own
    context opening its first message (LMCache's ``--user-history-prompt``). ``stream``: the
    answers streamed, ``ttft_s`` to the first token (no provenance: ``computed`` is -1)."""
    lines = iter(corpus_lines(seed=1000 + seed, count=users * rounds * 4 + 64))
    system = _text(lines, SYSTEM_CHARS)
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": system}] for _ in range(users)
    ]
    prompts = [_encode(tokens, system) for _ in range(users)] if tokens is not None else []
    rng = random.Random(seed)
    answers: list[Answer] = []
    with httpx.Client(base_url=url, timeout=TIMEOUT_S, trust_env=False) as client:
        for round_ in range(rounds):
            order = list(range(users))
            rng.shuffle(order)
            for user in order:
                question = _text(lines, QUESTION_CHARS)
                if round_ == 0 and context_chars:
                    question = _text(lines, context_chars) + "\n" + question
                histories[user].append({"role": "user", "content": question})
                if tokens is not None:
                    prompts[user] += _encode(tokens, "\n" + question)
            asks: list[tuple[int, dict[str, Any]]] = [
                (u, {"prompt": list(prompts[u])} if tokens is not None
                 else {"messages": list(histories[u])})
                for u in order
            ]  # fmt: skip
            futures = [
                pool.submit(ask, client, model, body, u, round_, answer_tokens, stream)
                for u, body in asks
            ]
            for user, future in zip(order, futures, strict=True):
                answer, text = future.result()
                histories[user].append({"role": "assistant", "content": text})
                if tokens is not None:
                    prompts[user] += answer.tokens
                answers.append(answer)
    return answers


def ask(
    client: httpx.Client,
    model: str,
    asked: dict[str, Any],
    user: int,
    round_: int,
    answer_tokens: int,
    stream: bool = False,
) -> tuple[Answer, str]:
    body: dict[str, Any] = {"model": model, "temperature": 0.0, "max_tokens": answer_tokens,
                            "ignore_eos": True, "return_token_ids": True, "stream": stream,
                            **asked}  # fmt: skip
    chat = "messages" in asked
    path = "/v1/chat/completions" if chat else "/v1/completions"
    started = time.perf_counter()
    if stream:
        with client.stream("POST", path, json=body) as response:
            response.raise_for_status()
            found, ttft = _streamed(response, started, chat)
    else:
        response = client.post(path, json=body)
        ttft = time.perf_counter() - started
        response.raise_for_status()
        found = response.json()
    choice = found["choices"][0]
    route = response.headers.get("x-kvtier-route", "")
    engine, _, rest = route.partition(";")
    reason = rest.split(";")[0].strip()
    said = dict(part.strip().split("=", 1) for part in rest.split(";") if "=" in part)
    predicted = int(said.get("predicted_cached_tokens", 0))
    provenance = (found.get("kv_transfer_params") or {}).get("kvtier") or {}
    prompt = found.get("prompt_token_ids") or choice.get("prompt_token_ids") or asked.get("prompt")
    answer = Answer(user, round_, list(prompt or []), list(choice["token_ids"]), engine, reason,
                    predicted, int(provenance.get("computed", -1)), ttft)  # fmt: skip
    text = choice["message"]["content"] if chat else choice.get("text")
    return answer, str(text or "")


def _streamed(response: httpx.Response, started: float, chat: bool) -> tuple[dict[str, Any], float]:
    """A streamed answer gathered as a whole one would read (its text, token ids and prompt's),
    and the seconds from ``started`` to its first token."""
    text, prompt, ttft = "", None, 0.0
    token_ids: list[int] = []
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        prompt = prompt or chunk.get("prompt_token_ids")
        for choice in chunk.get("choices", []):
            prompt = prompt or choice.get("prompt_token_ids")
            if choice.get("token_ids") and not ttft:
                ttft = time.perf_counter() - started
            token_ids += choice.get("token_ids") or []
            delta = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            text += delta or ""
    choice = {"token_ids": token_ids, "message": {"content": text}, "text": text}
    return {"choices": [choice], "prompt_token_ids": prompt}, ttft


def _encode(model_dir: Path, text: str) -> list[int]:
    """``text``'s token ids by the model's own tokenizer (no ``<s>``)."""
    return _tokenizer(str(model_dir)).encode(text, add_special_tokens=False).ids


@functools.cache
def _tokenizer(model_dir: str) -> Tokenizer:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def _text(lines: Any, chars: int) -> str:
    out = ""
    while len(out) < chars:
        out += next(lines) + " "
    return out.strip()
