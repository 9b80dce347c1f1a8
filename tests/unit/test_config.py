"""kvtier's config: sizes, the extra-config keys, and one error per kind of bad input."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.config import KVTierConfig, parse_size
from kvtier.tiers.disk import SPEC as DISK
from kvtier.tiers.disk.config import DiskConfig
from kvtier.tiers.peer import SPEC as PEER
from kvtier.tiers.redis import SPEC as REDIS
from kvtier.tiers.redis.config import RedisConfig

ENGINE_BLOCK = 32
UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


def parse(**extra: object) -> KVTierConfig:
    return KVTierConfig.from_extra_config({"cpu_bytes_to_use": "1GiB", **extra}, ENGINE_BLOCK)


# --- sizes ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GiB", 4 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5GiB", 3 * 2**29),
        ("1.5 GiB", 3 * 2**29),
        ("100 KiB", 100 * 1024),
        ("0.5KiB", 512),
        ("1024", 1024),
        ("0", 0),
        (" 7 B ", 7),
        ("2gib", 2 * 2**30),
        ("2GIB", 2 * 2**30),
        ("3kb", 3000),
        (1024, 1024),
        (0, 0),
    ],
)
def test_parse_size_accepts(text: int | str, expected: int) -> None:
    assert parse_size(text, "x") == expected


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(UNITS)), st.booleans())
def test_parse_size_every_unit_any_case(number: int, unit: str, spaced: bool) -> None:
    text = f"{number}{' ' if spaced else ''}{unit}"
    assert parse_size(text, "x") == number * UNITS[unit]
    assert parse_size(text.lower(), "x") == number * UNITS[unit]
    assert parse_size(text.upper(), "x") == number * UNITS[unit]


@pytest.mark.parametrize(
    "bad",
    ["", "GiB", "4 gigs", "2G", "4GiBs", "1e9", "1,024", "1.5B", "4 Gi B", "-1", "-4GiB", -1, True],
)
def test_parse_size_rejects(bad: int | str) -> None:
    with pytest.raises(ValueError, match=r"^kvtier: 'disk\.bytes'"):
        parse_size(bad, "disk.bytes")


def test_parse_size_error_lists_accepted_forms() -> None:
    with pytest.raises(ValueError, match=r"'4 gigs'.*KiB, MiB, GiB, TiB"):
        parse_size("4 gigs", "cpu_bytes_to_use")


def test_bare_prefix_unit_is_refused_as_ambiguous() -> None:
    with pytest.raises(ValueError, match=r"ambiguous unit 'G' in '2G': write 2GB .* or 2GiB"):
        parse_size("2G", "cpu_bytes_to_use")


def test_negative_size_says_negative() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_size(-5, "cpu_bytes_to_use")


# --- valid configs ---


def test_defaults_when_only_cpu_bytes_given() -> None:
    config = KVTierConfig.from_extra_config({"cpu_bytes_to_use": 4096}, ENGINE_BLOCK)
    assert config == KVTierConfig(cpu_bytes_to_use=4096)
    assert config.block_size is None
    assert config.block_size_factor(ENGINE_BLOCK) == 1
    assert config.eviction_policy == "lru"
    assert config.store_threshold == 1
    assert config.hash_algo == "xxh3_128"
    assert config.shutdown_flush_s == 4.0
    assert config.min_async_load_tokens is None  # the measured costs decide (hit_benefit.py)
    assert config.section(DISK) is None
    assert config.section(REDIS) is None


def test_full_config() -> None:
    extra: dict[str, object] = {
        "cpu_bytes_to_use": "4GiB",
        "block_size": 128,
        "eviction_policy": "arc",
        "store_threshold": 2,
        "hash_algo": "sha256",
        "shutdown_flush_s": 0,
        "disk": {"path": "/var/cache/kvtier", "bytes": "100GiB", "write_through": True},
        "redis": {"url": "redis://127.0.0.1:6379/0", "timeout_s": 0.25},
    }
    config = KVTierConfig.from_extra_config(extra, ENGINE_BLOCK)
    assert config == KVTierConfig(
        cpu_bytes_to_use=4 * 2**30,
        block_size=128,
        eviction_policy="arc",
        store_threshold=2,
        hash_algo="sha256",
        shutdown_flush_s=0.0,
        sections={
            "disk": DiskConfig(path="/var/cache/kvtier", bytes=100 * 2**30, write_through=True),
            "redis": RedisConfig(url="redis://127.0.0.1:6379/0", timeout_s=0.25),
        },
    )
    assert config.block_size_factor(ENGINE_BLOCK) == 4
    assert config.block_size_factor(16) == 8


def test_optional_keys_set_to_none_are_defaults() -> None:
    config = parse(block_size=None, disk=None, redis=None, eviction_policy=None)
    assert config == KVTierConfig(cpu_bytes_to_use=2**30)


def test_nested_defaults() -> None:
    config = parse(disk={"path": "/tmp/kv", "bytes": 1000}, redis={"url": "unix:///run/r.sock"})
    assert config.section(DISK) == DiskConfig(path="/tmp/kv", bytes=1000, write_through=False)
    assert config.section(REDIS) == RedisConfig(url="unix:///run/r.sock", timeout_s=1.0)
    assert config.section(DISK).readers is None  # the worker picks it from its CPUs
    disk = parse(disk={"path": "/tmp/kv", "bytes": 1000, "readers": 3}).section(DISK)
    assert disk.readers == 3


def test_a_redis_cluster_and_its_settings() -> None:
    redis = {
        "url": "rediss://:pw@a:7000", "cluster": True, "seeds": ["rediss://b:7000"],
        "prefix": "fleet", "ttl_s": 3600, "connections": 4, "max_queued_chunks": 64,
        "password_env": "FLEET_REDIS_PASSWORD", "required": False, "tls_ca": "/etc/ca.pem",
    }  # fmt: skip
    config = parse(redis=redis)
    assert config.section(REDIS) == RedisConfig(
        url="rediss://:pw@a:7000", cluster=True, seeds=("rediss://b:7000",), prefix="fleet",
        ttl_s=3600.0, connections=4, max_queued_chunks=64, password_env="FLEET_REDIS_PASSWORD",
        required=False, tls_ca="/etc/ca.pem",
    )  # fmt: skip
    section = config.section(REDIS)
    assert section is not None and section.urls == ("rediss://:pw@a:7000", "rediss://b:7000")


def test_block_size_equal_to_engine_block() -> None:
    assert parse(block_size=ENGINE_BLOCK).block_size_factor(ENGINE_BLOCK) == 1


def test_configs_are_frozen() -> None:
    config = parse(disk={"path": "/tmp/kv", "bytes": 1000}, redis={"url": "redis://h"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.cpu_bytes_to_use = 1  # type: ignore[misc]
    disk, redis = config.section(DISK), config.section(REDIS)
    assert disk is not None and redis is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        disk.path = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        redis.url = "redis://other"  # type: ignore[misc]


# --- bad input: a ValueError that starts with "kvtier: " and names the key ---


# each entry: keys added to {"cpu_bytes_to_use": "1GiB"}, and a regex the error must match
BAD_EXTRA: list[tuple[dict[str, object], str]] = [
    ({"cpu_bytes": 1}, r"unknown key 'cpu_bytes'.*cpu_bytes_to_use"),
    ({"eviction": "lru"}, r"did you mean 'eviction_policy'"),
    ({"disk": {"path": "/d", "bytes": 1, "pth": "/"}}, r"'disk\.pth'"),
    ({"redis": {"url": "redis://h", "timeout": 1}}, r"'redis\.timeout'"),
    ({"cpu_bytes_to_use": None}, r"'cpu_bytes_to_use' is required"),
    ({"cpu_bytes_to_use": "4 gigs"}, r"'cpu_bytes_to_use'.*'4 gigs'"),
    ({"cpu_bytes_to_use": "-4GiB"}, r"'cpu_bytes_to_use' must not be negative"),
    ({"cpu_bytes_to_use": -1}, r"'cpu_bytes_to_use' must not be negative"),
    ({"cpu_bytes_to_use": 0}, r"'cpu_bytes_to_use' must be more than 0"),
    ({"cpu_bytes_to_use": "0GiB"}, r"'cpu_bytes_to_use' must be more than 0"),
    ({"cpu_bytes_to_use": 4.0e9}, r"'cpu_bytes_to_use'"),
    ({"cpu_bytes_to_use": True}, r"'cpu_bytes_to_use'"),
    ({"block_size": 48}, r"'block_size'.*engine block size 32, got 48"),
    ({"block_size": 16}, r"'block_size'.*engine block size 32, got 16"),
    ({"block_size": 0}, r"'block_size'.*got 0"),
    ({"block_size": -64}, r"'block_size'.*got -64"),
    ({"block_size": True}, r"'block_size'.*got True"),
    ({"block_size": "64"}, r"'block_size'.*got '64'"),
    ({"block_size": 64.0}, r"'block_size'"),
    ({"eviction_policy": "fifo"}, r"'eviction_policy'.*lru, arc"),
    ({"eviction_policy": 3}, r"'eviction_policy'"),
    ({"hash_algo": "md5"}, r"'hash_algo'.*sha256, xxh3_128"),
    ({"shutdown_flush_s": -1}, r"'shutdown_flush_s' must be a number >= 0, got -1"),
    ({"shutdown_flush_s": "5s"}, r"'shutdown_flush_s'"),
    ({"store_threshold": 0}, r"'store_threshold'"),
    ({"store_threshold": "2"}, r"'store_threshold'"),
    ({"min_async_load_tokens": 0}, r"'min_async_load_tokens' must be a positive integer"),
    ({"min_async_load_tokens": "256"}, r"'min_async_load_tokens'"),
    ({"disk": {"bytes": "1GiB"}}, r"'disk\.path' is required"),
    ({"disk": {"path": "", "bytes": 1}}, r"'disk\.path'"),
    ({"disk": {"path": "/d"}}, r"'disk\.bytes' is required"),
    ({"disk": {"path": "/d", "bytes": 0}}, r"'disk\.bytes'"),
    ({"disk": {"path": "/d", "bytes": "1 parsec"}}, r"'disk\.bytes'"),
    ({"disk": {"path": "/d", "bytes": 1, "write_through": "yes"}}, r"'disk\.write_through'"),
    ({"disk": {"path": "/d", "bytes": 1, "readers": 0}}, r"'disk\.readers'"),
    ({"disk": {"path": "/d", "bytes": 1, "readers": "4"}}, r"'disk\.readers'"),
    ({"disk": "/var/cache"}, r"'disk' must be a mapping"),
    ({"redis": {}}, r"'redis\.url' is required"),
    ({"redis": {"url": "http://h:6379"}}, r"'redis\.url'.*redis://"),
    ({"redis": {"url": "127.0.0.1:6379"}}, r"'redis\.url'"),
    ({"redis": {"url": "redis://h", "timeout_s": 0}}, r"'redis\.timeout_s'"),
    ({"redis": {"url": "redis://h", "prefix": ""}}, r"'redis\.prefix'"),
    ({"redis": {"url": "redis://h", "ttl_s": -1}}, r"'redis\.ttl_s'"),
    ({"redis": {"url": "redis://h", "cluster": "yes"}}, r"'redis\.cluster'"),
    ({"redis": {"url": "redis://h", "seeds": "redis://b"}}, r"'redis\.seeds'.*list"),
    ({"redis": {"url": "redis://h", "seeds": ["redis://b"]}}, r"'redis\.seeds'.*cluster"),
    ({"redis": {"url": "redis://h", "cluster": True, "seeds": ["b:1"]}}, r"'redis\.seeds'"),
    ({"redis": {"url": "unix:///r.sock", "cluster": True}}, r"'redis\.url'.*Cluster"),
    ({"redis": {"url": "redis://h", "connections": 0}}, r"'redis\.connections'"),
    ({"redis": {"url": "redis://h", "max_queued_chunks": 0}}, r"'redis\.max_queued_chunks'"),
    ({"redis": {"url": "redis://h", "required": 1}}, r"'redis\.required'"),
    ({"transfer": {"port": 70000}}, r"'transfer\.port'.*70000"),
    ({"transfer": {"port": -1}}, r"'transfer\.port'"),
    ({"transfer": {"secret": ""}}, r"'transfer\.secret'"),
    ({"transfer": {"timeout_s": 0}}, r"'transfer\.timeout_s'"),
    ({"transfer": {"hold_s": -1}}, r"'transfer\.hold_s'"),
    ({"transfer": {"connections": 0}}, r"'transfer\.connections'"),
    ({"transfer": {"load_failure_policy": "retry"}}, r"'transfer\.load_failure_policy'.*fail"),
    ({"transfer": {"secrets": "s"}}, r"did you mean 'transfer\.secret'"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_EXTRA)
def test_bad_extra_config_names_the_key(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=r"^kvtier: ") as error:
        parse(**extra)
    assert re.search(message, str(error.value)), str(error.value)


@pytest.mark.parametrize("extra", [None, {}, {"block_size": 64}])
def test_cpu_bytes_to_use_is_required(extra: dict[str, object] | None) -> None:
    with pytest.raises(ValueError, match="^kvtier: 'cpu_bytes_to_use' is required"):
        KVTierConfig.from_extra_config(extra, ENGINE_BLOCK)


def test_unknown_key_lists_accepted_keys() -> None:
    with pytest.raises(ValueError, match=r"accepted keys: .*cpu_bytes_to_use.*hash_algo"):
        parse(cpu_budget="1GiB")
    with pytest.raises(ValueError, match=r"accepted keys: disk\.path, disk\.bytes"):
        parse(disk={"path": "/d", "bytes": 1, "size": 1})


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ValueError, match="'cpu_bytes_to_use'"):
        KVTierConfig(cpu_bytes_to_use=0)
    with pytest.raises(ValueError, match="'eviction_policy'"):
        KVTierConfig(cpu_bytes_to_use=1, eviction_policy="mru")
    with pytest.raises(ValueError, match=r"'disk\.bytes'"):
        DiskConfig(path="/d", bytes=-1)
    with pytest.raises(ValueError, match=r"'redis\.url'"):
        RedisConfig(url="localhost")


def test_block_size_factor_checks_the_engine_block_size() -> None:
    config = KVTierConfig(cpu_bytes_to_use=1, block_size=64)
    with pytest.raises(ValueError, match="engine block size 48, got 64"):
        config.block_size_factor(48)


def test_the_transfer_secret_comes_from_the_config_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KVTIER_TRANSFER_SECRET", raising=False)
    config = KVTierConfig.from_extra_config({"cpu_bytes_to_use": 1, "transfer": {}}, 16)
    transfer = config.section(PEER)
    assert transfer is not None and transfer.host == "127.0.0.1" and transfer.port == 0
    with pytest.raises(ValueError, match=r"'transfer\.secret'.*KVTIER_TRANSFER_SECRET"):
        transfer.secret_bytes()
    monkeypatch.setenv("KVTIER_TRANSFER_SECRET", "short")
    with pytest.raises(ValueError, match=r"at least 16 bytes, got 5"):
        transfer.secret_bytes()
    monkeypatch.setenv("KVTIER_TRANSFER_SECRET", "from-the-environment")
    assert transfer.secret_bytes() == b"from-the-environment"
    secret = "from-the-config-file"
    given = {"cpu_bytes_to_use": 1, "transfer": {"secret": secret, "advertise_host": "10.0.0.2"}}
    transfer = KVTierConfig.from_extra_config(given, 16).section(PEER)
    assert transfer is not None and transfer.secret_bytes() == secret.encode()
    assert transfer.reach_host == "10.0.0.2"
