"""The costs a hit is decided with, measured as the engine runs (``kvtier/scheduler/costs/``):
an estimate robust to one outlier and kept current, a line fit of seconds against tokens, the
engine's steps timed from the scheduler half's plans, and a tier judged too slow probed again.

Times are seconds on a clock the test moves; milliseconds written as ``ms(2)``.
"""

from __future__ import annotations

import pytest

from kvtier.scheduler.costs import CostFit, HitCosts, Line, Smoothed, StepTimer
from kvtier.scheduler.costs.model import MIN_STEPS, PROBE_AFTER_DECLINED, PROBE_AFTER_S


def ms(value: float) -> float:
    return value / 1e3


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# ---- one quantity: the median of three, then an EWMA ---------------------------------------


def test_one_outlier_never_moves_an_estimate() -> None:
    rate = Smoothed()
    for sample in [2.0, 2.0, 2.0, 2.0, 20.0, 2.0, 2.0]:
        rate.add(sample)
        assert rate.value == 2.0


def test_a_first_sample_that_is_an_outlier_is_gone_after_three() -> None:
    rate = Smoothed()
    rate.add(50.0)  # a cold first load
    assert rate.value == 50.0
    rate.add(1.0)
    rate.add(1.0)
    assert rate.value == 1.0


def test_a_lasting_change_is_followed() -> None:
    rate = Smoothed()
    for _ in range(5):
        rate.add(1.0)
    rate.add(3.0)
    assert rate.value == 1.0  # one sample: maybe an outlier
    rate.add(3.0)
    assert rate.value is not None and 1.0 < rate.value < 3.0  # two: the EWMA moves
    for _ in range(10):
        rate.add(3.0)
    assert rate.value == pytest.approx(3.0, rel=0.05)


def test_three_samples_all_far_off_are_taken_at_once() -> None:
    rate = Smoothed()
    for _ in range(5):
        rate.add(10.0)
    rate.add(1.0)
    rate.add(1.0)
    assert rate.value is not None and rate.value > 5.0  # the median moved: the EWMA follows
    rate.add(1.0)
    assert rate.value == 1.0  # three in a row, all under half of it: a lasting change


# ---- seconds ~ fixed + per_unit * units -----------------------------------------------------


def test_decode_and_prefill_steps_give_the_fixed_and_the_per_token_cost() -> None:
    fit = CostFit()
    assert fit.line() is None and fit.predict(10) is None
    for _ in range(3):
        fit.add(1, ms(2.01))  # decode: 2 ms a step, 10 us a token
        fit.add(1024, ms(12.24))  # a prefill
    line = fit.line()
    assert line is not None
    assert line.fixed == pytest.approx(ms(2.0), rel=0.01)
    assert line.per_unit == pytest.approx(ms(0.01), rel=0.01)
    assert fit.predict(512) == pytest.approx(ms(7.12), rel=0.01)


def test_a_long_decode_never_washes_out_what_a_prefill_taught() -> None:
    fit = CostFit()
    for _ in range(3):
        fit.add(1024, ms(12.24))
    for _ in range(10_000):
        fit.add(1, ms(2.01))
    line = fit.line()
    assert line is not None and line.per_unit == pytest.approx(ms(0.01), rel=0.01)


def test_one_size_alone_is_a_line_through_the_origin() -> None:
    fit = CostFit()
    fit.add(100, ms(5))
    assert fit.line() == (0.0, pytest.approx(ms(0.05)))
    fit.add(0, 1.0)  # no units: not a sample
    fit.add(100, -1.0)  # a negative time: not a sample
    assert fit.samples == 1


def test_noise_that_slopes_downwards_gives_a_line_through_the_origin() -> None:
    fit = CostFit()
    fit.add(100, ms(10))
    fit.add(200, ms(8))
    line = fit.line()
    assert line is not None and line.fixed == 0.0 and line.per_unit > 0


def test_a_loads_noise_that_slopes_downwards_is_flat_not_a_per_token_rate() -> None:
    """Tails of a few tokens cost a job's fixed time: as a per-token rate, a 400-token load
    would be charged a hundred times what it costs."""
    fit = CostFit(origin=False)
    for tokens, seconds in ((1, ms(0.33)), (3, ms(0.45)), (25, ms(0.31))):
        fit.add(tokens, seconds)
    line = fit.line()
    assert line is not None and line.per_unit == 0.0
    assert ms(0.31) <= line.at(400) <= ms(0.45)  # what such a job was measured to cost


