"""kvtier in a real engine serving LoRA adapters (``harness.lora_adapter``: random low-rank
updates of the key, value and query projections, so each adapter computes KV of its own). An
adapter's KV is reused by that adapter only, and kvtier tells a router each chunk's adapter as
vLLM tells its blocks'.
An adapter saved again under its name and path (trained again) reuses nothing of the old one's
from disk, and its old files, back, are served what they computed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from event_replay import Replay
from harness import LORA_RANK, engine, greedy, kvtier_transfer, lora_adapter, prompts, settle
from vllm.distributed.kv_events import BlockStored
from vllm.lora.request import LoRARequest

BLOCK = 32  # the engine's block and kvtier's chunk
PROMPT_TOKENS = 300  # nine full chunks and a tail


def _run(
    llm: Any, prompt: list[int], lora: LoRARequest | None, tier: str = "cpu"
) -> tuple[list[int], int]:
    """Its output's token ids, and the prompt tokens kvtier's ``tier`` served."""
    (output,) = llm.generate([{"prompt_token_ids": prompt}], greedy(8), use_tqdm=False,
                             lora_request=lora)  # fmt: skip
    return list(output.outputs[0].token_ids), output.kv_transfer_params["kvtier"][tier]


def test_an_adapters_kv_is_reused_by_that_adapter_alone_and_told_with_its_name(
    tiny_model: Path, tmp_path: Path
) -> None:
    adapters = {name: LoRARequest(name, i + 1, lora_adapter(tmp_path / name, seed=i))
                for i, name in enumerate(("a", "b"))}  # fmt: skip
    prompt = prompts(tiny_model, [PROMPT_TOKENS], seed=41)[0]
    replay = f"ipc://{tmp_path}/replay"
    events_config = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
                     "endpoint": f"ipc://{tmp_path}/events", "replay_endpoint": replay}  # fmt: skip
    with engine(
        tiny_model, enable_lora=True, max_lora_rank=LORA_RANK, max_loras=2,
        kv_transfer_config=kvtier_transfer(), kv_events_config=events_config,
    ) as llm:  # fmt: skip
        first = {}
        for name in ("base", "a", "b"):  # each computes its own: nothing of another's is reused
            first[name], served = _run(llm, prompt, adapters.get(name))
            settle(llm)
            assert served == 0, f"{name} was served {served} tokens of another's KV"
        assert len({tuple(tokens) for tokens in first.values()}) == 3  # each KV its own
        llm.reset_prefix_cache()  # the engine's own cache emptied: a hit is kvtier's
        for name in ("b", "base", "a"):
            again, served = _run(llm, prompt, adapters.get(name))
            assert served == PROMPT_TOKENS - 1 and again == first[name], name

        # the chunks kvtier holds, told with their adapter as vLLM tells the same blocks
        events = Replay(replay).wait(
            lambda told: sum(isinstance(e, BlockStored) and e.medium == "CPU" for e in told) >= 27
        )
    engines = {h: e for e in events if isinstance(e, BlockStored) and e.medium == "GPU"
               for h in e.block_hashes}  # fmt: skip
    told = [e for e in events if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert {e.lora_name for e in told} == {None, "a", "b"}
    for event in told:
        (block,) = event.block_hashes
        theirs = engines[block]
        assert (event.lora_id, event.lora_name) == (theirs.lora_id, theirs.lora_name)
        keys = theirs.extra_keys[theirs.block_hashes.index(block)] if theirs.extra_keys else None
        assert (event.extra_keys or [None]) == [keys]  # none told: as vLLM's [None]


def test_an_adapter_saved_again_under_its_name_reuses_nothing_of_the_old_ones(
    tiny_model: Path, tmp_path: Path
) -> None:
    """vLLM's block hashes name an adapter by its name: kvtier's keys also take its files, so a
    disk tier the old adapter filled serves the new one nothing, then the old one again."""
    folder = tmp_path / "adapter"
    lora = LoRARequest("a", 1, lora_adapter(folder, seed=0))
    prompt = prompts(tiny_model, [PROMPT_TOKENS], seed=43)[0]
    disk = {"path": str(tmp_path / "disk"), "bytes": "64MiB"}

    def run(*, settled: bool = False) -> tuple[list[int], int]:
        with engine(
            tiny_model, enable_lora=True, max_lora_rank=LORA_RANK, max_loras=1,
            kv_transfer_config=kvtier_transfer(disk=disk),
        ) as llm:  # fmt: skip
            outputs, served = _run(llm, prompt, lora, tier="disk")
            settle(llm)  # written to disk (idle), for the next engine
            return outputs, served

    old, served = run()
    assert served == 0
    lora_adapter(folder, seed=1)  # trained again, saved over the old one: same names and sizes
    new, served = run()
    assert served == 0, f"the new adapter was served {served} tokens of the old one's KV"
    assert new != old
    lora_adapter(folder, seed=0)  # the old one back
    again, served = run()
    assert served >= PROMPT_TOKENS // BLOCK * BLOCK and again == old
