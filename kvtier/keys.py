"""Chunk keys: the identity of a chunk, namespaced by the layout it was computed for.

Primitives:
    LayoutFingerprint(...).digest()     -> bytes           16 bytes naming model/dtype/layout/rank
    make_key(fp_digest, block_hash, g)  -> ChunkKey        the key of one chunk
    ChunkKeyMaker(fp, factor).keys(...) -> list[ChunkKey]  keys of a request's full chunks
    ChunkKeyMaker.rename(fp)                               the keys are fp's from now on
    chain_hashes(tokens, block_tokens)  -> list[bytes]     chained prefix hashes, one per full block
    key_group / key_fingerprint / key_hex                  read a key back

A key is ``bytes`` (``KEY_BYTES`` long): fingerprint digest (16) + chunk hash (16) + group (2, big
endian). The chunk hash is the selected hash of (fingerprint digest + the request's salt, if any
+ the chunk's last block hash + group). Block hashes are chained, so the last one covers the
whole prefix; the fingerprint keeps KV of one model or layout from ever being served to another.
Everything is derived with stable hashes (never the builtin ``hash()``), so keys agree across
processes and runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NewType

import numpy as np
import numpy.typing as npt
import xxhash

ChunkKey = NewType("ChunkKey", bytes)
BlockHash = bytes | int

HASH_ALGOS = ("sha256", "xxh3_128")
FINGERPRINT_BYTES = 16
CHUNK_HASH_BYTES = 16
GROUP_BYTES = 2
KEY_BYTES = FINGERPRINT_BYTES + CHUNK_HASH_BYTES + GROUP_BYTES  # 34
MAX_GROUP = (1 << (8 * GROUP_BYTES)) - 1
SALT_BYTES = 16

_FINGERPRINT_VERSION = "kvtier-layout-v1"


def _hash_function(hash_algo: str) -> Callable[[bytes], bytes]:
    """The digest function named ``hash_algo``; ValueError listing the accepted names otherwise."""
    if hash_algo == "xxh3_128":
        return xxhash.xxh3_128_digest
    if hash_algo == "sha256":
        return lambda data: hashlib.sha256(data).digest()
    accepted = ", ".join(repr(name) for name in HASH_ALGOS)
    raise ValueError(f"hash_algo must be one of {accepted}; got {hash_algo!r}")


@dataclass(frozen=True)
class LayoutFingerprint:
    """What a chunk's bytes mean: two chunks are interchangeable only if their fingerprints match.

    ``layout`` describes the engine block layout, e.g. ``"cpu:(kv_heads=2,block=32,2*head=64)"``;
    ``weights`` names the weights and config that computed the KV (``kvtier.vllm.model_identity``):
    ``model`` alone is a path or a name, which other weights may have. Where ``weights`` is
    given, ``model`` is only told (``describe``), not digested: the same weights at two paths
    (a Hugging Face name and a local copy, mounts that differ between machines) share chunks.
    """

    model: str
    dtype: str
    layout: str
    tp_rank: int
    tp_size: int
    pp_rank: int
    chunk_tokens: int
    weights: str = ""

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1; got {self.tp_size}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank must be in [0, tp_size={self.tp_size}); got {self.tp_rank}")
        if self.pp_rank < 0:
            raise ValueError(f"pp_rank must be >= 0; got {self.pp_rank}")
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1; got {self.chunk_tokens}")

    def digest(self) -> bytes:
        """16 bytes, stable across processes, runs and machines (sha256 of canonical JSON)."""
        fields = {"version": _FINGERPRINT_VERSION, **asdict(self)}
        if self.weights:
            del fields["model"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canonical.encode("ascii")).digest()[:FINGERPRINT_BYTES]

    def describe(self) -> str:
        """One line for logs and ``kvtier inspect``: every field and the digest in hex."""
        return (
            f"model={self.model} dtype={self.dtype} layout={self.layout} "
            f"tp={self.tp_rank}/{self.tp_size} pp_rank={self.pp_rank} "
            f"chunk_tokens={self.chunk_tokens} weights={self.weights or '-'} "
            f"digest={self.digest().hex()}"
        )


def _block_hash_bytes(block_hash: BlockHash) -> bytes:
    """Type-tagged bytes of a block hash: ints are signed big endian, 8 bytes (16, … if larger)."""
    if isinstance(block_hash, int):
        magnitude = block_hash if block_hash >= 0 else ~block_hash  # ~x == -x - 1
        words = magnitude.bit_length() // 64 + 1  # +1 bit for the sign
        width = 8 * words
        return b"i" + block_hash.to_bytes(width, "big", signed=True)
    return b"b" + bytes(block_hash)


def _salted(salt: bytes) -> bytes:
    """A request's salt as hashed before its block hash: tagged ``s`` (a block hash is ``i`` or
    ``b``), so that no salted key is an unsalted one's; nothing for no salt."""
    if not salt:
        return b""
    if len(salt) != SALT_BYTES:
        raise ValueError(f"a key salt is {SALT_BYTES} bytes; got {len(salt)}")
    return b"s" + salt


