"""The queueing model of one replica's capacity (controller.capacity) and the lognormal
lengths it prices (controller.lognormal)."""

from __future__ import annotations

import math

import pytest

from controller.capacity import (
    binding_limit,
    capacity_limit,
    capacity_rps,
    erlang_c,
    fleet_capacity_rps,
    operating_point,
)
from controller.config import SLA
from controller.lognormal import SIGMA_MAX, lognormal_sigma, square_spread
from controller.stages import deadband
from controller.types import Knobs, Lengths
from estimators.stepmodel import load_profile

CONV = Lengths(prompt_mean=1455, prompt_p95=4083, output_mean=172, output_p95=451)
LONG = Lengths(prompt_mean=12_000, prompt_p95=40_000, output_mean=250, output_p95=600)
SLA_STD = SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0)
SLA_LONG = SLA(ttft_p95_ms=15_000.0, itl_p95_ms=50.0)
KNOBS = Knobs(max_num_seqs=152, max_num_batched_tokens=2560)


def test_worked_examples_match_the_module_doc() -> None:
    p = load_profile()
    assert capacity_rps(KNOBS, CONV, SLA_STD, p, 1.0) == pytest.approx(13.1, abs=0.1)
    long_knobs = Knobs(max_num_seqs=16, max_num_batched_tokens=1280)
    assert capacity_rps(long_knobs, LONG, SLA_LONG, p, 1.0, 4) == pytest.approx(0.57, abs=0.02)


@pytest.mark.parametrize(
    ("knobs", "lengths", "sla", "replicas", "limit"),
    [
        (KNOBS, CONV, SLA_STD, 1, "TTFT"),
        (KNOBS, CONV, SLA(ttft_p95_ms=500.0, itl_p95_ms=15.0), 1, "ITL"),
        (Knobs(max_num_seqs=16, max_num_batched_tokens=1280), LONG, SLA_LONG, 4, "ITL"),
        (
            Knobs(max_num_seqs=8, max_num_batched_tokens=2560),
            CONV,
            SLA(ttft_p95_ms=60_000.0, itl_p95_ms=1000.0),
            1,
            "saturation",
        ),
    ],
)
def test_binding_limit_names_the_target_just_above_capacity(
    knobs: Knobs, lengths: Lengths, sla: SLA, replicas: int, limit: str
) -> None:
    """Just below the capacity the model meets both targets; just above it, the named
    limit is the one it breaks (None from operating_point: saturation)."""
    p = load_profile()
    assert binding_limit(knobs, lengths, sla, p, replicas) == limit
    cap = capacity_rps(knobs, lengths, sla, p, 1.0, replicas)
    below = operating_point(cap * 0.99, knobs, lengths, sla, p, replicas)
    assert below is not None
    assert below.itl_q_ms <= sla.itl_p95_ms and below.ttft_q_ms <= sla.ttft_p95_ms
    above = operating_point(cap * 1.01, knobs, lengths, sla, p, replicas)
    if limit == "saturation":
        assert above is None
    else:
        assert above is not None
        assert (above.itl_q_ms > sla.itl_p95_ms) == (limit == "ITL")
        assert (above.ttft_q_ms > sla.ttft_p95_ms) == (limit == "TTFT")


