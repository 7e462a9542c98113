"""Online learning of the plant (controller.plant): a window's step-time factor from the
engines' mean ITL, learned bounded and smoothed, never from a thin, queued or unsteady
window; the decider's capacity and knobs follow it before the SLA is violated."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from controller.decider import Decider
from controller.metrics import GovernorMetrics
from controller.plant import SPEED_JUMP_RATIO, SPEED_MAX, SPEED_MIN, learn_speed, speed_sample
from controller.types import Lengths
from estimators.stepmodel import load_profile
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import obs

PROFILE = load_profile("llama-3.1-8b-h100")
LENGTHS = Lengths(1155.0, 4083.0, 211.0, 451.0)
BUDGET = 8192


def _itl_for(speed: float, **kw: float) -> float:
    """The mean ITL (ms) at which a window reads `speed` (bisection on the monotone
    sample): what engines `speed` x slower than the profile would show."""
    lo, hi = 0.1, 2000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        s = speed_sample(obs(itl_mean_ms=mid, **kw), LENGTHS, PROFILE, 60.0, BUDGET)
        assert s is not None
        lo, hi = (mid, hi) if s < speed else (lo, mid)
    return (lo + hi) / 2


# 40 req/s on 4 replicas, 20 running and none waiting per replica
LOADED = {"rate": 40.0, "running": 80.0, "waiting": 0.0, "ready_replicas": 4}


def test_sample_is_monotone_and_reads_the_step_time_factor() -> None:
    base = _itl_for(1.0, **LOADED)
    slow = _itl_for(2.5, **LOADED)
    assert 5.0 < base < 30.0  # a plausible mean ITL for the profile at this load
    assert slow > 2.0 * base
    s = speed_sample(obs(itl_mean_ms=slow, **LOADED), LENGTHS, PROFILE, 60.0, BUDGET)
    assert s == pytest.approx(2.5, rel=1e-6)


@pytest.mark.parametrize(
    "thin",
    [
        pytest.param({"running": 4.0}, id="one-running-per-replica"),
        pytest.param({"waiting": 40.0}, id="queued"),
        pytest.param({"rate": 0.3}, id="few-requests"),
        pytest.param({"arrival_rate_short_rps": 80.0}, id="unsteady"),
        pytest.param({"running": None}, id="no-running-gauge"),
    ],
)
def test_no_sample_from_a_window_without_enough_data(thin: dict) -> None:
    o = obs(itl_mean_ms=30.0, **{**LOADED, **thin})
    assert speed_sample(o, LENGTHS, PROFILE, 60.0, BUDGET) is None


def test_learning_is_smoothed_and_bounded() -> None:
    assert learn_speed(1.0, 1.3, 5.0) == pytest.approx(1.3 ** (1 - 0.5 ** (5 / 60)))
    assert learn_speed(1.0, None, 5.0) == 1.0
    s = 1.0
    for _ in range(500):
        s = learn_speed(s, 100.0, 5.0)
    assert s == pytest.approx(SPEED_MAX)
    s = 1.0
    for _ in range(500):
        s = learn_speed(s, 0.001, 5.0)
    assert s == pytest.approx(SPEED_MIN)


def test_an_engine_far_slower_than_the_profile_is_taken_at_once() -> None:
    """A window 15x slower than believed (vLLM's CPU build on the H100 profile) replaces
    the belief; within SPEED_JUMP_RATIO it is averaged (a transient window of a plant
    the profile matches reads up to ~2.4x); faster is never jumped to."""
    assert learn_speed(1.0, 15.0, 1.0) == 15.0
    assert learn_speed(15.0, 18.0, 1.0) == pytest.approx(15.0 * 1.2 ** (1 - 0.5 ** (1 / 60)))
    assert learn_speed(1.0, SPEED_JUMP_RATIO * 0.99, 1.0) < 1.03
    assert learn_speed(15.0, 1.0, 1.0) > 14.0
    # ...unless the caller sees engines within the ITL target: then it is averaged
    assert learn_speed(1.0, 15.0, 1.0, jump=False) < 1.1


def test_a_far_slower_window_with_the_itl_met_is_not_jumped_to() -> None:
    """One window reading 5x with the mean ITL within the target (a long prompt's
    prefill chunks in one window) moves the belief at the half-life only; the same
    reading with the mean ITL past the target replaces it."""
    itl = _itl_for(5.0, **LOADED)
    for target, jumps in ((1.2 * itl, False), (itl / 1.2, True)):
        d = Decider(make_model(max_replicas=64, itl_p95_ms=target), make_policy())
        s = d.initial_state(4, now_s=ORIGIN_S - 1000)
        _, s = d.decide(obs(t=ORIGIN_S, **LOADED), s, ORIGIN_S)
        o = obs(t=ORIGIN_S + 5, itl_mean_ms=itl, **LOADED)
        _, after = d.decide(o, s, ORIGIN_S + 5)
        assert (after.plant.speed > 4.0) is jumps, (target, after.plant.speed)


def test_no_jump_from_a_window_that_holds_the_last_scale_up() -> None:
    """A window 5x slow with the mean ITL past the target, within a cold start plus a
    window of a scale-up (it still holds the burst that asked for it: tokens made while
    overloaded priced against the gauges after it drained), is averaged at the half-life;
    the same window later replaces the belief. (Code x4 at a 30 s scrape read 5.1x right
    after its first burst, jumped, found the SLA infeasible and held 64 replicas for the
    hour.)"""
    itl = _itl_for(5.0, **LOADED)
    model = make_model(max_replicas=64, itl_p95_ms=itl / 1.2)
    d = Decider(model, make_policy())
    dead_time_s = model.cold_start_s + make_policy().window_s
    for since_up_s, jumps in ((dead_time_s - 10.0, False), (dead_time_s + 10.0, True)):
        s = d.initial_state(4, now_s=ORIGIN_S - 1000)
        _, s = d.decide(obs(t=ORIGIN_S, **LOADED), s, ORIGIN_S)
        now = ORIGIN_S + 5
        s = replace(s, windows=replace(s.windows, last_scale_up_s=now - since_up_s))
        _, after = d.decide(obs(t=now, itl_mean_ms=itl, **LOADED), s, now)
        assert (after.plant.speed > 4.0) is jumps, (since_up_s, after.plant.speed)


def test_a_slower_engine_is_learned_before_the_sla_is_violated() -> None:
    """Engines 2.5x slower than the profile: the decider learns it from ITL means while
    the SLA still reads healthy, and sizes the fleet for it; the violation feedback
    (floored at 0.4) is not what scales it out."""
    d = Decider(make_model(max_replicas=64), make_policy())
    slow_itl = _itl_for(2.5, **LOADED)
    s = d.initial_state(4, now_s=ORIGIN_S - 1000)
    t = ORIGIN_S
    first = None
    for _ in range(60):  # 5 minutes
        o = obs(
            t=t,
            itl_mean_ms=slow_itl,
            ttft_attainment_frac=1.0,
            itl_attainment_frac=1.0,
            **{**LOADED, "ready_replicas": 4},
        )
        dec, s = d.decide(o, replace(s, replicas=4), t)
        first = first or dec
        t += 5.0
    assert s.plant.speed == pytest.approx(2.5, rel=0.05)
    assert s.plant.capacity_correction == 1.0
    assert first is not None and first.capacity_rps_per_replica is not None
    assert dec.capacity_rps_per_replica < first.capacity_rps_per_replica / 2.0  # type: ignore[operator]
    assert dec.raw_replicas >= 2 * first.raw_replicas  # type: ignore[operator]
    assert f"step time x{s.plant.speed:.2f}" in dec.explain()
    m = GovernorMetrics(CollectorRegistry())
    m.record(dec, 0.0)
    got = m.registry.get_sample_value("governor_plant_speed_factor", {"model": dec.model})
    assert got is not None and math.isclose(got, s.plant.speed)


def test_scaled_profile_scales_every_coefficient_and_is_kept_per_profile_object() -> None:
    from controller.plant import scaled_profile

    assert scaled_profile(PROFILE, 1.0) is PROFILE
    slow = scaled_profile(PROFILE, 1.3)
    assert slow is scaled_profile(PROFILE, 1.3)  # kept: capacity answers are kept per object
    for name, value in PROFILE.step_time.model_dump().items():
        assert getattr(slow.step_time, name) == value * 1.3, name
    assert slow.kv_capacity_tokens == PROFILE.kv_capacity_tokens
    other = PROFILE.model_copy(update={"max_model_len": PROFILE.max_model_len // 2})
    assert scaled_profile(other, 1.3).max_model_len == other.max_model_len  # not PROFILE's