def _check_group(group: int) -> None:
    if not 0 <= group <= MAX_GROUP:
        raise ValueError(f"group must be in [0, {MAX_GROUP}]; got {group}")


def make_key(
    fingerprint_digest: bytes, block_hash: BlockHash, group: int, hash_algo: str = "xxh3_128"
) -> ChunkKey:
    """The key of the chunk whose last engine block has ``block_hash``, in group ``group``.

    ``fingerprint_digest`` is ``LayoutFingerprint.digest()``. ValueError on a digest that is not 16
    bytes, a group outside [0, 65535] or an unknown ``hash_algo``.
    """
    return _make_key(fingerprint_digest, block_hash, group, _hash_function(hash_algo))


def _make_key(
    fingerprint_digest: bytes,
    block_hash: BlockHash,
    group: int,
    hasher: Callable[[bytes], bytes],
    salted: bytes = b"",
) -> ChunkKey:
    """``salted``: ``_salted(salt)``, made once per request."""
    if len(fingerprint_digest) != FINGERPRINT_BYTES:
        raise ValueError(
            f"fingerprint_digest must be {FINGERPRINT_BYTES} bytes; got {len(fingerprint_digest)}"
        )
    _check_group(group)
    group_bytes = group.to_bytes(GROUP_BYTES, "big")
    chunk_hash = hasher(fingerprint_digest + salted + _block_hash_bytes(block_hash) + group_bytes)
    return ChunkKey(fingerprint_digest + chunk_hash[:CHUNK_HASH_BYTES] + group_bytes)


def _check_key(key: bytes) -> None:
    if len(key) != KEY_BYTES:
        raise ValueError(f"a chunk key is {KEY_BYTES} bytes; got {len(key)}")


def key_group(key: ChunkKey) -> int:
    """The group index stored in ``key``."""
    _check_key(key)
    return int.from_bytes(key[-GROUP_BYTES:], "big")


def key_fingerprint(key: ChunkKey) -> bytes:
    """The layout fingerprint digest stored in ``key`` (as ``LayoutFingerprint.digest()``)."""
    _check_key(key)
    return bytes(key[:FINGERPRINT_BYTES])


def key_hex(key: ChunkKey) -> str:
    """``"<fingerprint hex>:<chunk hash hex>:g<group>"``, for logs and inspection."""
    _check_key(key)
    chunk_hash = key[FINGERPRINT_BYTES : FINGERPRINT_BYTES + CHUNK_HASH_BYTES]
    return f"{key[:FINGERPRINT_BYTES].hex()}:{chunk_hash.hex()}:g{key_group(key)}"


