"""Starts ``disk_job.py`` engine processes by forking one that has imported vLLM already.

    python tests/engine/job_forker.py     (started by disk_helpers.py, one per pytest process)

Importing vLLM, torch and kvtier takes ~10-25 s of a job process's life on this machine; the
engine and its prompts take less. This process imports them once (``disk_job``'s imports), never
starts an engine, and forks a child per job: each job is still a new process with a new engine,
nothing in memory from any other job, and exits as ``python disk_job.py JOB OUT`` would (its own
stdout and stderr in its log, the interpreter's normal exit and its atexit hooks).

One JSON line per job on stdin: {"job": path, "out": path, "log": path, "cwd": path, "env":
{...}}. Stdout answers {"pid": n} once forked, and {"pid": n, "code": exit status} when it ended
(a signal's number negated, as ``subprocess`` does). EOF on stdin: it waits for its children and
exits.
"""

from __future__ import annotations

import json
import os
import select
import sys
from typing import Any

import disk_job  # noqa: F401  (the imports every job would make: vLLM, torch, kvtier)

from kvtier.apps.engine_heap import freeze_survivors  # noqa: E402

freeze_survivors()  # the imports, frozen: no child's collections scan (or touch) them


def _answer(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _reap(block: bool) -> None:
    """Report every child that ended (``block``: wait for all of them)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer({"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _serve() -> dict[str, Any] | None:
    """Fork a child per request; in the child, return its request (None: stdin closed)."""
    pending = b""
    stdin = sys.stdin.fileno()
    while True:
        # a bounded wait on stdin, so ended children are reported while no request comes
        readable, _, _ = select.select([stdin], [], [], 0.1)
        _reap(block=False)
        if not readable:
            continue
        data = os.read(stdin, 1 << 16)
        if not data:
            _reap(block=True)
            return None
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return dict(request)
            _answer({"pid": pid})


def _run(request: dict[str, Any]) -> None:
    """In the child: become the job's process, then run it as the script would."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.environ.clear()
    os.environ.update(request["env"])
    for name, value in disk_job.ENV_DEFAULTS.items():  # what the script sets as it starts
        os.environ.setdefault(name, value)
    os.chdir(request["cwd"])
    sys.argv = [disk_job.__file__, request["job"], request["out"]]
    disk_job.main(request["job"], request["out"])


if __name__ == "__main__":
    job = _serve()
    if job is not None:
        _run(job)
