"""Chunk keys: deterministic, namespaced by layout, keyed by each chunk's last block hash."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.keys import (
    KEY_BYTES,
    ChunkKeyMaker,
    LayoutFingerprint,
    chain_hashes,
    key_fingerprint,
    key_group,
    key_hex,
    make_key,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

FP = LayoutFingerprint(
    model="Qwen/Qwen3-0.6B",
    dtype="bfloat16",
    layout="cpu:(kv_heads=2,block=32,2*head=64)",
    tp_rank=0,
    tp_size=2,
    pp_rank=0,
    chunk_tokens=64,
)
HASHES: list[bytes | int] = list(range(100, 110))  # 10 engine blocks, integer hashes


def test_same_inputs_give_same_keys() -> None:
    first = ChunkKeyMaker(FP, block_size_factor=2).keys(HASHES, group=0)
    second = ChunkKeyMaker(dataclasses.replace(FP), block_size_factor=2).keys(HASHES, group=0)
    assert first == second
    assert len(first) == 5
    assert len(set(first)) == 5
    assert all(isinstance(k, bytes) and len(k) == KEY_BYTES for k in first)


def test_keys_are_the_same_in_another_process() -> None:
    script = (
        "from kvtier.keys import ChunkKeyMaker, LayoutFingerprint, chain_hashes, key_hex\n"
        f"fp = {FP!r}\n"
        "hashes = chain_hashes(list(range(256)), 32)\n"
        "for algo in ('xxh3_128', 'sha256'):\n"
        "    print(fp.digest().hex())\n"
        "    for k in ChunkKeyMaker(fp, 2, algo).keys(hashes, 1):\n"
        "        print(key_hex(k))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    ).stdout.split()

    hashes = chain_hashes(list(range(256)), 32)
    expected: list[str] = []
    for algo in ("xxh3_128", "sha256"):
        expected.append(FP.digest().hex())
        expected += [key_hex(k) for k in ChunkKeyMaker(FP, 2, algo).keys(hashes, 1)]
    assert out == expected


@pytest.mark.parametrize(
    "change",
    [
        {"model": "Qwen/Qwen3-1.7B"},
        {"dtype": "float16"},
        {"layout": "cuda:(2,blocks,block=32,kv_heads=2,head=64)"},
        {"tp_rank": 1},
        {"tp_size": 4},
        {"pp_rank": 1},
        {"chunk_tokens": 128},
        {"weights": "0" * 32},
    ],
)
def test_another_fingerprint_gives_other_keys(change: dict[str, object]) -> None:
    other = dataclasses.replace(FP, **change)  # type: ignore[arg-type]
    assert other.digest() != FP.digest()
    ours = ChunkKeyMaker(FP, 2).keys(HASHES, group=0)
    theirs = ChunkKeyMaker(other, 2).keys(HASHES, group=0)
    assert set(ours).isdisjoint(theirs)
    assert all(key_fingerprint(k) == other.digest() for k in theirs)


def test_named_weights_at_another_path_are_the_same_namespace() -> None:
    # the weights name the KV: the path they were read from is told, not digested
    weighed = dataclasses.replace(FP, weights="1" * 32)
    elsewhere = dataclasses.replace(weighed, model="/mnt/models/qwen3")
    assert elsewhere.digest() == weighed.digest() != FP.digest()
    assert "model=/mnt/models/qwen3" in elsewhere.describe()
    assert dataclasses.replace(weighed, weights="2" * 32).digest() != weighed.digest()


def test_another_group_gives_other_keys() -> None:
    maker = ChunkKeyMaker(FP, 2)
    group0, group1 = maker.keys(HASHES, group=0), maker.keys(HASHES, group=1)
    assert set(group0).isdisjoint(group1)
    assert [key_group(k) for k in group0] == [0] * 5
    assert [key_group(k) for k in group1] == [1] * 5


def test_hash_algos_give_other_keys() -> None:
    xxh = ChunkKeyMaker(FP, 2, "xxh3_128").keys(HASHES, group=0)
    sha = ChunkKeyMaker(FP, 2, "sha256").keys(HASHES, group=0)
    assert set(xxh).isdisjoint(sha)


def test_int_and_bytes_block_hashes_never_collide() -> None:
    digest = FP.digest()
    assert make_key(digest, 1, 0) != make_key(digest, (1).to_bytes(8, "big"), 0)
    assert make_key(digest, -1, 0) != make_key(digest, 2**64 - 1, 0)
    assert make_key(digest, 2**100, 0) != make_key(digest, 2**100 + 1, 0)


def test_chained_hashes_depend_on_the_whole_prefix() -> None:
    tokens = list(range(1, 321))  # 10 blocks of 32
    changed_first = [999, *tokens[1:]]
    ours, theirs = chain_hashes(tokens, 32), chain_hashes(changed_first, 32)
    assert len(ours) == len(theirs) == 10
    assert all(a != b for a, b in zip(ours, theirs, strict=True))


def test_changing_the_last_block_changes_only_the_last_hash() -> None:
    tokens = list(range(1, 321))
    changed_last = [*tokens[:-1], 999]
    ours, theirs = chain_hashes(tokens, 32), chain_hashes(changed_last, 32)
    assert ours[:9] == theirs[:9]
    assert ours[9] != theirs[9]


def test_chain_hashes_skips_the_partial_block_and_honours_algo_and_seed() -> None:
    tokens = list(range(100))
    assert len(chain_hashes(tokens, 32)) == 3
    assert chain_hashes(tokens[:96], 32) == chain_hashes(tokens, 32)
    assert chain_hashes(tokens[:31], 32) == []
    assert [len(h) for h in chain_hashes(tokens, 32, "sha256")] == [32, 32, 32]
    assert [len(h) for h in chain_hashes(tokens, 32, "xxh3_128")] == [16, 16, 16]
    assert chain_hashes(tokens, 32, seed=b"other model") != chain_hashes(tokens, 32)


def test_a_chunk_is_keyed_by_its_last_block() -> None:
    maker = ChunkKeyMaker(FP, block_size_factor=4)
    base = maker.keys(HASHES, group=0)
    assert base == [
        make_key(FP.digest(), HASHES[3], 0),
        make_key(FP.digest(), HASHES[7], 0),
    ]

    tail_changed = [*HASHES[:8], 1, 2]  # blocks 8 and 9 are not a full chunk
    assert maker.keys(tail_changed, group=0) == base

    inner_changed = [*HASHES[:4], 1, 2, 3, *HASHES[7:]]  # blocks 4..6 are not a chunk's last
    assert maker.keys(inner_changed, group=0) == base

    last_of_chunk1_changed = [*HASHES[:7], 1, *HASHES[8:]]
    changed = maker.keys(last_of_chunk1_changed, group=0)
    assert changed[0] == base[0]
    assert changed[1] != base[1]


def test_start_block_skips_whole_chunks() -> None:
    maker = ChunkKeyMaker(FP, block_size_factor=4)
    assert maker.keys(HASHES, group=0, start_block=4) == maker.keys(HASHES, group=0)[1:]
    assert maker.keys(HASHES, group=0, start_block=8) == []
    assert maker.keys(HASHES, group=0, start_block=12) == []


def test_start_block_must_be_a_multiple_of_the_factor() -> None:
    maker = ChunkKeyMaker(FP, block_size_factor=4)
    with pytest.raises(ValueError, match="start_block"):
        maker.keys(HASHES, group=0, start_block=2)
    with pytest.raises(ValueError, match="start_block"):
        maker.keys(HASHES, group=0, start_block=-4)


def test_unknown_hash_algo_is_rejected_with_the_accepted_names() -> None:
    with pytest.raises(ValueError, match=r"hash_algo.*'sha256'.*'xxh3_128'.*'md5'"):
        ChunkKeyMaker(FP, 2, hash_algo="md5")
    with pytest.raises(ValueError, match="hash_algo"):
        chain_hashes([1, 2, 3], 1, hash_algo="md5")
    with pytest.raises(ValueError, match="hash_algo"):
        make_key(FP.digest(), 1, 0, hash_algo="md5")


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="block_size_factor"):
        ChunkKeyMaker(FP, block_size_factor=0)
    with pytest.raises(ValueError, match="tp_rank"):
        dataclasses.replace(FP, tp_rank=2)
    with pytest.raises(ValueError, match="chunk_tokens"):
        dataclasses.replace(FP, chunk_tokens=0)
    with pytest.raises(ValueError, match="group"):
        ChunkKeyMaker(FP, 2).keys(HASHES, group=70_000)
    with pytest.raises(ValueError, match="fingerprint_digest"):
        make_key(b"short", 1, 0)
    with pytest.raises(ValueError, match="block_tokens"):
        chain_hashes([1, 2], 0)


def test_key_readers() -> None:
    key = make_key(FP.digest(), b"\x01" * 32, 3)
    assert key_group(key) == 3
    assert key_fingerprint(key) == FP.digest()
    fp_hex, chunk_hex, group = key_hex(key).split(":")
    assert fp_hex == FP.digest().hex()
    assert len(chunk_hex) == 32
    assert group == "g3"
    assert FP.digest().hex() in FP.describe()
    assert "tp=0/2" in FP.describe()


def test_long_prompt_is_fast() -> None:
    tokens = list(range(100_000))
    maker = ChunkKeyMaker(FP, block_size_factor=2)
    start = time.perf_counter()
    keys = maker.keys(chain_hashes(tokens, 32), group=0)
    elapsed = time.perf_counter() - start
    assert len(keys) == 100_000 // 32 // 2
    assert elapsed < 0.5, f"{elapsed:.3f} s"


@given(
    hashes=st.lists(st.binary(min_size=32, max_size=32) | st.integers(-(2**70), 2**70)),
    factor=st.integers(1, 8),
    group=st.integers(0, 3),
)
def test_one_key_per_full_chunk(hashes: list[bytes | int], factor: int, group: int) -> None:
    keys = ChunkKeyMaker(FP, factor).keys(hashes, group)
    assert len(keys) == len(hashes) // factor
    assert all(key_group(k) == group for k in keys)


def test_a_salt_names_other_chunks_and_other_tails() -> None:
    """A request's salt (its LoRA adapter's files) keys its chunks and tail apart from the same
    hashes unsalted or otherwise salted; in the same layout namespace (the fingerprint)."""
    maker = ChunkKeyMaker(FP, 2)
    salts = (b"", b"\x01" * 16, b"\x02" * 16)
    plain, first, second = (maker.keys(HASHES, 0, salt=salt) for salt in salts)
    assert plain == maker.keys(HASHES, 0)
    assert len({*plain, *first, *second}) == 15
    assert first == maker.keys(HASHES, 0, salt=b"\x01" * 16)
    assert {key_fingerprint(k) for k in first} == {FP.digest()}
    tails = {maker.tail_key(HASHES[-1], [5, 6], 0, salt) for salt in (b"", b"\x01" * 16)}
    assert len(tails) == 2
    with pytest.raises(ValueError, match="a key salt is 16 bytes; got 3"):
        maker.keys(HASHES, 0, salt=b"abc")
