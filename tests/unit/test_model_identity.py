"""The identity of what computed a KV (``model_identity``), from vLLM's own config of a model:
the same weights and config on any path share it; other weights, config or quantization do not."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from vllm.config import LoadConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

from kvtier.apps.models import model_path
from kvtier.checkpoint import weights_digest
from kvtier.vllm.model_identity import model_identity


def _config(model: Path | str, **overrides: object) -> VllmConfig:
    return VllmConfig(model_config=ModelConfig(model=str(model), dtype="float32", **overrides))


def _copy(tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(model_path("tiny"), tmp_path / name))


def _retrain(model: Path) -> None:
    """Other values in every tensor, the same names, shapes and file size: another training."""
    weights = model / "model.safetensors"
    tensors = load_file(weights)
    save_file({name: t * 1.01 for name, t in tensors.items()}, weights, {"format": "pt"})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    model = _copy(tmp_path_factory.mktemp("tiny"), "tiny")
    return model, model_identity(_config(model))


def test_the_same_model_on_another_path_is_the_same(tiny: tuple[Path, str], tmp_path: Path) -> None:
    model, identity = tiny
    assert len(identity) == 32
    assert model_identity(_config(_copy(tmp_path, "elsewhere"))) == identity
    assert model_identity(_config(model)) == identity  # again, in the same process


def test_weights_rewritten_in_place_are_another_model(
    tiny: tuple[Path, str], tmp_path: Path
) -> None:
    model = _copy(tmp_path, "tiny")
    before = (model / "model.safetensors").stat().st_size
    _retrain(model)
    assert (model / "model.safetensors").stat().st_size == before
    assert model_identity(_config(model)) != tiny[1]


def test_an_overridden_config_or_a_quantization_is_another_model(tiny: tuple[Path, str]) -> None:
    model, identity = tiny
    assert model_identity(_config(model, hf_overrides={"rope_theta": 20000.0})) != identity
    quantized = _config(model)
    quantized.model_config.quantization = "fp8"  # vLLM checks it against CUDA: set it after
    assert model_identity(quantized) != identity


def test_vllms_dummy_weights_are_named_by_their_seed_not_the_files(
    tiny: tuple[Path, str], tmp_path: Path
) -> None:
    model = _copy(tmp_path, "tiny")
    dummy = _config(model)
    dummy.load_config = LoadConfig(load_format="dummy")
    before = model_identity(dummy)
    assert before != tiny[1]
    _retrain(model)
    assert model_identity(dummy) == before


def test_a_hugging_face_model_is_read_from_the_cache_vllm_downloaded_it_to(
    tiny: tuple[Path, str], tmp_path: Path
) -> None:
    """A name, not a path: the snapshot of its revision in ``download_dir`` is what counts."""
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny"
    for revision, commit in (("main", "a" * 40), ("v2", "b" * 40)):
        snapshot = Path(shutil.copytree(tiny[0], repo / "snapshots" / commit))
        if revision == "v2":
            _retrain(snapshot)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
    config = _config(tiny[0])
    config.load_config = LoadConfig(download_dir=str(cache))
    config.model_config.model = "acme/tiny"
    assert model_identity(config) == tiny[1]
    config.model_config.revision = "v2"
    assert model_identity(config) != tiny[1]
    config.model_config.revision = "v3"  # not downloaded here: named, not read
    unread = model_identity(config)
    config.model_config.revision = "v4"
    assert model_identity(config) not in (tiny[1], unread)


def test_a_model_whose_weights_are_not_local_is_named_by_name_and_revision(
    tiny: tuple[Path, str],
) -> None:
    config = _config(tiny[0])
    config.model_config.model = "acme/not-downloaded"
    first = model_identity(config)
    assert first != tiny[1]
    assert model_identity(config) == first
    config.model_config.revision = "v2"
    assert model_identity(config) != first


def test_weights_that_cannot_be_read_are_named_by_the_path(
    tiny: tuple[Path, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A weight file that cannot be read (a link to a blob gone from Hugging Face's cache) does
    not stop the engine: its KV is named as weights that are not local are, with a warning."""
    model = _copy(tmp_path, "tiny")
    config = _config(model)
    (model / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "gone")
    with caplog.at_level(logging.WARNING, logger="kvtier.vllm.model_identity"):
        identity = model_identity(config)
    assert identity != tiny[1]
    assert "weight files could not be read" in caplog.text
    assert "model-00002-of-00002.safetensors" in caplog.text


