"""A GPU's host tier prefers its GPU's NUMA node (``kvtier/tiers/host/numa.py``): the node read
from a sysfs written into a temporary directory, and the preference set on fresh memory by the
real system call, in a process of its own, read back from ``/proc/self/numa_maps``."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.tiers.host.numa import SYSCALLS, pci_node


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


LINUX = pytest.mark.skipif(platform.machine() not in SYSCALLS or not sys.platform.startswith(
    "linux"), reason="mbind's system call number")  # fmt: skip


def _in_a_process_of_its_own(mode: int, lines: str) -> list[str]:
    """What ``lines`` print, run in a fresh process whose memory policy ``set_mempolicy`` first
    sets to ``mode`` (0 default, 1 preferred) on its first allowed node ``node``: a worker of
    this suite may have a policy of its own (vLLM's CPU worker binds the thread that starts it
    to its node; a CI machine may start everything under ``numactl``)."""
    script = f"""
import ctypes, platform, re, sys
sys.path[:0] = {sys.path!r}
from resident import PAGE, fresh, numa_policy
from kvtier.tiers.host.numa import prefer_node
allowed = open("/proc/self/status").read().split("Mems_allowed_list:")[1].split()[0]
node = int(re.split("[-,]", allowed)[0])
mask = ctypes.c_ulong(1 << node)
libc = ctypes.CDLL(None, use_errno=True)
set_mempolicy = {{"x86_64": 238, "aarch64": 237}}[platform.machine()]
assert libc.syscall(set_mempolicy, ctypes.c_int({mode}), ctypes.byref(mask) if {mode} else None,
                    ctypes.c_ulong(65 if {mode} else 0)) == 0, ctypes.get_errno()
{lines}
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


@LINUX
def test_fresh_memory_prefers_the_node_it_is_given() -> None:
    printed = _in_a_process_of_its_own(
        0,
        """
memory = fresh(64 * PAGE)
print(numa_policy(memory.data_ptr()), node)
print(prefer_node(memory.data_ptr(), memory.numel(), node), numa_policy(memory.data_ptr()))
memory.fill_(1)  # faulted in where it prefers: the data is as written
print(int(memory.sum()) == 64 * PAGE)
""",
    )
    before, node, done, after, written = printed
    assert (before, done, after, written) == ("default", "True", f"prefer:{node}", "True")


@LINUX
def test_a_process_started_under_a_policy_keeps_it() -> None:
    """As under ``numactl --preferred`` or vLLM's ``--numa-bind``: the tier is not placed."""
    printed = _in_a_process_of_its_own(
        1,
        """
memory = fresh(16 * PAGE)
print(prefer_node(memory.data_ptr(), memory.numel(), node))
""",
    )
    assert printed == ["False"]
