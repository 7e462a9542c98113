"""Hypothesis properties of the decider over arbitrary observation sequences."""

from __future__ import annotations

import itertools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.decider import Decider
from controller.types import Decision
from estimators.types import NoDataError, Observation, SourceError
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import obs

MIN_R, MAX_R = 1, 30
TICK = 5.0

rates = st.floats(min_value=0.0, max_value=2000.0, allow_nan=False, allow_infinity=False)
maybe = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e6, allow_nan=False))

observation = st.one_of(
    st.builds(
        lambda r, short, itl, ttft, waiting, pm, om: obs(
            rate=r,
            arrival_rate_short_rps=short,
            itl_p95_ms=itl,
            ttft_p95_ms=ttft,
            waiting=waiting,
            prompt_tokens_mean=pm,
            output_tokens_mean=om,
        ),
        rates,
        st.one_of(st.none(), rates),
        st.one_of(st.none(), st.floats(min_value=1.0, max_value=5000.0)),
        st.one_of(st.none(), st.floats(min_value=1.0, max_value=60000.0)),
        st.one_of(st.none(), st.floats(min_value=0.0, max_value=5000.0)),
        st.one_of(st.none(), st.floats(min_value=1.0, max_value=100_000.0)),
        st.one_of(st.none(), st.floats(min_value=1.0, max_value=20_000.0)),
    ),
    st.just(NoDataError("llama", "arrival_rate")),
    st.just(SourceError("connection refused")),
)
gaps = st.floats(min_value=0.5, max_value=120.0)
sequences = st.lists(st.tuples(observation, gaps), min_size=1, max_size=60)


def walk(seq, model_kw=None, policy_kw=None, start=3):
    kw = {"min_replicas": MIN_R, "max_replicas": MAX_R, "fallback_replicas": 4, **(model_kw or {})}
    model = make_model(**kw)
    d = Decider(model, make_policy(**(policy_kw or {})))
    state = d.initial_state(start, ORIGIN_S)
    t = ORIGIN_S
    out: list[tuple[float, object, int, Decision, int]] = []
    for o, gap in seq:
        before = state.replicas
        dec, state = d.decide(o, state, t)
        out.append((t, o, before, dec, state.replicas))
        t += gap
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences)
def test_replicas_stay_within_bounds(seq) -> None:
    for _, _, _, dec, after in walk(seq):
        if dec.valid:
            assert MIN_R <= dec.replicas <= MAX_R
            assert after == dec.replicas


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences)
def test_missing_data_never_lowers_replicas(seq) -> None:
    for _, o, before, dec, after in walk(seq):
        if not isinstance(o, Observation):
            assert after >= before
            assert dec.replicas >= before


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences, st.sampled_from([60.0, 300.0]))
def test_no_scale_down_within_stabilization_window_after_scale_up(seq, window) -> None:
    """What the load asked for is held for the window. A queue's share is not once the
    queue reads drained (controller.demand, DemandSteps._remembered): scale-ups on a
    tick that saw a queue are held only while the queue is unknown (next property)."""
    steps = walk(
        seq, policy_kw={"scale_down_stabilization_s": window, "cooldown_after_scale_up_s": 0.0}
    )
    ups = [(t, after) for t, o, before, _, after in steps if after > before and not _queue(o)]
    for t_up, level in ups:
        for t, _, _, _, after in steps:
            if t_up < t and t - t_up < window:
                assert after >= level, f"scaled below {level} at +{t - t_up:.1f}s"


def _queue(o: object) -> bool:
    return isinstance(o, Observation) and bool(o.waiting)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences)
def test_an_absent_waiting_gauge_never_lowers_replicas(seq) -> None:
    """A running fleet whose waiting gauge is absent has an unknown queue, not an empty
    one: no scale-down on that tick (the replicas asked to drain a queue stay)."""
    for _, o, before, dec, after in walk(seq):
        if isinstance(o, Observation) and o.waiting is None and before > 0:
            assert after >= before, dec.explain()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.floats(min_value=5.0, max_value=300.0),
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=0, max_value=2**31),
)
def test_stationary_noisy_load_has_no_direction_reversals(mean_rate, start, seed) -> None:
    """Stationary load with +/-15 % uniform noise for 1.5 hours of 5 s ticks: the replica
    count moves in one direction (towards its level) and never turns back."""
    rng = random.Random(seed)
    seq = [
        (
            obs(
                rate=mean_rate * (1 + rng.uniform(-0.15, 0.15)), itl_p95_ms=25.0, ttft_p95_ms=150.0
            ),
            TICK,
        )
        for _ in range(1080)
    ]
    steps = walk(seq, model_kw={"max_replicas": 60}, start=start)
    directions = [
        1 if after > before else -1 for _, _, before, _, after in steps if after != before
    ]
    reversals = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    assert reversals == 0, f"directions {directions}"
