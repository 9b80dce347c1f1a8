"""Redis URLs as connection settings: schemes, credentials, the password from the environment,
and errors that name the setting without ever showing a password."""

from __future__ import annotations

import pytest

from kvtier.tiers.redis.url import RedisAddress, masked, parse_url


def test_a_plain_url() -> None:
    assert parse_url("redis://cache.local:6380/2") == RedisAddress("cache.local", 6380, db=2)
    assert parse_url("redis://10.0.0.1") == RedisAddress("10.0.0.1", 6379, db=0)


def test_credentials_and_tls() -> None:
    address = parse_url("rediss://kv:s%40cret@cache:6390/0")
    assert (address.tls, address.username, address.password) == (True, "kv", "s@cret")
    assert address.describe() == "rediss://cache:6390/0"  # no credentials


def test_a_unix_socket() -> None:
    address = parse_url("unix://:pw@/run/redis/redis.sock?db=3")
    assert (address.path, address.password, address.db) == ("/run/redis/redis.sock", "pw", 3)
    assert address.node == ("/run/redis/redis.sock", 0)


def test_a_password_absent_from_the_url_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_REDIS_PASSWORD", "from-env")
    assert parse_url("redis://h/0", password_env="MY_REDIS_PASSWORD").password == "from-env"
    assert parse_url("redis://:in-url@h/0", password_env="MY_REDIS_PASSWORD").password == "in-url"
    assert parse_url("redis://h/0", password_env="UNSET_VARIABLE_X").password is None


def test_a_password_is_never_shown() -> None:
    address = parse_url("redis://u:hunter2@h:1/0")
    assert "hunter2" not in repr(address) and "hunter2" not in address.describe()
    assert masked("redis://u:hunter2@h:1/0") == "redis://u:***@h:1/0"
    with pytest.raises(ValueError, match=r"'redis\.url'.*database") as raised:
        parse_url("redis://u:hunter2@h:1/zero")
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h:6379", "must start with"),
        ("redis://:pw@h:notaport/0", "Port"),
        ("redis://h:99999/0", "out of range"),
        ("redis:///0", "names no host"),
        ("redis://h/one", "database must be a number"),
        ("unix://", "no socket path"),
        ("unix://host/run/redis.sock", "has no host"),
        ("unix:///run/redis.sock?db=x", "database must be a number"),
    ],
)
def test_a_bad_url_names_the_setting_and_the_bad_part(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as raised:
        parse_url(url, "redis.seeds")
    assert str(raised.value).startswith("kvtier: 'redis.seeds'")
    assert "pw" not in str(raised.value).replace("://", "")
