"""The benchmarks as a suite: one package per family, what they share written once in
``common/``, a Markdown page beside every JSON (``kvtier bench report`` makes them again from the
files), and the shortest runs of the benches no other test runs, from a user's fresh shell (only
PATH and HOME)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from fresh_shell import run_kvtier

from kvtier.apps.bench.commands import BENCHES
from kvtier.apps.bench.pages import SUMMARIES, page
from kvtier.apps.cli import main

BENCH = Path(__file__).resolve().parents[2] / "kvtier" / "apps" / "bench"
RESULTS = BENCH.parents[2] / "bench" / "results"
FAMILIES = ("common", "copy", "ttft", "disk", "redis", "transfer", "faults", "scheduler",
            "concurrency", "fleet", "chaos", "gpu")  # fmt: skip
COMMANDS = ("copy", "ttft", "disk", "transfer", "redis", "faults", "scheduler", "concurrency",
            "fleet", "chaos", "gpu", "report")  # fmt: skip
SHARED = {  # written once, in common/: a name, and the one file that may hold it
    "VLLM_ENABLE_V1_MULTIPROCESSING": "common/engine_env.py",
    "VLLM_USE_V2_MODEL_RUNNER": "common/engine_env.py",
    "HF_HUB_OFFLINE": "common/engine_env.py",
    '"KVTierConnector"': "common/connector.py",
    ".savefig(": "common/plots.py",
    "os.posix_fadvise(": "common/page_cache.py",
}


def test_every_family_is_a_package_and_no_file_is_long() -> None:
    assert sorted(p.name for p in BENCH.iterdir() if (p / "__init__.py").is_file()) == sorted(
        FAMILIES
    )
    assert sorted(p.name for p in BENCH.glob("*.py")) == ["__init__.py", "commands.py", "pages.py"]
    long = [str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py")
            if p.read_text().count("\n") > 300]  # fmt: skip
    assert long == []
    for path in BENCH.rglob("*.py"):
        assert "Over 300 lines because" not in (
            ast.get_docstring(ast.parse(path.read_text())) or ""
        )


@pytest.mark.parametrize(("name", "home"), SHARED.items())
def test_what_every_bench_shares_is_written_once(name: str, home: str) -> None:
    holding = sorted(
        str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py") if name in p.read_text()
    )
    assert holding == [home]


def test_kvtier_bench_lists_every_bench_and_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert tuple(command.name for command in BENCHES) == COMMANDS
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    assert all(f"    {name}" in listed for name in COMMANDS)


def test_the_report_makes_a_page_of_every_result_from_its_file_alone(tmp_path: Path) -> None:
    found = sorted(RESULTS.glob("*.json"))
    assert found, f"no results in {RESULTS}"
    for source in found:
        shutil.copy(source, tmp_path / source.name)
    run_kvtier("bench", "report", "--out", str(tmp_path), timeout=300)
    for source in found:
        document = json.loads(source.read_text())
        text = (tmp_path / source.name).with_suffix(".md").read_text()
        assert f"- results: `{source.name}`" in text and "- command: `kvtier bench " in text
        assert f"- date: {document.get('date', 'not recorded')}" in text
        assert text.count("\n|") >= 3  # the header, its rule, a row at least
        assert document.get("benchmark", source.stem) in SUMMARIES


def test_a_page_names_the_bench_of_a_file_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"benchmark": "other", "rows": []}))
    with pytest.raises(ValueError, match="none of copy, ttft"):
        page(path)


def test_bench_copy_runs_from_a_fresh_shell(tmp_path: Path) -> None:
    done = run_kvtier("bench", "copy", "--tokens", "256", "--rounds", "1", "--device", "cpu",
                   "--out", str(tmp_path), timeout=300)  # fmt: skip
    rows = json.loads((tmp_path / "copy-cpu.json").read_text())["rows"]
    assert {(r["chunk_tokens"], r["direction"]) for r in rows} == {
        (t, d) for t in (32, 64, 256) for d in ("store", "load")
    }
    assert all(r["ratio_to_plain_copy"] > 0 for r in rows) and "ratio" in done.stdout
    assert (tmp_path / "copy-cpu.png").stat().st_size > 0
    page_text = (tmp_path / "copy-cpu.md").read_text()
    assert "`kvtier bench copy --tokens 256 --rounds 1 --device cpu`" in page_text


def test_bench_fleet_simulated_runs_from_a_fresh_shell(tmp_path: Path) -> None:
    run_kvtier("bench", "fleet", "--no-real", "--engines", "2", "--out", str(tmp_path), timeout=300)
    document = json.loads((tmp_path / "fleet-sim.json").read_text())
    assert {row["engines"] for row in document["rows"]} == {2}
    assert (tmp_path / "fleet-sim.png").stat().st_size > 0
    page_text = (tmp_path / "fleet-sim.md").read_text()
    assert "`kvtier bench fleet --no-real --engines 2 --trace chat`" in page_text
