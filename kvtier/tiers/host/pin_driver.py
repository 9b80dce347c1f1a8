"""The CUDA calls that pin the host tier, made on the pinning thread.

    Driver                         what ``pinning.py`` asks of CUDA (tests give their own)
    CudaDriver(device)             ``cudaHostRegister`` / ``cudaHostUnregister``, on a thread that
                                   no engine's graph capture forbids them
    capture_checks_own_thread()    this thread's CUDA calls are checked against its own graph
                                   captures only; False where the driver cannot be asked

vLLM captures its CUDA graphs in the ``global`` mode, in which a call that is not stream-ordered
(``cudaHostRegister`` is one) from any other thread during a capture is refused with
``cudaErrorStreamCaptureUnsupported`` (900), and may end the capture: vLLM's own offloading met
this when it pinned in the background (vllm-project/vllm#46933). The pinning thread asks CUDA to
check its calls against its own captures only (``CU_STREAM_CAPTURE_MODE_THREAD_LOCAL``), as
``torch.cuda.graph(capture_error_mode="thread_local")`` does for the capturing thread: it never
captures, so its registrations go on beside an engine's capture, which they do not touch.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Protocol

import torch

logger = logging.getLogger(__name__)

CAPTURE_MODE_THREAD_LOCAL = 1  # CUstreamCaptureMode: GLOBAL 0, THREAD_LOCAL 1, RELAXED 2
CUDA_LIBRARY = "libcuda.so.1"


class Driver(Protocol):
    def register(self, address: int, size: int) -> int:
        """Pin ``[address, address + size)`` for the device; 0, or the driver's error code."""

    def unregister(self, address: int) -> None: ...


class CudaDriver:
    """``cudaHostRegister`` and ``cudaHostUnregister``, made on the thread that pins."""

    def __init__(self, device: torch.device) -> None:
        torch.cuda.set_device(device)
        self._cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        if not capture_checks_own_thread():
            logger.warning("kvtier: the CUDA driver cannot exempt the pinning thread from graph "
                           "captures: one while the tier is pinned may stop the pinning (the "
                           "rest stays pageable)")  # fmt: skip

    def register(self, address: int, size: int) -> int:
        return int(self._cudart.cudaHostRegister(address, size, 0))

    def unregister(self, address: int) -> None:
        self._cudart.cudaHostUnregister(address)


def capture_checks_own_thread(library: str = CUDA_LIBRARY) -> bool:
    """Set this thread's stream-capture mode to thread-local
    (``cuThreadExchangeStreamCaptureMode``); False where there is no such driver library or
    call, or the driver refused."""
    try:
        driver = ctypes.CDLL(library)
        exchange = driver.cuThreadExchangeStreamCaptureMode
    except (OSError, AttributeError):
        return False
    mode = ctypes.c_int(CAPTURE_MODE_THREAD_LOCAL)
    return int(exchange(ctypes.byref(mode))) == 0
