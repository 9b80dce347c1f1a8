"""The local models are built deterministically and their tokenizer round-trips text."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kvtier.apps.models import MARKER, build_models, is_complete
from kvtier.apps.prompts import make_prompt


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    first = build_models(tmp_path_factory.mktemp("a"), ["tiny"])["tiny"]
    second = build_models(tmp_path_factory.mktemp("b"), ["tiny"])["tiny"]
    return first, second


def _files(model_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}


def test_two_builds_are_byte_identical(two_builds: tuple[Path, Path]) -> None:
    first, second = _files(two_builds[0]), _files(two_builds[1])
    assert {"model.safetensors", "tokenizer.json", "config.json", MARKER} <= set(first)
    assert first == second


def test_tokenizer_round_trips_a_sentence(two_builds: tuple[Path, Path]) -> None:
    tokenizer = Tokenizer.from_file(str(two_builds[0] / "tokenizer.json"))
    sentence = 'Grace said: "The 42 blocks near the bridge were stored twice, weren\'t they?"'
    ids = tokenizer.encode(sentence).ids
    assert ids[0] == tokenizer.token_to_id("<s>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == sentence


def test_complete_model_is_not_rebuilt(two_builds: tuple[Path, Path]) -> None:
    model_dir = two_builds[0]
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_models(model_dir.parent, ["tiny"]) == {"tiny": model_dir}
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_model_without_marker_is_rebuilt(tmp_path: Path) -> None:
    half = tmp_path / "tiny"
    half.mkdir()
    (half / "config.json").write_text("{}")
    assert not is_complete(half, "tiny")
    build_models(tmp_path, ["tiny"])
    assert is_complete(half, "tiny")
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no temporary directory left


def test_make_prompt_has_exact_length(two_builds: tuple[Path, Path]) -> None:
    for n in (1, 17, 4096):
        ids = make_prompt(two_builds[0], n, seed=7)
        assert len(ids) == n and ids[0] == 1
    assert make_prompt(two_builds[0], 100, seed=1) == make_prompt(two_builds[0], 100, seed=1)
    assert make_prompt(two_builds[0], 100, seed=1) != make_prompt(two_builds[0], 100, seed=2)


def test_unknown_model_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tiny"):
        build_models(tmp_path, ["huge"])
