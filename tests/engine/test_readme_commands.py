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
    "kvtier bench gpu": _with("--shapes", "tiny", "--reps", "1"),  # the CPU run the table shows
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


def _runs(command: str) -> bool:
    return _form(command) not in (_help, None) and not isinstance(_form(command), str)


@pytest.mark.parametrize("command", [c for c in readme_commands() if _runs(c)])
def test_the_command_runs_as_shown(command: str, tmp_path: Path) -> None:
    done = _started(command, tmp_path)
    _assert_ran(done, *done.communicate(timeout=600))


def test_the_commands_shown_with_help_parse_their_arguments(tmp_path: Path) -> None:
    """Every ``--help`` form at once (each imports vLLM for seconds: in turn, a minute), one of
    each shape: commands that differ only in their numbers (the fleet's two engines' ports)
    parse the same words."""
    helped = _one_per_shape([c for c in readme_commands() if _form(c) is _help])
    assert helped  # the long benches, the servers
    started = [_started(command, tmp_path) for command in helped]
    for process in started:
        _assert_ran(process, *process.communicate(timeout=600))


def _one_per_shape(commands: list[str]) -> list[str]:
    shapes: dict[str, str] = {}
    for command in commands:
        shapes.setdefault(re.sub(r"\d+", "N", command), command)
    return list(shapes.values())


def test_one_command_of_each_shape_is_kept() -> None:
    ports = ["kvtier serve ./m --port 8101", "kvtier serve ./m --port 8102"]
    roles = ["kvtier serve ./m --kv-role kv_producer", "kvtier serve ./m --kv-role kv_consumer"]
    assert _one_per_shape([*ports, *roles]) == [ports[0], *roles]


def test_commands_not_run_say_why() -> None:
    why = {c: form for c in readme_commands() if isinstance(form := _form(c), str)}
    assert set(why) == {c for c in readme_commands() if c.startswith(("pip install", "curl"))}


def _started(command: str, tmp: Path) -> subprocess.Popen[str]:
    """``command`` in its shortest form, started in a user's fresh shell."""
    form = _form(command)
    assert form is not None and not isinstance(form, str)
    argv = form(command, tmp)
    exports = _readme_commands()[command]
    if exports:  # run in the shell those lines set up
        argv = ["bash", "-c", " && ".join([*exports, f"exec {shlex.join(argv)}"])]
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HOME": os.environ["HOME"]}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _assert_ran(process: subprocess.Popen[str], output: str, _: object) -> None:
    argv = process.args if isinstance(process.args, list) else [str(process.args)]
    shown = shlex.join(str(a) for a in argv)
    assert process.returncode == 0, f"{shown}: status {process.returncode}\n{output[-4000:]}"
    assert "Traceback" not in output, f"{shown}\n{output[-4000:]}"
