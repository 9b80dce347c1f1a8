"""One engine process of the disk-tier tests: runs prompts with kvtier on a disk tier, reports JSON.

    python tests/engine/disk_job.py JOB.json OUT.json

JOB.json: {"model": path, "prompts": [[token ids], ...], "rounds": 2, "extra": {extra config},
"settle": true}. Each round generates every prompt, drains kvtier (``settle``: an idle engine
writes its dirty chunks to disk) and empties the engine's own prefix cache, so the next round
must load from kvtier. With "settle": false the job exits right after generating, as a script
would: what is still in host memory reaches the disk at shutdown.

OUT.json: {"outputs": [per round], "stats": kvtier's counters, "rank": this rank's counters}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_USE_V2_MODEL_RUNNER": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
for _name, _value in ENV_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

from harness import engine, generate, kvtier_transfer, settle  # noqa: E402

import kvtier  # noqa: E402
from kvtier.vllm import engine_connector, rank_counters  # noqa: E402


def main(job_path: str, out_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    transfer = kvtier_transfer(**job["extra"])
    outputs = []
    with engine(Path(job["model"]), kv_transfer_config=transfer) as llm:
        for _ in range(job.get("rounds", 1)):
            outputs.append(generate(llm, job["prompts"]))
            if job.get("settle", True):
                settle(llm)
                llm.reset_prefix_cache()
        connector = engine_connector(llm)
        connector.scheduler.check_integrity()
        result = {
            "outputs": outputs,
            "stats": kvtier.stats(llm).as_dict(),
            "rank": llm.collective_rpc(rank_counters)[0],
        }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