def test_capacity_limit_is_the_binding_limit_kept_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a decision reports: binding_limit's answer, computed once per key (a tick
    that reuses a capacity reuses its limit) and again for another fleet size or SLA."""
    import controller.capacity as cap

    p = load_profile()
    calls: list[int] = []
    real = cap._limit_above
    monkeypatch.setattr(
        cap,
        "_limit_above",
        lambda *a: calls.append(a[4]) or real(*a),  # type: ignore[func-returns-value]
    )
    cap._LIMITS.clear()
    assert capacity_limit(KNOBS, CONV, SLA_STD, p, 1) == "TTFT"
    assert capacity_limit(KNOBS, CONV, SLA_STD, p, 1) == "TTFT"
    assert calls == [1]
    itl_tight = SLA(ttft_p95_ms=500.0, itl_p95_ms=15.0)
    assert capacity_limit(KNOBS, CONV, itl_tight, p, 1) == "ITL"
    assert calls == [1, 1]
    assert binding_limit(KNOBS, CONV, itl_tight, p, 1) == "ITL"  # the same answer afresh


def test_mean_step_matches_the_plant_measurement() -> None:
    """The simulated plant ran 20.6 ms mean steps at 14 req/s and 30.5 ms at 16 req/s on
    one replica (conversation lengths; the fluid model said 8.7 and 12.2 ms)."""
    p = load_profile()
    at14 = operating_point(14.0, KNOBS, CONV, SLA_STD, p)
    at16 = operating_point(16.0, KNOBS, CONV, SLA_STD, p)
    assert at14 is not None and at16 is not None
    assert at14.step_ms == pytest.approx(20.6, rel=0.15)
    assert at16.step_ms == pytest.approx(30.5, rel=0.15)
    assert operating_point(40.0, KNOBS, CONV, SLA_STD, p) is None  # cannot keep up


def test_the_attainment_goal_is_read() -> None:
    p = load_profile()
    strict = capacity_rps(KNOBS, CONV, SLA_STD, p, 1.0)
    lax = capacity_rps(
        KNOBS, CONV, SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0, attainment_goal_frac=0.95), p, 1.0
    )
    assert lax > 1.1 * strict


def test_capacity_scales_with_utilization_and_grows_with_the_fleet() -> None:
    p = load_profile()
    one = capacity_rps(KNOBS, CONV, SLA_STD, p, 1.0)
    assert capacity_rps(KNOBS, CONV, SLA_STD, p, 0.5) == pytest.approx(one * 0.5)
    caps = [capacity_rps(KNOBS, CONV, SLA_STD, p, 1.0, n) for n in (1, 2, 4, 16)]
    assert caps == sorted(caps) and caps[-1] > caps[0]


def test_erlang_c_examples() -> None:
    assert erlang_c(1, 0.5) == pytest.approx(0.5)
    assert erlang_c(4, 2.0) == pytest.approx(0.1739, abs=1e-4)
    assert erlang_c(3, 0.0) == 0.0 and erlang_c(3, 3.0) == 1.0


def test_sigma_fit_and_its_cap() -> None:
    assert lognormal_sigma(1455.0, 4083.0) == pytest.approx(0.844, abs=1e-3)
    assert lognormal_sigma(100.0, 90.0) == 0.0
    assert lognormal_sigma(12_000.0, 40_000.0) == pytest.approx(1.099, abs=1e-3)
    assert lognormal_sigma(11_000.0, 43_000.0) == SIGMA_MAX  # no lognormal fits


def test_the_square_spread_stops_at_max_model_len() -> None:
    """E[L^2] / mean^2 of the lognormal prompts, none past max_model_len (the plant's
    window pricing, controller.plant.window_parts): the long-context trace's lengths
    read 2.73, where the uncapped lognormal's exp(sigma^2) is 3.35."""
    assert square_spread(12_000.0, 40_000.0, 131_072.0) == pytest.approx(2.73, abs=0.01)
    s = lognormal_sigma(12_000.0, 40_000.0)
    assert square_spread(12_000.0, 40_000.0, 1e15) == pytest.approx(math.exp(s * s))
    assert square_spread(100.0, 90.0, 131_072.0) == 1.0  # no spread


@pytest.mark.parametrize("current", [1, 2, 3, 8])
def test_fleet_capacity_puts_raw_replicas_at_the_fleet_that_serves(current: int) -> None:
    """Capacity rising with the fleet (5.5, 12.5, 14, 15 ...): the demand / capacity the
    caller divides lands on the smallest n that serves, outside the deadband of n - 1
    and never inside the scale-down band of n."""
    table = {1: 5.5, 2: 12.5, 3: 14.0}

    def cap(n: int) -> float:
        return table.get(n, 15.0)

    for demand, n in ((4.0, 1), (6.0, 2), (10.0, 2), (26.0, 3), (42.0, 3), (43.0, 4), (70.0, 5)):
        c, now = fleet_capacity_rps(cap, demand, current, 64, 0.1)
        assert now == cap(current)
        raw = demand / c
        assert math.ceil(raw - 1e-9) == n, (demand, current, raw)
        if n > 1:
            assert raw > min(n, (n - 1) * 1.1), (demand, current, raw)
            assert math.ceil(raw * 1.1 - 1e-9) >= n  # the deadband keeps n


@pytest.mark.parametrize("n", [6, 7, 10])
def test_a_descending_fleet_keeps_one_replica_over_the_need(n: int) -> None:
    """From n + 1 replicas, a load that n serve and n - 1 do not (capacity 10 + k req/s
    per replica in a fleet of k: pooling) stays on n + 1: the raw count raised into n's
    band plus the deadband's scale-down headroom asks for n + 1 from n >= 6
    (fleet_capacity_rps's doc). Removing the raise on the way down added flaps in
    seven matrix rows, the headroom in ten (docs/decider-history.md, "Levers off the
    one-factor misses"); at n replicas the same load stays at n."""

    def cap(k: int) -> float:
        return 10.0 + k

    demand = (n - 1) * cap(n - 1) + 1.0
    for current, kept in ((n + 1, n + 1), (n, n)):
        c, _ = fleet_capacity_rps(cap, demand, current, 64, 0.1)
        assert math.ceil(demand / c - 1e-9) == n
        assert deadband(demand / c, current, 0.1).value == kept, (n, current)


