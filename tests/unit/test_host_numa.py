"""A GPU's host tier prefers its GPU's NUMA node (``kvtier/tiers/host/numa.py``): the node read
from a sysfs written into a temporary directory, and the preference set on fresh memory of this
process by the real system call, read back from ``/proc/self/numa_maps``."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest
from resident import PAGE, fresh

from kvtier.tiers.host.numa import SYSCALLS, pci_node, prefer_node


def _sysfs(tmp_path: Path, nodes: int, node: str) -> Path:
    for n in range(nodes):
        (tmp_path / f"devices/system/node/node{n}").mkdir(parents=True)
    (tmp_path / "devices/system/node/possible").write_text(f"0-{nodes - 1}\n")
    device = tmp_path / "bus/pci/devices/0000:9b:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text(node + "\n")
    return tmp_path


def test_the_node_of_a_gpus_pci_slot(tmp_path: Path) -> None:
    assert pci_node(0, 0x9B, 0, _sysfs(tmp_path / "two", 2, "1")) == 1
    assert pci_node(0, 0x9B, 0, _sysfs(tmp_path / "unknown", 2, "-1")) is None
    assert pci_node(0, 0x9B, 0, _sysfs(tmp_path / "one", 1, "0")) is None  # nothing to choose
    assert pci_node(0, 0x9C, 0, _sysfs(tmp_path / "other", 2, "1")) is None  # no such slot


def _policy(address: int) -> str:
    """The policy ``/proc/self/numa_maps`` gives the mapping that starts at ``address``."""
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        start, policy, *_ = line.split()
        if int(start, 16) == address:
            return policy
    raise AssertionError(f"no mapping starts at {address:#x}")


LINUX = pytest.mark.skipif(platform.machine() not in SYSCALLS or not sys.platform.startswith(
    "linux"), reason="mbind's system call number")  # fmt: skip


@LINUX
def test_fresh_memory_prefers_the_node_it_is_given() -> None:
    memory = fresh(64 * PAGE)
    assert _policy(memory.data_ptr()) == "default"
    assert prefer_node(memory.data_ptr(), memory.numel(), 0)
    assert _policy(memory.data_ptr()) == "prefer:0"
    memory.fill_(1)  # faulted in where it prefers: the data is as written
    assert int(memory.sum()) == 64 * PAGE


@LINUX
def test_a_process_started_under_a_policy_keeps_it() -> None:
    """As under ``numactl --membind`` or vLLM's ``--numa-bind``: the tier is not placed."""
    script = f"""
import ctypes, sys
sys.path[:0] = {sys.path!r}
from resident import fresh
from kvtier.tiers.host.numa import SYSCALLS, prefer_node
import platform
mask = ctypes.c_ulong(1)
libc = ctypes.CDLL(None, use_errno=True)
set_mempolicy = {{"x86_64": 238, "aarch64": 237}}[platform.machine()]
assert libc.syscall(set_mempolicy, ctypes.c_int(1), ctypes.byref(mask), ctypes.c_ulong(65)) == 0
memory = fresh(16 * 4096)
print(prefer_node(memory.data_ptr(), memory.numel(), 0))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
