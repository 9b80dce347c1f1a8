"""``kvtier serve``'s arguments for ``vllm serve`` (no server started)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from kvtier.apps.serve import data_parallel_size, split_kvtier_option, vllm_serve_args

SOCKETS = Path("/tmp/kvtier-sockets")  # named only: nothing is created
_serve_args = partial(vllm_serve_args, sockets=SOCKETS)


def _transfer(args: list[str]) -> dict[str, object]:
    config: dict[str, object] = json.loads(args[args.index("--kv-transfer-config") + 1])
    return config


def test_defaults_load_kvtier_on_localhost() -> None:
    args = _serve_args("m", ["--port", "9"], None, cpu_only=False)
    assert args[:3] == ["m", "--port", "9"]
    assert _transfer(args) == {
        "kv_connector": "KVTierConnector",
        "kv_connector_module_path": "kvtier.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": "1GiB"},
    }
    assert args[args.index("--host") + 1] == "127.0.0.1"
    assert "--gpu-memory-utilization" not in args


def test_kvtier_json_goes_over_the_defaults() -> None:
    disk = {"path": "/var/cache/kvtier", "bytes": "10GiB"}
    args = _serve_args("m", [], json.dumps({"disk": disk, "block_size": 64}), cpu_only=False)
    extra = _transfer(args)["kv_connector_extra_config"]
    assert extra == {"cpu_bytes_to_use": "1GiB", "disk": disk, "block_size": 64}


def test_what_the_user_gives_wins() -> None:
    given = ["--host=0.0.0.0", "--gpu_memory_utilization", "0.2"]
    args = _serve_args("m", given, None, cpu_only=True)
    assert args.count("--host") == 0 and "--gpu-memory-utilization" not in args
    assert _serve_args("m", [], None, cpu_only=True)[-2:] == ["--gpu-memory-utilization", "0.5"]
    own = ["--kv-transfer-config", '{"kv_connector": "ExampleConnector"}']
    assert _serve_args("m", own, None, cpu_only=False)[1:3] == own
    assert _serve_args("m", own, None, cpu_only=False).count("--kv-transfer-config") == 1


@pytest.mark.parametrize(
    ("kvtier_json", "message"),
    [
        ("{not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"cpu_bytes": 1}', "unknown key 'cpu_bytes'"),
        ('{"disk": {"path": "/d"}}', "disk.bytes"),
    ],
)
def test_a_bad_kvtier_config_fails_before_vllm_starts(kvtier_json: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _serve_args("m", [], kvtier_json, cpu_only=False)


def test_kvtier_and_an_own_transfer_config_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="exclude"):
        _serve_args("m", ["--kv-transfer-config", "{}"], "{}", cpu_only=False)


def test_the_kvtier_option_is_found_anywhere() -> None:
    assert split_kvtier_option(["--port", "1", "--kvtier", "{}", "-x"]) == (
        "{}",
        ["--port", "1", "-x"],
    )
    assert split_kvtier_option(['--kvtier={"a": 1}']) == ('{"a": 1}', [])
    assert split_kvtier_option(["--port", "1"]) == (None, ["--port", "1"])
    with pytest.raises(ValueError, match="needs"):
        split_kvtier_option(["--kvtier"])


def test_kv_role_goes_to_the_transfer_config_and_needs_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KVTIER_TRANSFER_SECRET", raising=False)
    with pytest.raises(ValueError, match="transfer.secret"):
        _serve_args("m", [], None, cpu_only=False, kv_role="kv_producer")
    extra = '{"transfer": {"secret": "a-secret-of-some-length"}}'
    args = _serve_args("m", [], extra, False, kv_role="kv_consumer")
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config["kv_role"] == "kv_consumer"
    monkeypatch.setenv("KVTIER_TRANSFER_SECRET", "from-the-environment")
    args = _serve_args("m", [], None, cpu_only=False, kv_role="kv_producer")
    assert json.loads(args[args.index("--kv-transfer-config") + 1])["kv_role"] == "kv_producer"
    with pytest.raises(ValueError, match="kv-role must be one of"):
        _serve_args("m", [], None, cpu_only=False, kv_role="kv_prefill")
    with pytest.raises(ValueError, match="exclude"):
        _serve_args("m", ["--kv-transfer-config", "{}"], None, False, kv_role="kv_producer")
    assert split_kvtier_option(["--kv-role", "kv_consumer", "-x"], "--kv-role") == (
        "kv_consumer",
        ["-x"],
    )


def test_kv_events_are_published_where_the_server_listens_unless_given() -> None:
    def events(args: list[str]) -> dict[str, object]:
        config: dict[str, object] = json.loads(args[args.index("--kv-events-config") + 1])
        return config

    local = events(_serve_args("m", [], None, cpu_only=False))
    assert local["enable_kv_cache_events"] is True and local["publisher"] == "zmq"
    # this machine only: a Unix socket, no port to take
    assert local["endpoint"] == f"ipc://{SOCKETS}/inproc-kv-events"
    assert local["replay_endpoint"] == f"ipc://{SOCKETS}/inproc-kv-events-replay"
    everywhere = events(_serve_args("m", ["--host", "0.0.0.0"], None, cpu_only=False))
    assert str(everywhere["endpoint"]).startswith("tcp://*:")
    assert str(everywhere["replay_endpoint"]).startswith("tcp://*:")
    own = ["--kv-events-config", '{"enable_kv_cache_events": false}']
    assert _serve_args("m", own, None, cpu_only=False).count("--kv-events-config") == 1


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_each_data_parallel_engine_publishes_its_events_on_sockets_of_its_own(host: str) -> None:
    # vLLM offsets the endpoints by the engine's data-parallel rank: a TCP port by the rank, an
    # endpoint naming "inproc" by a suffix; any other Unix socket it refuses past rank 0
    from vllm.distributed.kv_events import ZmqEventPublisher

    args = _serve_args("m", ["--host", host, "--data-parallel-size", "3"], None, cpu_only=False)
    config = json.loads(args[args.index("--kv-events-config") + 1])
    sockets = {
        ZmqEventPublisher.offset_endpoint_port(config[key], rank)
        for key in ("endpoint", "replay_endpoint")
        for rank in range(3)
    }
    assert len(sockets) == 6
    if host == "0.0.0.0":  # six ports in a row, free when picked
        ports = sorted(int(str(s).rsplit(":", 1)[1]) for s in sockets)
        assert ports == list(range(ports[0], ports[0] + 6))


@pytest.mark.parametrize(
    ("args", "size"),
    [([], 1), (["--data-parallel-size", "4"], 4), (["-dp", "2"], 2),
     (["--data-parallel-size=3"], 3)],
)  # fmt: skip
def test_the_data_parallel_size_is_read_as_vllm_takes_it(args: list[str], size: int) -> None:
    assert data_parallel_size(args) == size


def test_a_bad_data_parallel_size_is_refused_named() -> None:
    with pytest.raises(ValueError, match=r"--data-parallel-size.*'two'"):
        _serve_args("m", ["--data-parallel-size", "two"], None, cpu_only=False)
