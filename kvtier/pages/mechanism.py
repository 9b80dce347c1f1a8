"""How a GPU moves a job's pages, chosen per direction.

    Mechanism                      ``DMA`` or ``KERNEL`` (``mover.py`` says what each does)
    Mechanisms(store, load)        one per direction; ``str``: the value ``KVTIER_GPU_COPY``
                                   takes to choose them
    Mechanisms.parse(value, name)  ``kernel`` or ``dma`` for both directions, or each named:
                                   ``store=dma,load=kernel`` (one not named keeps the default)
    gpu_mechanisms()               what ``KVTIER_GPU_COPY`` says, else ``DEFAULT``

The directions weigh differently: a store runs beside the forward passes of the steps after the
one that wrote its blocks, a load before its request's first step. vLLM's own offloading copies
every store on the copy engine and small pages of a load with a kernel
(``vllm/v1/kv_offload/cpu/gpu_worker.py``); ``kvtier bench gpu`` measures both mechanisms each
way, on the bus and beside a matmul loop, per page shape.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import NamedTuple

GPU_COPY_ENV = "KVTIER_GPU_COPY"


class Mechanism(StrEnum):
    DMA = "dma"  # gather on the device, large copies on the copy engine
    KERNEL = "kernel"  # one kernel straight between engine and pinned host memory


class Mechanisms(NamedTuple):
    store: Mechanism
    load: Mechanism

    def __str__(self) -> str:
        if self.store is self.load:
            return self.store.value
        return f"store={self.store.value},load={self.load.value}"

    @classmethod
    def parse(cls, value: str, name: str = GPU_COPY_ENV) -> Mechanisms:
        """``value`` as ``KVTIER_GPU_COPY`` takes it (empty: ``DEFAULT``); a ``ValueError``
        naming ``name`` and the value where it is neither."""
        text = value.strip().lower()
        if text in Mechanism._value2member_map_:
            return cls(Mechanism(text), Mechanism(text))
        chosen = DEFAULT._asdict()
        for part in filter(None, (p.strip() for p in text.split(","))):
            side, _, which = (s.strip() for s in part.partition("="))
            if side not in chosen or which not in Mechanism._value2member_map_:
                raise ValueError(f"kvtier: {name} must be 'dma', 'kernel', or per direction "
                                 f"'store=dma,load=kernel' (each 'dma' or 'kernel'), got "
                                 f"{value!r}")  # fmt: skip
            chosen[side] = Mechanism(which)
        return cls(**chosen)


DEFAULT = Mechanisms(store=Mechanism.KERNEL, load=Mechanism.KERNEL)


def gpu_mechanisms() -> Mechanisms:
    """The mechanisms ``KVTIER_GPU_COPY`` names; ``DEFAULT`` where it is unset or empty."""
    return Mechanisms.parse(os.environ.get(GPU_COPY_ENV, ""))
