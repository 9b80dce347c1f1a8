"""What names a block's KV besides its tokens, in the proxy's index: a LoRA adapter and a cache
salt start a prompt's digests elsewhere (as they change the engines' block hashes), and a block
of an image or of prompt embeddings, which its tokens do not name, is never placed. Both the
compiled index and its Python fallback."""

from __future__ import annotations

import msgspec
import pytest
from vllm.distributed.kv_events import BlockStored, KVEventBatch

from kvtier.apps.proxy import prefix_index
from kvtier.apps.proxy.kv_events import Event, Kind, decode_batch
from kvtier.apps.proxy.prefix_index import PrefixIndex, Run, root_of

BS = 4
TOKENS = list(range(100, 132))  # eight blocks


@pytest.fixture(params=["compiled", "python"])
def index(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> PrefixIndex:
    if request.param == "python":
        monkeypatch.setattr(prefix_index, "_digests", None)
    elif prefix_index._digests is None:
        pytest.skip("the compiled digests are not built here")
    return PrefixIndex()


def _event(hashes: list[int], extra: list[object] | None, lora: str | None = None,
           parent: int | None = None, first: int = 0) -> bytes:  # fmt: skip
    """A batch of one of vLLM's own ``BlockStored``, as an engine publishes it."""
    tokens = TOKENS[first * BS : (first + len(hashes)) * BS]
    stored = BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                         block_size=BS, lora_id=1 if lora else None, medium="GPU",
                         lora_name=lora, extra_keys=extra)  # fmt: skip
    return msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[stored]))


def test_an_adapter_a_salt_and_an_image_are_read_from_vllms_events() -> None:
    # vLLM's untagged extra keys: the adapter's name on every block, the salt on the first
    (salted,) = decode_batch(_event([1, 2], [("ad", "tenant-1"), ("ad",)], lora="ad"))
    assert (salted.lora, salted.salt, salted.opaque_from) == ("ad", "tenant-1", None)
    (plain,) = decode_batch(_event([1, 2], [None, None]))
    assert (plain.lora, plain.salt, plain.opaque_from) == (None, None, None)
    # an image from block 1 on: its (identifier, offset) pair; prompt embeddings' digests
    (image,) = decode_batch(_event([1, 2, 3], [None, (("img-hash", 0),), (("img-hash", 4),)]))
    assert image.opaque_from == 1
    (embeds,) = decode_batch(_event([1], [(b"\x01" * 32,)]))
    assert embeds.opaque_from == 0
    # a string past a prompt's first block is no salt this index knows: not placed
    (later,) = decode_batch(_event([3], [("what",)], parent=2, first=2))
    assert (later.salt, later.opaque_from) == (None, 0)


def test_a_prompt_meets_its_blocks_only_under_their_adapter_and_salt(index: PrefixIndex) -> None:
    for engine, extra, lora in (("base", [None, None], None),
                                ("salted", [("t1",), None], None),
                                ("adapter", [("ad",), ("ad",)], "ad"),
                                ("both", [("ad", "t1"), ("ad",)], "ad")):  # fmt: skip
        assert index.apply(engine, decode_batch(_event([1, 2], extra, lora))) == 0
    assert index.adapters == {"ad"}
    assert len({root_of(None, None), root_of(None, "t1"), root_of("ad", None),
                root_of("ad", "t1")}) == 4 and root_of(None, None) == 0  # fmt: skip
    engines = ["base", "salted", "adapter", "both"]
    for lora, salt, holder in ((None, None, "base"), (None, "t1", "salted"),
                               ("ad", None, "adapter"), ("ad", "t1", "both")):  # fmt: skip
        runs = index.prompt_runs(TOKENS, engines, root_of(lora, salt))
        assert {e: runs[e].total for e in engines} == {e: 2 * (e == holder) for e in engines}
    assert index.prompt_runs(TOKENS, engines, root_of(None, "t2")).common == Run()
    # a chunk told later with its parent continues its prompt's chain, adapter and salt kept
    later = _event([3, 4], [("ad",), ("ad",)], lora="ad", parent=2, first=2)
    index.apply("both", [e._replace(medium="CPU") for e in decode_batch(later)])
    assert index.prompt_runs(TOKENS, ["both"], root_of("ad", "t1"))["both"] == Run(
        {"GPU": 2, "CPU": 2}
    )
    assert index.prompt_runs(TOKENS, ["both"])["both"] == Run()


def test_blocks_their_tokens_do_not_name_are_never_placed(index: PrefixIndex) -> None:
    # two prompts of one text prefix, then an image each: the same placeholder tokens
    index.apply("a", decode_batch(_event([1, 2, 3], [None, (("cat", 0),), (("cat", 4),)])))
    index.apply("b", decode_batch(_event([7, 8, 9], [None, (("dog", 0),), (("dog", 4),)])))
    assert len(index) == 1  # the text block, held by both; no image block
    runs = index.prompt_runs(TOKENS, ["a", "b"])
    assert runs["a"] == runs["b"] == Run({"GPU": 1})
    # the same shape, built by hand as the fleet simulation does: every block placed
    index.apply("c", [Event(Kind.STORED, (5, 6), None, tuple(TOKENS[:8]), BS)])
    assert index.prompt_runs(TOKENS, ["c"])["c"] == Run({"GPU": 2})
