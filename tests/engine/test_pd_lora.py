"""Prefill→decode of a LoRA adapter's request, in real vLLM on the CPU: a prefill ``kvtier serve``
with adapter ``a`` loaded, and in-process decode engines with an adapter of the same name.

vLLM names an adapter by its name alone, in block hashes and in the params a prefill engine
offers: a decode engine whose ``a`` has other files (retrained, midway through a rolling update)
would pull KV its own adapter does not compute. The offer carries the salt of the prefill
engine's adapter files: the same files (at any path) are pulled, other files are refused,
counted and computed, and the answer is the decode engine's own."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import LORA_RANK, SERVED_BLOCKS, engine, kvtier_transfer, lora_adapter
from vllm import SamplingParams
from vllm.lora.request import LoRARequest

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
from kvtier.apps.prompts import make_prompt
from kvtier.vllm.kv_role import SALT

pytestmark = pytest.mark.engine

SECRET = "pd-lora-test-secret-32-bytes-long"
MAX_TOKENS = 8
LORA = {"enable_lora": True, "max_lora_rank": LORA_RANK, "max_loras": 1}


@pytest.fixture(scope="module")
def prefill(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A prefill engine serving adapter ``a`` (``lora_adapter`` of seed 0)."""
    work = tmp_path_factory.mktemp("pd-lora")
    adapter = lora_adapter(work / "a", seed=0)
    port = free_port()
    extra = {"cpu_bytes_to_use": "64MiB", "transfer": {"hold_s": 30.0}}
    args = (*SERVED_BLOCKS, "--kv-role", "kv_producer", "--enable-lora", "--lora-modules",
            f"a={adapter}", "--max-lora-rank", str(LORA_RANK))  # fmt: skip
    server = launch(serve_command(tiny_model, port, extra, args), port, work / "prefill.log",
                    {"KVTIER_TRANSFER_SECRET": SECRET, **WORKER_IN_CORE})  # fmt: skip
    try:
        wait_healthy(server)
        yield server
    finally:
        stop(server)


def _offer(prefill: Server, prompt: list[int]) -> dict[str, Any]:
    """The prefill engine's params for ``prompt`` computed with its adapter ``a``."""
    asks = {"do_remote_decode": True, "do_remote_prefill": False}
    body = {"model": "a", "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "kv_transfer_params": asks}  # fmt: skip
    params: dict[str, Any] = post(prefill.url, "/v1/completions", body)["kv_transfer_params"]
    return params


def _decode(model: Path, adapter: str, prompt: list[int], params: dict[str, Any] | None) -> Any:
    """An in-process engine with ``adapter`` as its ``a`` answers ``prompt``: the answer, and
    (``params``: pulled from the prefill engine) its peer tier's counts."""
    transfer = kvtier_transfer(transfer={"secret": SECRET, "timeout_s": 5.0})
    config = transfer | {"kv_role": "kv_consumer"} if params is not None else None
    with engine(model, max_model_len=1024, kv_transfer_config=config, **LORA) as llm:
        extra = {"kv_transfer_params": params} if params is not None else None
        sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                  extra_args=extra)  # fmt: skip
        (output,) = llm.generate([{"prompt_token_ids": prompt}], sampling, use_tqdm=False,
                                 lora_request=LoRARequest("a", 1, adapter))  # fmt: skip
        peer = kvtier.stats(llm).tiers["peer"] if params is not None else None
        return list(output.outputs[0].token_ids), peer


@pytest.mark.parametrize("files", ["the same", "other"])
def test_a_decode_engine_pulls_only_what_its_own_adapter_files_computed(
    prefill: Server, tiny_model: Path, tmp_path: Path, files: str
) -> None:
    theirs = str(prefill.log.parent / "a")
    ours = (str(shutil.copytree(theirs, tmp_path / "a")) if files == "the same"  # another path
            else lora_adapter(tmp_path / "a", seed=1))  # fmt: skip
    prompt = make_prompt(tiny_model, 400, seed=520 if files == "the same" else 521)
    want, _ = _decode(tiny_model, ours, prompt, None)
    if files == "other":  # with the prefill engine's KV, the answer would be another
        assert _decode(tiny_model, theirs, prompt, None)[0] != want
    params = _offer(prefill, prompt)
    assert len(params[SALT]) == 32  # the offer names the files
    answer, peer = _decode(tiny_model, ours, prompt, params)
    assert answer == want
    if files == "the same":
        assert peer.loaded_bytes > 0 and peer.bad_chunks == 0
    else:
        assert peer.loaded_bytes == 0 and peer.bad_chunks > 0
    # pulled or refused, the prefill engine frees the offer at once
    wait(lambda: sample(prefill.url, "vllm:kv_cache_usage_perc") == 0.0, WAIT_S,
         "the prefill engine's blocks freed")  # fmt: skip
