"""``kvtier`` run as a user runs it from a fresh shell: no variable but PATH and HOME.

kvtier(*args, timeout) -> CompletedProcess   asserts it ended with 0 and no traceback
"""

from __future__ import annotations

import os
import subprocess

from kvtier.apps.bench.common.servers import KVTIER


def run_kvtier(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``kvtier ARGS`` in a user's fresh shell: no variable but PATH and HOME."""
    env = {name: os.environ[name] for name in ("PATH", "HOME")}
    done = subprocess.run([KVTIER, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-5000:]
    return done