def test_one_load_size_alone_is_flat_and_a_proportional_load_a_line_through_the_origin() -> None:
    fit = CostFit(origin=False)
    fit.add(100, ms(5))
    assert fit.line() == (pytest.approx(ms(5)), 0.0)
    fit.add(400, ms(20))  # every byte costs the same: fixed part 0
    line = fit.line()
    assert line is not None and line.at(800) == pytest.approx(ms(40))


def test_one_slow_tail_among_three_sets_no_per_token_rate() -> None:
    """Three tails, each its own size class: one slowed by a busy machine would draw a line of
    120 us a token through them; the loads' fit takes its line from steady classes only."""
    samples = ((3, ms(0.4)), (25, ms(3)), (1, ms(0.16)))
    loose, steady = CostFit(origin=False), CostFit(origin=False, steady=True)
    for tokens, seconds in samples:
        loose.add(tokens, seconds)
        steady.add(tokens, seconds)
    assert (loose.predict(99) or 0.0) > ms(10)  # what the fit would say without steadiness
    assert steady.line() == (pytest.approx(ms(0.16)), 0.0)  # the cheapest: optimistic
    for _ in range(2):  # each class steady: the line through the medians
        for tokens, seconds in ((3, ms(0.4)), (25, ms(0.5)), (1, ms(0.16))):
            steady.add(tokens, seconds)
    line = steady.line()
    assert line is not None and line.at(99) < ms(1.5)


# ---- the engine's steps ---------------------------------------------------------------------


def test_back_to_back_steps_are_timed_from_plan_to_plan() -> None:
    clock = Clock()
    steps = StepTimer(clock)
    steps.started()  # a request runs
    assert steps.step(512, 1, timed=True) is None  # nothing before it
    clock.now += ms(7)
    assert steps.step(1, 1, timed=True) == (512, pytest.approx(ms(7)))
    clock.now += ms(2)
    assert steps.step(1, 1, timed=True) == (1, pytest.approx(ms(2)))


def test_a_gap_after_the_last_request_finished_is_no_step() -> None:
    """The engine waited for work: the time to the next plan is not the step's."""
    clock = Clock()
    steps = StepTimer(clock)
    steps.started()
    steps.step(512, 1, timed=True)
    steps.ended()  # its only request finished in that step
    clock.now += 30.0
    steps.started()  # the next request arrives
    assert steps.step(512, 1, timed=True) is None
    clock.now += ms(7)
    assert steps.step(1, 1, timed=True) == (512, pytest.approx(ms(7)))


def test_a_step_that_waited_for_a_load_is_no_sample_one_waiting_for_loads_is_empty() -> None:
    clock = Clock()
    steps = StepTimer(clock)
    steps.started()
    steps.step(512, 1, timed=False)  # its forward waited for a synchronous load
    clock.now += ms(40)
    assert steps.step(0, 0, timed=True) is None  # the request waits for an asynchronous load
    clock.now += ms(0.5)
    assert steps.step(512, 1, timed=True) == (0, pytest.approx(ms(0.5)))


def test_the_engine_is_busy_while_a_request_it_computed_for_runs() -> None:
    clock = Clock()
    steps = StepTimer(clock)
    assert not steps.busy
    steps.started()
    steps.step(0, 0, timed=True)  # it waits for its load
    assert not steps.busy
    steps.step(512, 1, timed=True)
    assert steps.busy
    steps.ended()
    assert not steps.busy  # the next step computes for nobody else


# ---- the model: computing, waiting, each tier -------------------------------------------------


def _measured(clock: Clock, per_token: float = ms(0.01), wait_tokens: int = 256) -> HitCosts:
    """Costs whose engine computed a prefill and decoded, MIN_STEPS steps each."""
    costs = HitCosts(clock, wait_tokens)
    costs.started()
    for _ in range(MIN_STEPS):
        for tokens in (1024, 1):
            costs.step(tokens, 1, timed=True)
            clock.now += ms(2) + per_token * tokens
    return costs


def test_nothing_is_decided_by_cost_until_the_engines_steps_are_measured() -> None:
    clock = Clock()
    costs = HitCosts(clock, 256)
    costs.started()
    costs.step(1024, 1, timed=True)
    clock.now += ms(12)
    costs.step(1, 1, timed=True)
    assert costs.view() is None
    view = _measured(clock).view()
    assert view is not None and view.compute == pytest.approx(ms(0.01), rel=0.01)


