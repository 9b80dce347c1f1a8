"""``kvtier proxy``'s settings: engine URLs normalized, bad ones refused by name (no server)."""

from __future__ import annotations

import argparse

import pytest

from kvtier.apps.proxy import ProxyConfig
from kvtier.apps.proxy.cli import add_arguments, run
from kvtier.apps.proxy.engine_url import rank_headers, split


def test_urls_are_normalized() -> None:
    config = ProxyConfig(("127.0.0.1:8100", "http://h:8101/"), ("https://d:8200",))
    assert config.prefill == ("http://127.0.0.1:8100", "http://h:8101")
    assert config.decode == ("https://d:8200",)


def test_each_engine_of_a_data_parallel_server_may_be_named_by_its_rank() -> None:
    config = ProxyConfig(("h:8100#dp0", "http://h:8100#dp1", "h:8100"), ("d:8200#dp12",))
    assert config.prefill == ("http://h:8100#dp0", "http://h:8100#dp1", "http://h:8100")
    assert [split(url) for url in config.prefill] == [
        ("http://h:8100", 0), ("http://h:8100", 1), ("http://h:8100", None)
    ]  # fmt: skip
    assert rank_headers(config.decode[0]) == {"X-data-parallel-rank": "12"}
    assert rank_headers(config.prefill[2]) == {}


@pytest.mark.parametrize(
    ("prefill", "decode", "limits", "message"),
    [
        ((), ("d:1",), {}, "prefill: give at least one engine URL"),
        (("p:1",), ("http://d:1/v1",), {}, "decode: 'http://d:1/v1' has a path"),
        (("p:1", "http://p:1"), ("d:1",), {}, "prefill: http://p:1 is given twice"),
        (("ftp://p:1",), ("d:1",), {}, "prefill: 'ftp://p:1' is not an http"),
        (("p:x",), ("d:1",), {}, "prefill: 'p:x' has a bad port"),
        (("p:1#x",), ("d:1",), {}, r"prefill: 'p:1#x': after '#' only the rank .*#dp1"),
        (("p:1#dp01",), ("d:1",), {}, "prefill: 'p:1#dp01': after '#' only the rank"),
        (("p:1#dp1", "http://p:1#dp1"), ("d:1",), {}, "prefill: http://p:1#dp1 is given twice"),
        (("p:1",), ("d:1",), {"timeout_s": 0}, "timeout_s must be > 0"),
        (("p:1",), ("d:1",), {"backoff_s": -1.0}, "backoff_s must be > 0"),
        (("p:1",), ("d:1",), {"prefill_timeout_s": 0}, "prefill_timeout_s must be > 0"),
        (("p:1",), ("d:1",), {"health_interval_s": 0}, "health_interval_s must be > 0"),
    ],
)
def test_a_bad_setting_is_refused_by_name(
    prefill: tuple[str, ...], decode: tuple[str, ...], limits: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ProxyConfig(prefill, decode, **limits)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_engines_are_listed_or_repeated() -> None:
    args = _parse(["--prefill", "p:1", "p:2", "--decode", "d:1", "--decode", "d:2"])
    assert (args.prefill, args.decode) == (["p:1", "p:2"], ["d:1", "d:2"])
    assert (args.host, args.port, args.timeout_s) == ("127.0.0.1", 8000, 300.0)
    assert (args.prefill_timeout_s, args.health_interval_s) == (60.0, 2.0)


def test_run_refuses_a_bad_url_before_serving(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_parse(["--prefill", "p:1", "--decode", "http://d:1/v1"])) == 2
    assert "kvtier proxy: decode: 'http://d:1/v1' has a path" in capsys.readouterr().err
