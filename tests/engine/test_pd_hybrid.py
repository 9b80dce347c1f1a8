"""Prefill→decode with a hybrid model (sliding-window and full attention layers: two KV cache
groups): a prefill ``kvtier serve`` hands each prompt's KV to an in-process decode engine, group
by group, and the decode engine's greedy outputs equal a single engine's.

Some lengths put the first token the last prompt token attends to (the decode engine computes
that token again) at the start of a block the prefill engine's window had just left: n - 64 + 1
a multiple of 32 (n = 319, 447). Before kvtier knew, the decode engine attended to a block never
written there, and 319's outputs differed. The prefill engine now computes those prompts without
their last token, which the decode engine computes: every prompt is pulled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import SERVED_BLOCKS, engine, kvtier_transfer, prompts
from vllm import SamplingParams

import kvtier
from kvtier.apps.bench.common.servers import (
    WAIT_S,
    WORKER_IN_CORE,
    Server,
    launch,
    post,
    sample,
    serve_command,
    stop,
    wait,
    wait_healthy,
)
from kvtier.apps.ports import free_port

pytestmark = pytest.mark.engine

SECRET = "pd-hybrid-test-secret-of-32-bytes"
LENGTHS = [300, 319, 447, 450, 130, 640]  # all longer than the 64-token sliding window
WINDOW_LOST = {319, 447}  # n - 64 + 1 a multiple of 32: the prefill engine backs off one token
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def prefill(hybrid_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    command = [*serve_command(hybrid_model, port, {"cpu_bytes_to_use": "64MiB"}, SERVED_BLOCKS),
               "--kv-role", "kv_producer"]  # fmt: skip
    log = tmp_path_factory.mktemp("pd-hybrid") / "prefill.log"
    server = launch(command, port, log, {"KVTIER_TRANSFER_SECRET": SECRET, **WORKER_IN_CORE})
    try:
        wait_healthy(server)
        yield server
    finally:
        stop(server)


def _offer(prefill: Server, prompt: list[int]) -> dict[str, Any]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "kv_transfer_params": {"do_remote_decode": True,
                                   "do_remote_prefill": False}}  # fmt: skip
    params: dict[str, Any] = post(prefill.url, "/v1/completions", body)["kv_transfer_params"]
    return params


def test_a_hybrid_models_prompts_cross_group_by_group(
    hybrid_model: Path, prefill: Server, reference: Any
) -> None:
    token_prompts = prompts(hybrid_model, LENGTHS, seed=71)
    expected = reference(hybrid_model, token_prompts, MAX_TOKENS, max_model_len=1024)
    config = kvtier_transfer(transfer={"secret": SECRET}) | {"kv_role": "kv_consumer"}
    with engine(hybrid_model, max_model_len=1024, kv_transfer_config=config) as llm:
        outputs, pulled = [], 0
        for prompt in token_prompts:
            params = _offer(prefill, prompt)
            assert len(params["remote_block_ids"]) == 2  # one list per group
            sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                      extra_args={"kv_transfer_params": params})  # fmt: skip
            (output,) = llm.generate([{"prompt_token_ids": prompt}], sampling, use_tqdm=False)
            outputs.append(list(output.outputs[0].token_ids))
            peer = kvtier.stats(llm).tiers["peer"]
            assert peer.failed_loads == 0
            assert peer.loaded_bytes > pulled, f"{len(prompt)} tokens: nothing pulled"
            pulled = peer.loaded_bytes
            backed_off = len(prompt) - 1 if len(prompt) in WINDOW_LOST else len(prompt)
            assert params["remote_num_tokens"] == backed_off
        assert outputs == expected
    wait(lambda: _idle(prefill), WAIT_S, "every offer pulled or released")


def _idle(server: Server) -> bool:
    return sample(server.url, "vllm:kv_cache_usage_perc") == 0.0
