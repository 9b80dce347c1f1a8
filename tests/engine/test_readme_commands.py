"""Every command the README shows runs as shown, from a user's fresh shell (the environment's
``bin`` on PATH, HOME, nothing else): each in its shortest form (a small run, or ``--help``
where nothing shorter exists), failing on a non-zero status or a traceback.

The commands are read from the README itself (its ``bash`` blocks and its table of benchmarks),
so a command added there without a shortest form here fails ``test_every_command_has_a_form``.
Where a command's run is long, its shortest run from a fresh shell is another test's, named in
``ELSEWHERE``, and this one checks that it still parses its arguments (``--help``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # the environment's kvtier, as an activated venv has it

Form = Callable[[str, Path], list[str]]  # (the command as shown, a scratch dir) -> what runs


def _help(command: str, tmp: Path) -> list[str]:
    return [*shlex.split(command), "--help"]


def _with(*extra: str) -> Form:
    return lambda command, tmp: [*shlex.split(command), *extra, "--out", str(tmp)]


def _make_n(command: str, tmp: Path) -> list[str]:
    return ["make", "-n", *shlex.split(command)[1:]]


FORMS: dict[str, Form | str] = {  # the command's first words -> its shortest form, or why not run
    "make demo": lambda command, tmp: [
        *shlex.split(command),
        f"DEMO_ARGS=--users 1 --rounds 2 --out {tmp}",
    ],
    "make test": _make_n,  # this suite is that run
    "make test-gpu": _make_n,  # needs a GPU (tests/gpu)
    "pip install": "installs into the environment: every fresh clone's `make venv` runs it",
    "curl": "asks the servers started above: tests/engine/test_pd.py serves it",
    "export KVTIER_TRANSFER_SECRET": lambda command, tmp: [
        "bash",
        "-c",
        f"{command} && test ${{#KVTIER_TRANSFER_SECRET}} = 32",
    ],
    "kvtier serve": _help,  # the --kvtier JSON is checked before vLLM prints its help
    "kvtier proxy": _help,
    "kvtier bench copy": _with("--tokens", "256", "--rounds", "1", "--device", "cpu"),
    "kvtier bench scheduler": _with("--running", "32", "--steps", "20", "--warmup", "2"),
    "kvtier bench transfer": _help,
    "kvtier bench ttft": _help,
    "kvtier bench disk": _help,
    "kvtier bench redis": _help,
    "kvtier bench concurrency": _help,
    "kvtier bench faults": _help,
    "kvtier bench fleet --no-real": _with("--engines", "2"),
    "kvtier bench fleet": _help,
    "kvtier bench chaos": _help,
}
ELSEWHERE = {  # a bench run as --help here -> the test that runs it short from a fresh shell
    "kvtier bench transfer": "tests/engine/test_bench_transfer.py",
    "kvtier bench ttft": "tests/engine/test_bench_ttft.py",
    "kvtier bench disk": "tests/engine/test_bench_disk.py",
    "kvtier bench redis": "tests/engine/test_bench_redis_ttft.py",
    "kvtier bench concurrency": "tests/engine/test_bench_concurrency.py",
    "kvtier bench faults": "tests/engine/test_bench_faults.py",
    "kvtier bench fleet": "tests/unit/test_bench_suite.py",
    "kvtier bench chaos": "tests/engine/test_bench_chaos.py",
}


def readme_commands() -> list[str]:
    """Each command of the README's ``bash`` blocks (continued lines joined, comments and a
    trailing ``&`` dropped), then each command of its benchmark table's first column."""
    return list(_readme_commands())


def _readme_commands() -> dict[str, list[str]]:
    """The README's commands, each with the ``export`` lines shown before it in its block (a
    user's shell has them set when it runs the command)."""
    text = README.read_text()
    commands: dict[str, list[str]] = {}
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        exports: list[str] = []
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip().removesuffix("&").strip()
            if line and line not in commands:
                commands[line] = list(exports)
            if line.startswith("export "):
                exports.append(line)
    for command in re.findall(r"^\| `((?:kvtier|make) [^`]*)`", text, re.M):
        commands.setdefault(command, [])
    return commands


def _form(command: str) -> Form | str | None:
    words = command.replace("=", " ").split()
    for size in range(len(words), 0, -1):
        found = FORMS.get(" ".join(words[:size]))
        if found is not None:
            return found
    return None


def test_every_command_has_a_form() -> None:
    commands = readme_commands()
    assert len(commands) >= 15, commands  # the README's blocks and table were found
    assert [c for c in commands if _form(c) is None] == []
    for prefix, test in ELSEWHERE.items():
        shown = (ROOT / test).read_text().replace('", "', " ")
        assert prefix.removeprefix("kvtier ") in shown, (prefix, test)


@pytest.mark.parametrize("command", readme_commands())
def test_the_command_runs_as_shown(command: str, tmp_path: Path) -> None:
    form = _form(command)
    assert form is not None
    if isinstance(form, str):
        pytest.skip(form)
    argv = form(command, tmp_path)
    exports = _readme_commands()[command]
    if exports:  # run in the shell those lines set up
        argv = ["bash", "-c", " && ".join([*exports, f"exec {shlex.join(argv)}"])]
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HOME": os.environ["HOME"]}
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{shlex.join(argv)}: status {done.returncode}\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
