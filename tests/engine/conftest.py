"""Engine tests run real vLLM in-process on the CPU with the local random models.

The environment is set here, before any test module imports vLLM. Each variable is only a default:
a value already in the environment wins (e.g. ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` to run every
engine in separate processes). A test that needs the multi-process engine sets it itself with
``monkeypatch.setenv`` before it creates the ``LLM``.

An in-process engine caches ``vllm.envs`` for the rest of the process and freezes the GC heap
(``EngineCore.__init__``); the autouse fixture below undoes both after every test, so one test's
environment never leaks into the next.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process engine: ~2 s per LLM instead of ~25 s
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # V2 needs Triton; keep the runner fixed
    "HF_HUB_OFFLINE": "1",  # no hub is reachable
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of engine KV cache
}
for _name, _value in _ENGINE_ENV.items():
    os.environ.setdefault(_name, _value)

from kvtier.apps.models import model_path  # noqa: E402  (after the environment is set)


@pytest.fixture(autouse=True)
def _reset_vllm_process_state() -> Iterator[None]:
    yield
    import vllm.envs

    vllm.envs.disable_envs_cache()
    # what the test froze (the heap at an engine's start, vLLM's own freeze once started)
    # collectable again where no engine's shutdown unfroze it (a start that failed): the
    # collector's own passes then free what of it is garbage
    gc.unfreeze()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The ``tiny`` model (2 layers, head_dim 32, float32), built once under the repo's models/."""
    return model_path("tiny")


@pytest.fixture(scope="session")
def hybrid_model() -> Path:
    """The ``hybrid`` model: 4 layers alternating sliding-window (64) and full attention."""
    return model_path("hybrid")


@pytest.fixture
def llm_kwargs(tiny_model: Path) -> dict[str, Any]:
    """Arguments for ``vllm.LLM`` that work on the CPU here; a fresh dict per test."""
    return {
        "model": str(tiny_model),
        "dtype": "float32",
        "max_model_len": 512,
        "enforce_eager": True,
        "seed": 0,
        "block_size": 32,  # the CPU attention backend needs a multiple of 32
        "gpu_memory_utilization": 0.3,  # a fraction of CPU memory here
        "distributed_executor_backend": "uni",
    }


_REFERENCES: dict[tuple[object, ...], list[list[int]]] = {}


class References:
    """Greedy outputs without any connector, computed once per (model, prompts, max_tokens,
    engine args) in this process.

    ``reference(model, prompts)`` gives one set's outputs. ``reference.many(model, [(prompts,
    max_tokens), ...])`` gives several, and computes those not known yet with one engine instead
    of one each: an engine with the same arguments is started once (seconds in-process, ~30 s for
    a multi-process one). Each set is still one ``generate()`` of that set alone, the engine's
    prefix cache emptied before it: the batch and the computation a fresh engine would run.
    """

    def __call__(
        self, model: Path, prompts: list[list[int]], max_tokens: int = 8, **overrides: Any
    ) -> list[list[int]]:
        return self.many(model, [(prompts, max_tokens)], **overrides)[0]

    def many(
        self, model: Path, sets: list[tuple[list[list[int]], int]], **overrides: Any
    ) -> list[list[list[int]]]:
        from harness import engine, generate, greedy

        keys = [_reference_key(model, prompts, n, overrides) for prompts, n in sets]
        missing = {key: (prompts, n) for key, (prompts, n) in zip(keys, sets, strict=True)
                   if key not in _REFERENCES}  # fmt: skip
        if missing:
            with engine(model, **overrides) as llm:
                for key, (prompts, n) in missing.items():
                    assert llm.reset_prefix_cache(), "the reference engine's cache not emptied"
                    _REFERENCES[key] = generate(llm, prompts, greedy(n))
        return [_REFERENCES[key] for key in keys]


def _reference_key(
    model: Path, prompts: list[list[int]], max_tokens: int, overrides: dict[str, Any]
) -> tuple[object, ...]:
    return (str(model), tuple(map(tuple, prompts)), max_tokens, repr(sorted(overrides.items())))


@pytest.fixture(scope="session")
def reference() -> References:
    """Greedy outputs without any connector (``References``)."""
    return References()