def test_a_tier_costs_nothing_until_three_loads_measured_it() -> None:
    """Optimism: a tier not measured is loaded, and so measured; no single load decides."""
    clock = Clock()
    costs = _measured(clock)
    for seconds in (ms(20), ms(20)):
        view = costs.view()
        assert view is not None and view.load("disk", 512) == 0.0
        costs.loaded("disk", 512, seconds)
    costs.loaded("disk", 256, ms(10))  # seconds per token: 39 us
    view = costs.view()
    assert view is not None and view.load("disk", 1024) == pytest.approx(ms(10))  # no line yet
    assert view.load("disk", 0) == 0.0
    costs.loaded("disk", 512, ms(20))
    costs.loaded("disk", 256, ms(10))
    costs.loaded("disk", 256, ms(10))  # two sizes of three loads each: a line
    view = costs.view()
    assert view is not None and view.load("disk", 1024) == pytest.approx(ms(40))


def test_computing_is_credited_with_half_the_largest_steps_average_at_least() -> None:
    """A machine whose steps all cost about the same (another process on the cores): the
    slope says a token costs next to nothing, which would decline every hit."""
    clock = Clock()
    costs = HitCosts(clock, 256)
    costs.started()
    for _ in range(MIN_STEPS):
        for tokens, seconds in ((1, ms(100)), (512, ms(101))):
            costs.step(tokens, 1, timed=True)
            clock.now += seconds
    view = costs.view()
    assert view is not None and view.compute == pytest.approx(0.5 * ms(101) / 512)


def test_a_wait_beside_running_requests_costs_the_least_a_step_costs() -> None:
    """A load that makes its request wait costs it at least a step of the others: the line's
    fixed cost."""
    view = _measured(Clock()).view()
    assert view is not None and view.wait == pytest.approx(ms(2), rel=0.01)


def test_a_wait_on_an_idle_engine_costs_a_step_computing_nothing() -> None:
    clock = Clock()
    costs = _measured(clock, wait_tokens=256)
    costs.ended()  # the engine has no other request
    view = costs.view()
    assert view is not None and view.wait == pytest.approx(256 * view.compute)  # the prior
    costs.started()  # a request waits for its load: the steps compute nothing
    for _ in range(3):
        costs.step(0, 0, timed=True)
        clock.now += ms(0.4)
    costs.step(512, 1, timed=True)
    costs.ended()
    view = costs.view()
    assert view is not None and view.wait == pytest.approx(ms(0.4))


def test_a_wait_costs_its_prior_in_tokens_while_one_step_size_is_known() -> None:
    clock = Clock()
    costs = HitCosts(clock, 256)
    costs.started()
    for _ in range(MIN_STEPS + 1):
        costs.step(1024, 1, timed=True)
        clock.now += ms(12.24)
    view = costs.view()
    assert view is not None and view.wait == pytest.approx(256 * view.compute)


def test_a_tier_judged_too_slow_is_probed_again_after_a_while_and_some_declines() -> None:
    clock = Clock()
    costs = _measured(clock)
    for _ in range(3):
        costs.loaded("redis", 512, ms(50))
    for _ in range(PROBE_AFTER_DECLINED):
        costs.decided(loaded=["cpu"], declined=["redis"])
    assert "redis" in _tiers(costs)  # declines, but no time since it was measured
    clock.now += PROBE_AFTER_S
    assert "redis" not in _tiers(costs)  # free: the next hit loads it
    costs.decided(loaded=["cpu", "redis"], declined=[])  # the probe: one hit
    assert "redis" in _tiers(costs)


def test_a_tier_measured_by_tiny_tails_is_still_loaded_for_a_long_hit() -> None:
    clock = Clock()
    costs = _measured(clock)
    for tokens in (3, 25, 1):
        costs.loaded("cpu", tokens, ms(0.4))
    view = costs.view()
    assert view is not None and view.load("cpu", 449) < 449 * view.compute


def test_time_alone_is_no_probe() -> None:
    clock = Clock()
    costs = _measured(clock)
    for _ in range(3):
        costs.loaded("redis", 512, ms(50))
    costs.decided(loaded=[], declined=["redis"])
    clock.now += 10 * PROBE_AFTER_S
    assert "redis" in _tiers(costs)


def _tiers(costs: HitCosts) -> dict[str, Line]:
    view = costs.view()
    assert view is not None
    return dict(view.tiers)
