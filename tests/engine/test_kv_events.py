"""kvtier's KV events in a real engine's ZMQ stream, decoded with vLLM's own classes: each tier's
chunks in the engine's block hashes, with their token ids and parent, as a router indexes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from disk_helpers import CHUNK, disk_extra
from event_replay import Replay
from harness import connector, engine, generate, kvtier_transfer, prompts, settle
from vllm.distributed.kv_events import BlockRemoved, BlockStored

BLOCK = 32  # the engine's block: a chunk is two blocks


def _tiers(events: list[Any], medium: str) -> tuple[list[BlockStored], list[BlockRemoved]]:
    stored = [e for e in events if isinstance(e, BlockStored) and e.medium == medium]
    removed = [e for e in events if isinstance(e, BlockRemoved) and e.medium == medium]
    return stored, removed


def test_each_tiers_chunks_are_told_in_the_engines_block_hashes(
    tiny_model: Path, tmp_path: Path
) -> None:
    publish, replay = f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay"
    events_config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": publish,
                     "replay_endpoint": replay, "topic": "kv"}  # fmt: skip
    # a host tier of four chunks; three prompts of three chunks: six are evicted to disk
    extra = disk_extra(tmp_path / "disk", cpu=f"{4 * CHUNK * 1024}B") | {"reset_keeps_tiers": True}
    token_prompts = prompts(tiny_model, [200, 200, 200], seed=21)
    with engine(
        tiny_model, kv_transfer_config=kvtier_transfer(**extra), kv_events_config=events_config
    ) as llm:
        assert connector(llm).scheduler.manager.capacity == 4
        generate(llm, token_prompts)
        settle(llm)  # idle: the host tier's chunks are written back to disk
        reader = Replay(replay)
        events = reader.wait(lambda ev: len(_tiers(ev, "DISK")[0]) == 9)

        # the engine's own blocks: hash -> its tokens, and the hash before it
        engine_blocks = {}
        for event in events:
            if isinstance(event, BlockStored) and event.medium == "GPU":
                parent = event.parent_block_hash
                for i, block_hash in enumerate(event.block_hashes):
                    tokens = event.token_ids[i * BLOCK : (i + 1) * BLOCK]
                    engine_blocks[block_hash] = (parent, tokens)
                    parent = block_hash
        cpu_stored, cpu_removed = _tiers(events, "CPU")
        disk_stored, _ = _tiers(events, "DISK")
        assert len(cpu_stored) == 9  # every full chunk of the three prompts, once
        for event in cpu_stored + disk_stored:
            assert event.block_size == BLOCK and len(event.block_hashes) == CHUNK // BLOCK
            assert event.block_hashes[0] in engine_blocks, "not the engine's block hash"
            assert event.parent_block_hash == engine_blocks[event.block_hashes[0]][0]
            tokens = [t for h in event.block_hashes for t in engine_blocks[h][1]]
            assert event.token_ids == tokens
        told = {tuple(e.block_hashes) for e in cpu_stored}
        assert {tuple(e.block_hashes) for e in disk_stored} == told  # all reached the disk
        assert len(cpu_removed) == 5  # evicted: only four chunks fit (one freed as stored)
        assert {tuple(e.block_hashes) for e in cpu_removed} < told

        # a reset of kvtier's cache removes what it dropped from host memory; disk keeps its own.
        # Told at the engine's next step, as vLLM tells its own reset (a short prompt: no chunk)
        assert llm.reset_prefix_cache(reset_connector=True)
        generate(llm, prompts(tiny_model, [20], seed=22))
        events = reader.wait(lambda ev: len(_tiers(ev, "CPU")[1]) == 9)
        assert not [e for e in events if isinstance(e, BlockRemoved) and e.medium == "DISK"]