class ChunkKeyMaker:
    """Turns a request's per-engine-block hashes into chunk keys for one layout.

    Chunk ``i`` covers engine blocks ``[i * factor, (i + 1) * factor)`` and is keyed by the hash of
    its last block. Only full chunks get keys.
    """

    def __init__(
        self, fingerprint: LayoutFingerprint, block_size_factor: int, hash_algo: str = "xxh3_128"
    ) -> None:
        if block_size_factor < 1:
            raise ValueError(f"block_size_factor must be >= 1; got {block_size_factor}")
        self.fingerprint = fingerprint
        self.block_size_factor = block_size_factor
        self.hash_algo = hash_algo
        self._hasher = _hash_function(hash_algo)
        self._digest = fingerprint.digest()

    @property
    def fingerprint_digest(self) -> bytes:
        """``fingerprint.digest()``, computed once."""
        return self._digest

    def rename(self, fingerprint: LayoutFingerprint) -> None:
        """Make the keys ``fingerprint``'s from now on: before the first request (the engine's
        ranks tell their layouts once the maker is built), and at a connector reset (a
        generation of their own). Keys made before stay what they were."""
        self.fingerprint, self._digest = fingerprint, fingerprint.digest()

    def tail_key(
        self, last_block_hash: BlockHash, tail_tokens: Sequence[int], group: int, salt: bytes = b""
    ) -> ChunkKey:
        """The key of a prompt's tail: its blocks after its last full chunk, up to its end.

        Keyed by the chained hash of the prompt's last full engine block (which covers the whole
        prefix, cache salt and adapter included) and the ids of the tokens after it (fewer than a
        block), in a hash domain of its own: a tail never shares a key with a full chunk, nor
        with the tail of another prompt. ``salt`` as ``keys``'.
        """
        _check_group(group)
        data = (
            self._digest
            + b"t"
            + _salted(salt)
            + _block_hash_bytes(last_block_hash)
            + len(tail_tokens).to_bytes(8, "big")
            + np.asarray(tail_tokens, dtype="<i8").tobytes()
            + group.to_bytes(GROUP_BYTES, "big")
        )
        chunk_hash = self._hasher(data)[:CHUNK_HASH_BYTES]
        return ChunkKey(self._digest + chunk_hash + group.to_bytes(GROUP_BYTES, "big"))

    def keys(
        self,
        block_hashes: Sequence[BlockHash],
        group: int,
        start_block: int = 0,
        salt: bytes = b"",
    ) -> list[ChunkKey]:
        """Keys of the full chunks from engine block ``start_block`` on, one per chunk, in order.

        ``block_hashes[j]`` is the chained hash of engine block ``j`` of the request.
        ``start_block`` must be a non-negative multiple of ``block_size_factor`` (ValueError).
        ``salt`` (``SALT_BYTES``, or none) names what else computed the request's KV that its
        block hashes do not (a LoRA adapter's files): other salts, other keys.
        """
        factor = self.block_size_factor
        if start_block < 0 or start_block % factor:
            raise ValueError(
                f"start_block must be a non-negative multiple of block_size_factor={factor}; "
                f"got {start_block}"
            )
        _check_group(group)
        last_blocks = range(start_block + factor - 1, len(block_hashes), factor)
        digest, hasher, salted = self._digest, self._hasher, _salted(salt)
        return [_make_key(digest, block_hashes[j], group, hasher, salted) for j in last_blocks]


def chain_hashes(
    token_ids: Sequence[int] | npt.NDArray[np.integer[Any]],
    block_tokens: int,
    hash_algo: str = "xxh3_128",
    seed: bytes = b"",
) -> list[bytes]:
    """Chained hashes of the full blocks of ``token_ids``: ``h[j] = H(h[j-1] + tokens of block j)``.

    ``h[-1]`` is ``seed``; tokens are hashed as int64 little endian. A trailing partial block gets
    no hash. Digests are 16 bytes (xxh3_128) or 32 bytes (sha256). ValueError on
    ``block_tokens < 1`` or an unknown ``hash_algo``.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1; got {block_tokens}")
    hasher = _hash_function(hash_algo)
    data = np.asarray(token_ids, dtype="<i8").tobytes()
    block_bytes = 8 * block_tokens
    hashes: list[bytes] = []
    parent = seed
    for offset in range(0, len(data) - block_bytes + 1, block_bytes):
        parent = hasher(parent + data[offset : offset + block_bytes])
        hashes.append(parent)
    return hashes