def _speculating(target: Path, **spec: object) -> VllmConfig:
    """``target``'s config with speculative decoding ``spec`` (vLLM's own config of it)."""
    config = _config(target)
    config.speculative_config = SpeculativeConfig(
        num_speculative_tokens=2, target_model_config=config.model_config,
        target_parallel_config=ParallelConfig(), **spec,
    )  # fmt: skip
    return config


def test_a_draft_models_weights_name_the_kv_too(tiny: tuple[Path, str], tmp_path: Path) -> None:
    """A draft model's layers keep KV in the engine's blocks: another draft is other KV. The
    n-gram proposer has no layers of its own: the target's identity alone."""
    model, identity = tiny
    ngram = _speculating(model, method="ngram", prompt_lookup_min=2, prompt_lookup_max=4)
    assert model_identity(ngram) == identity
    draft = _copy(tmp_path, "draft")
    drafted = model_identity(_speculating(model, method="draft_model", model=str(draft)))
    assert drafted != identity
    _retrain(draft)
    assert model_identity(_speculating(model, method="draft_model", model=str(draft))) != drafted


def _long_rope(model: Path, max_model_len: int, original: int = 256) -> VllmConfig:
    """``model`` with Phi-3's LongRoPE (an original context of ``original`` tokens), run with
    ``max_model_len``."""
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 16, "long_factor": [4.0] * 16,
            "original_max_position_embeddings": original, "rope_theta": 10000.0}  # fmt: skip
    overrides = {"rope_parameters": rope, "max_position_embeddings": 4096}
    return _config(model, max_model_len=max_model_len, hf_overrides=overrides)


def test_a_long_rope_model_is_other_kv_on_either_side_of_its_original_context(
    tiny: tuple[Path, str],
) -> None:
    """vLLM rotates keys by LongRoPE's long factors in an engine longer than the original
    context, by the short ones otherwise: the two compute other KV for the same tokens."""
    model, identity = tiny
    short, long = (model_identity(_long_rope(model, n)) for n in (256, 1024))
    assert short != long
    assert model_identity(_long_rope(model, 200)) == short
    assert model_identity(_long_rope(model, 2048)) == long  # long factors alike: shared
    # no LongRoPE: an engine's length names nothing
    assert model_identity(_config(model, max_model_len=256)) == identity


def test_a_draft_of_the_targets_own_files_reads_them_once(
    tiny: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MTP's draft is the target's checkpoint: its files are sampled once, for both."""
    model, identity = tiny
    reads: list[Path] = []

    def counted(path: Path) -> str | None:
        reads.append(path)
        return weights_digest(path)

    monkeypatch.setattr("kvtier.vllm.model_identity.weights_digest", counted)
    drafted = model_identity(_speculating(model, method="draft_model", model=str(model)))
    assert drafted != identity  # the draft's config is named beside the target's
    assert reads == [model]


def test_what_vllms_model_code_writes_into_the_config_names_nothing(
    tiny: tuple[Path, str],
) -> None:
    """As a worker builds the model, vLLM's model code writes into its config from the engine's
    length what names no KV (Llama 4's query temperature, MiniMax-M2's RoPE table): the workers'
    records must still match the scheduler's keys and other engines' records."""
    model, identity = tiny
    config = _config(model)
    config.model_config.hf_config.attn_temperature_tuning = True
    config.model_config.hf_config.max_model_len = 4096
    assert model_identity(config) == identity
