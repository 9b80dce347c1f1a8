"""Engines side by side: each vLLM engine in a child process of its own, driven by commands.

vLLM keeps one worker-side KV connector per process (``ensure_kv_transfer_initialized``), so an
engine with kvtier and one without cannot live in one process. Each child runs one in-process
engine (``engine.EngineHost``, in the environment ``env``) and answers one command at a time;
an engine works only while it answers, so engines alive together do not disturb each other's
timings, and the requests a bench sends them interleave. Timings are taken inside the child, around
``LLM.generate``: the pipe is not timed.

    EngineProcess(name, engine_args, env)   start a child (spawn) building its engine
    .wait_ready()                           block until the engine is built (or raise)
    .call(command, *args)                   run one command, return its result (or raise)
    .ttft(prompt), .settle(), .reset_prefix_cache(), .kvtier_stats(), .serve(prompts, n),
    .cpu_seconds(), .connector_seconds()    the commands, as ``EngineHost`` has them
    .close()                                stop the child
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
import warnings
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.apps.bench.ttft.timing import Sample, Served
    from kvtier.counters import KVTierStats

CALL_TIMEOUT_S = 1800.0  # one command (a batch, an engine start) on a slow machine
STOP_TIMEOUT_S = 60.0


class EngineProcess:
    """One engine in a child process. Not thread-safe: one caller, one command at a time."""

    def __init__(self, name: str, engine_args: dict[str, Any], env: dict[str, str]) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked vLLM
        self.name = name
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, engine_args, env), name=f"kvtier-bench-{name}"
        )
        self._process.start()
        child.close()
        self._ready = False

    def wait_ready(self) -> None:
        """Block until the child built its engine; ``RuntimeError`` with its traceback if not."""
        if not self._ready:
            self._receive("start")
            self._ready = True

    def call(self, command: str, *args: Any) -> Any:
        """Run ``command`` (an ``EngineHost.commands()`` name) in the child, return its result.
        ``RuntimeError`` carrying the child's traceback when it raised or died."""
        self.wait_ready()
        self._conn.send((command, args))
        return self._receive(command)

    def ttft(self, prompt: list[int]) -> Sample:
        sample: Sample = self.call("ttft", prompt)
        return sample

    def settle(self) -> None:
        self.call("settle")

    def reset_prefix_cache(self) -> None:
        self.call("reset_prefix_cache")

    def kvtier_stats(self) -> KVTierStats:
        stats: KVTierStats = self.call("kvtier_stats")
        return stats

    def serve(self, prompts: list[list[int]], max_tokens: int) -> Served:
        served: Served = self.call("serve", prompts, max_tokens)
        return served

    def cpu_seconds(self) -> float:
        return float(self.call("cpu_seconds"))

    def connector_seconds(self) -> float:
        return float(self.call("connector_seconds"))

    def close(self) -> None:
        """Stop the child (it tears its engine down by exiting); kill it if it does not stop."""
        if self._process.is_alive():
            try:
                self._conn.send(("stop", ()))
            except (BrokenPipeError, OSError):
                pass
            self._process.join(STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._conn.close()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _receive(self, command: str) -> Any:
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not self._conn.poll(1.0):
            if not self._process.is_alive():
                raise RuntimeError(
                    f"kvtier bench: the {self.name} engine process died during {command!r} "
                    f"(exit code {self._process.exitcode})"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvtier bench: the {self.name} engine timed out: {command!r}")
        status, result = self._conn.recv()
        if status == "error":
            raise RuntimeError(
                f"kvtier bench: the {self.name} engine failed {command!r}:\n{result}"
            )
        return result


def _serve(conn: Connection, engine_args: dict[str, Any], env: dict[str, str]) -> None:
    """The child: build the engine, then answer ``(command, args)`` until ``stop``."""
    os.environ.update(env)  # before vLLM is imported
    warnings.filterwarnings("ignore", ".*torch.distributed.reduce_op", FutureWarning)
    try:
        from kvtier.apps.engine_heap import frozen_imports

        with frozen_imports():  # vLLM's, once in this fresh interpreter
            import vllm.entrypoints.llm  # noqa: F401  (most of what an LLM imports)

            from kvtier.apps.bench.ttft.engine import EngineHost
        commands = EngineHost.of(engine_args).commands()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    while True:
        try:
            command, args = conn.recv()
        except EOFError:  # the parent went away
            return
        if command == "stop":
            return
        try:
            conn.send(("ok", commands[command](*args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))
