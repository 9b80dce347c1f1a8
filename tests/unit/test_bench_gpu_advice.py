"""``kvtier bench gpu``'s advice: which mechanism each direction should take on the GPU measured
(``apps/bench/gpu/advice.py``), from the figures of a run's JSON alone."""

from __future__ import annotations

from typing import Any

import pytest

from kvtier.apps.bench.gpu.advice import advise
from kvtier.apps.bench.gpu.markdown import render
from kvtier.pages.mechanism import Mechanism, Mechanisms


def _figure(**medians: float | None) -> dict[str, Any] | None:
    """A per-mechanism figure of the given medians (None: that mechanism not measured)."""
    found = {m: {"min": v, "median": v, "max": v} for m, v in medians.items() if v is not None}
    return found or None


Pair = tuple[float | None, float | None]  # (dma, kernel)


def _shape(
    store: Pair, load: Pair, beside_store: Pair = (1.0, 1.0), beside_load: Pair = (1.0, 1.0)
) -> dict[str, Any]:
    """A shape's figures: (dma, kernel) each."""
    return {
        "host_store_ratio": _figure(dma=store[0], kernel=store[1]),
        "host_load_ratio": _figure(dma=load[0], kernel=load[1]),
        "beside_compute_store": _figure(dma=beside_store[0], kernel=beside_store[1]),
        "beside_compute_load": _figure(dma=beside_load[0], kernel=beside_load[1]),
    }


def _document(**shapes: dict[str, Any]) -> dict[str, Any]:
    return {"device": "NVIDIA H200", "date": "2026-12-02T00:00:00Z",
            "shapes": {name.replace("_", "-"): s for name, s in shapes.items()}}  # fmt: skip


def _value(document: dict[str, Any]) -> str:
    advice = advise(document)
    assert advice is not None
    assert Mechanisms.parse(advice.value) == (advice.store.mechanism, advice.load.mechanism)
    return advice.value


def test_where_both_keep_the_forward_the_faster_at_its_worst_shape_is_advised() -> None:
    document = _document(b8=_shape(store=(0.95, 0.91), load=(0.90, 0.94)),
                         bench=_shape(store=(0.93, 0.97), load=(0.80, 0.95)))  # fmt: skip
    assert _value(document) == "store=dma,load=kernel"  # dma's worst store 0.93 > kernel's 0.91


def test_a_mechanism_that_slows_the_forward_is_not_advised_however_fast() -> None:
    document = _document(b8=_shape(store=(0.90, 0.96), load=(0.90, 0.96),
                                   beside_load=(1.02, 1.04)),
                         mla=_shape(store=(0.90, 0.96), load=(0.90, 0.96),
                                    beside_load=(1.03, 1.07)))  # fmt: skip
    advice = advise(document)
    assert advice is not None and advice.value == "store=kernel,load=dma"
    assert "only it keeps the loop within 1.05" in advice.load.why


def test_where_neither_keeps_the_forward_the_one_that_slows_it_least_is_advised() -> None:
    figures = _shape(store=(0.5, 0.96), load=(0.9, 0.9), beside_store=(1.08, 1.20),
                     beside_load=(1.10, 1.06))  # fmt: skip
    document = _document(b8=figures)
    advice = advise(document)
    assert advice is not None and advice.value == "store=dma,load=kernel"
    assert advice.store.why.startswith("neither keeps the loop within 1.05")


def test_a_tie_keeps_the_default() -> None:
    assert _value(_document(b8=_shape(store=(0.9, 0.9), load=(0.9, 0.9)))) == "kernel"


def test_each_shape_is_judged_against_its_own_goal() -> None:
    """70b-tp8's host goal is 0.8, 8b's 0.9: dma's 0.78 at 70b-tp8 is 0.975 of its goal, the
    kernel's 0.86 at 8b 0.956 of its: dma's worst shape is the better."""
    document = _document(b8=_shape(store=(0.92, 0.86), load=(0.9, 0.9)),
                         **{"70b_tp8": _shape(store=(0.78, 0.95), load=(0.9, 0.9))})  # fmt: skip
    assert _value(document) == "store=dma,load=kernel"


def test_without_the_loop_beside_the_host_ratios_decide_and_say_so() -> None:
    document = _document(b8=_shape(store=(0.95, 0.9), load=(0.9, 0.95), beside_store=(None, None),
                                   beside_load=(None, None)))  # fmt: skip
    advice = advise(document)
    assert advice is not None and advice.value == "store=dma,load=kernel"
    assert "the loop beside not measured" in advice.store.why


def test_a_mechanism_with_no_figure_is_not_a_candidate() -> None:
    document = _document(b8={"host_store_ratio": _figure(kernel=0.9),
                             "host_load_ratio": _figure(dma=0.9, kernel=0.5)})  # fmt: skip
    advice = advise(document)
    assert advice is not None
    assert advice.store == (Mechanism.KERNEL, "not measured: the default")
    assert advice.load.mechanism is Mechanism.DMA


@pytest.mark.parametrize("document", [
    {"shapes": {"tiny": {"host_store_ratio": {"cpu": {"min": 1, "median": 1, "max": 1}}}}},
    {"shapes": {}}, {},
])  # fmt: skip
def test_a_run_without_both_mechanisms_advises_nothing(document: dict[str, Any]) -> None:
    assert advise(document) is None


def test_the_page_says_the_advice_and_why() -> None:
    document = _document(b8=_shape(store=(0.95, 0.91), load=(0.90, 0.94)))
    page = render(document)
    assert "`KVTIER_GPU_COPY=store=dma,load=kernel`" in page
    assert "- stores by dma: both keep the loop within 1.05" in page
    assert "- loads by kernel:" in page