@pytest.mark.parametrize("lengths", [CONV, LONG])
def test_inlined_step_map_is_the_fixed_point_map_bit_for_bit(lengths: Lengths) -> None:
    """`_Model._step_map` (the hot loop's closure) computes `_next_step_ms` exactly:
    same bits at every rate and step, also where decodes overflow (inf)."""
    from controller.capacity import _Model

    p = load_profile()
    big = Knobs(max_num_seqs=512, max_num_batched_tokens=8192)  # decodes past the floor
    for knobs in (KNOBS, Knobs(max_num_seqs=16, max_num_batched_tokens=1280), big):
        model = _Model(knobs, lengths, SLA_STD, p, 2)
        for lam in (0.01, 0.5, 3.0, 13.1, 40.0, 400.0):
            step = model._step_map(lam)
            for t in (0.5, 7.0, 20.6, 55.5, 100.0, 300.0, 5000.0):
                assert step(t) == model._next_step_ms(lam, t)
        assert math.isinf(model._step_map(400.0)(5000.0))


def test_capacity_cache_keys_on_rounded_lengths_and_checks_the_profile() -> None:
    """Lengths within the rounding share an answer; another profile object never reads
    a cached answer of an earlier one that had the same id."""
    p = load_profile()
    near = Lengths(prompt_mean=1455.2, prompt_p95=4083.4, output_mean=172.01, output_p95=451.0)
    assert capacity_rps(KNOBS, near, SLA_STD, p, 1.0) == capacity_rps(KNOBS, CONV, SLA_STD, p, 1.0)
    slower = p.model_copy(
        update={"step_time": p.step_time.model_copy(update={"floor_ms": p.step_time.floor_ms * 2})}
    )
    assert capacity_rps(KNOBS, CONV, SLA_STD, slower, 1.0) < capacity_rps(
        KNOBS, CONV, SLA_STD, p, 1.0
    )


@pytest.mark.parametrize("goal", [0.999999, 0.99999999999, 0.9999999999999999])
def test_a_goal_the_config_accepts_never_breaks_the_model(goal: float) -> None:
    """Found in review (session 15): a goal just under 1 (which the config accepts)
    rounded the tail cut 1 - (1 - goal) / 4 to 1.0 and inv_cdf raised, failing the tick
    of every model. A stricter goal serves less, never an exception."""
    p = load_profile()
    sla = SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0, attainment_goal_frac=goal)
    cap = capacity_rps(KNOBS, CONV, sla, p, 1.0)
    assert math.isfinite(cap) and 0 < cap <= capacity_rps(KNOBS, CONV, SLA_STD, p, 1.0)


def test_a_target_in_reach_of_an_unloaded_replica_is_sized_relaxed_and_continuously() -> None:
    """Prompts 3x the conversation's: an unloaded replica's TTFT quantile `v` is most of
    a 500 ms target. Each target below RELAX_FACTOR x v is sized for RELAX_FACTOR x v,
    reached or not, so the capacity does not jump where the belief crosses v (it did
    3.6x: the true target just above v leaves the queue a few ms); a target past
    RELAX_FACTOR x v is its own."""
    from controller.capacity import RELAX_FACTOR, relaxed_sla

    p = load_profile()
    long = Lengths(prompt_mean=4232, prompt_p95=14600, output_mean=172, output_p95=451)
    probe = relaxed_sla(KNOBS, long, SLA(ttft_p95_ms=1.0, itl_p95_ms=1000.0), p)
    assert probe is not None
    v = probe.ttft_p95_ms / RELAX_FACTOR  # ms
    assert 400.0 < v < 600.0  # about the 500 ms target

    def sized(target_ms: float) -> SLA:
        sla = SLA(ttft_p95_ms=target_ms, itl_p95_ms=50.0)
        return relaxed_sla(KNOBS, long, sla, p) or sla

    assert sized(0.99 * v).ttft_p95_ms == pytest.approx(RELAX_FACTOR * v)
    assert sized(1.01 * v).ttft_p95_ms == pytest.approx(RELAX_FACTOR * v)
    assert sized(1.4 * v).ttft_p95_ms == pytest.approx(RELAX_FACTOR * v)
    assert sized(1.6 * v).ttft_p95_ms == 1.6 * v  # past the band: the target itself
    below, above = (capacity_rps(KNOBS, long, sized(f * v), p, 0.85, 27) for f in (0.99, 1.01))
    assert above == below
    true = capacity_rps(KNOBS, long, SLA(ttft_p95_ms=1.01 * v, itl_p95_ms=50.0), p, 0.85, 27)
    assert true < 0.5 * above  # what the edge cost before
    edge = [capacity_rps(KNOBS, long, sized(f * v), p, 0.85, 27) for f in (1.49, 1.51)]
    assert edge[1] == pytest.approx(edge[0], rel=0.05)
