"""A GPU's host tier on the NUMA node of that GPU.

    place(memory, device)           ``memory`` (fresh, a GPU's tier) prefers ``device``'s node;
                                    the node, or None (one node, unknown, or not done)
    gpu_node(device)                the node of a CUDA device's PCI slot (None: unknown, or a
                                    machine of one node)
    pci_node(domain, bus, slot)     the same from sysfs, for a PCI address
    prefer_node(address, size, node) -> bool
                                    the range's pages, as they are faulted in, taken from ``node``
                                    first (``mbind(MPOL_PREFERRED)``); False: not done (not
                                    Linux, an unknown architecture, the process has a policy of
                                    its own, or the kernel refused)

Most 8-GPU servers have two sockets, each with its own memory and half the GPUs. A page lands on
the node of the thread that first touches it, wherever the scheduler ran that thread (the
pinning's faulting threads, a store that outran the pinning, the driver), so an unplaced tier
is spread over both and half its copies cross the link between the sockets. NVIDIA Dynamo's
block manager allocates its pinned memory on the GPU's node for that reason, vLLM binds its
workers there with ``--numa-bind``; here the tier's range prefers the GPU's node, whichever
thread faults it, and falls back to another when that node is full (a preference, not a
binding). A process started under a policy of its own (``numactl``, vLLM's ``--numa-bind``)
keeps it.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import platform
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SYSFS = Path("/sys")
PAGE = mmap.PAGESIZE
MPOL_DEFAULT, MPOL_PREFERRED = 0, 1
# (get_mempolicy, mbind) system call numbers
SYSCALLS = {"x86_64": (239, 237), "aarch64": (236, 235)}


def place(memory: torch.Tensor, device: torch.device) -> int | None:
    node = gpu_node(device)
    if node is None or not prefer_node(memory.data_ptr(), memory.numel(), node):
        return None
    logger.info("kvtier: the host tier prefers NUMA node %d, its GPU's", node)
    return node


def gpu_node(device: torch.device, sysfs: Path = SYSFS) -> int | None:
    props = torch.cuda.get_device_properties(device)
    domain, bus, slot = (
        getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")
    )
    if not (isinstance(domain, int) and isinstance(bus, int) and isinstance(slot, int)):
        return None  # a torch that does not say
    return pci_node(domain, bus, slot, sysfs)


def pci_node(domain: int, bus: int, slot: int, sysfs: Path = SYSFS) -> int | None:
    nodes = list((sysfs / "devices/system/node").glob("node[0-9]*"))
    path = sysfs / f"bus/pci/devices/{domain:04x}:{bus:02x}:{slot:02x}.0/numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 and len(nodes) > 1 else None


def prefer_node(address: int, size: int, node: int) -> bool:
    calls = SYSCALLS.get(platform.machine())
    if calls is None or not size:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    get_mempolicy, mbind = calls
    mode = ctypes.c_int(-1)
    if libc.syscall(get_mempolicy, ctypes.byref(mode), None, ctypes.c_ulong(0), None,
                    ctypes.c_ulong(0)) != 0 or mode.value != MPOL_DEFAULT:  # fmt: skip
        return False
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    start = address - address % PAGE
    length = -(-(address + size - start) // PAGE) * PAGE
    done = libc.syscall(mbind, ctypes.c_void_p(start), ctypes.c_ulong(length),
                        ctypes.c_int(MPOL_PREFERRED), mask, ctypes.c_ulong(words * 64 + 1),
                        ctypes.c_uint(0))  # fmt: skip
    if done != 0:
        logger.warning("kvtier: the host tier could not prefer NUMA node %d (errno %d): it "
                       "lands where it is first touched", node, ctypes.get_errno())  # fmt: skip
        return False
    return True
