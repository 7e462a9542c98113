"""Histogram arithmetic, smoothing/forecasting and the step-time model's worked examples."""

from __future__ import annotations

import math

import pytest

from estimators.histogram import ITL_BUCKETS_S, fraction_le, histogram_quantile, token_buckets
from estimators.smoothing import HoltState, ewma, holt_forecast, holt_update
from estimators.stepmodel import load_profile
from estimators.types import Observation, finite_or_none

INF = math.inf


@pytest.mark.parametrize(
    ("q", "buckets", "want"),
    [
        pytest.param(0.95, [(0.1, 50), (0.2, 100), (INF, 100)], 0.19, id="interpolate"),
        pytest.param(0.5, [(0.1, 50), (0.2, 100), (INF, 100)], 0.1, id="on-edge"),
        pytest.param(0.99, [(0.1, 50), (0.2, 90), (INF, 100)], 0.2, id="in-inf-bucket"),
        pytest.param(0.25, [(0.1, 50), (INF, 50)], 0.025, id="first-bucket-from-zero"),
        pytest.param(0.5, [(0.1, 0), (INF, 0)], None, id="no-observations"),
        pytest.param(0.5, [(0.1, 5), (0.2, 10)], None, id="no-inf-bucket"),
        pytest.param(1.5, [(0.1, 5), (INF, 10)], None, id="q-out-of-range"),
        # a count that is no finite number >= 0: unknown, not read past (was 0.1)
        pytest.param(0.5, [(0.1, math.nan), (INF, 10)], None, id="nan-count"),
        pytest.param(0.5, [(0.1, -3.0), (INF, 10)], None, id="negative-count"),
        pytest.param(0.5, [(0.1, 5), (0.2, INF), (INF, 10)], None, id="infinite-count"),
    ],
)
def test_histogram_quantile(q: float, buckets: list, want: float | None) -> None:
    got = histogram_quantile(q, buckets)
    assert got == (pytest.approx(want) if want is not None else None)


def test_fraction_le_only_on_bucket_edges() -> None:
    b = [(0.025, 10), (0.05, 96), (INF, 100)]
    assert fraction_le(0.05, b) == pytest.approx(0.96)
    assert fraction_le(0.04, b) is None
    assert fraction_le(0.05, [(0.05, 0), (INF, 0)]) is None
    # Without the +Inf bucket there is no total: the last bucket read as one counts the
    # observations past it as within (3 of 10 within read 1.0).
    assert fraction_le(0.5, [(0.5, 3.0)]) is None
    assert fraction_le(0.25, [(0.25, 1.0), (0.5, 3.0)]) is None
    assert fraction_le(0.5, [(0.5, 3.0), (INF, 10.0)]) == pytest.approx(0.3)


@pytest.mark.parametrize("bad", [math.nan, -3.0, INF])
def test_fraction_le_of_a_bad_count_is_unknown(bad: float) -> None:
    """NaN read 0.0 (`max(0.0, nan)`), a negative count was clamped to 0.0: an
    attainment of 0 % from no data. Any count that is no finite number >= 0 -> None."""
    assert fraction_le(0.5, [(0.5, bad), (INF, 10.0)]) is None
    assert fraction_le(1.0, [(0.5, bad), (1.0, 9.0), (INF, 10.0)]) is None


def test_vllm_buckets() -> None:
    assert 0.05 in ITL_BUCKETS_S
    assert token_buckets(131072)[:6] == (1, 2, 5, 10, 20, 50)
    assert token_buckets(131072)[-1] == 100000


def test_holt_follows_a_linear_ramp() -> None:
    s = None
    for i in range(200):
        s = holt_update(s, 10 + 0.1 * (5 * i), 5.0 * i, alpha=0.3, beta=0.1)
    assert s is not None
    assert s.trend == pytest.approx(0.1, rel=0.05)
    assert holt_forecast(s, 60) == pytest.approx(10 + 0.1 * 995 + 6, rel=0.02)


def test_holt_refuses_non_finite_and_handles_time_going_back() -> None:
    s = HoltState(level=10.0, trend=1.0, at_s=100.0)
    with pytest.raises(ValueError):
        holt_update(s, math.nan, 105.0, 0.3, 0.1)
    back = holt_update(s, 20.0, 90.0, 0.5, 0.1)
    assert back.at_s == 100.0 and back.trend == 1.0 and back.level == 15.0
    assert holt_forecast(HoltState(1.0, -1.0, 0.0), 60) == 0.0


def test_ewma_is_sampling_rate_independent() -> None:
    a = ewma(ewma(0.0, 10.0, 5.0, 10.0), 10.0, 5.0, 10.0)
    b = ewma(0.0, 10.0, 10.0, 10.0)
    assert a == pytest.approx(b)


def test_ewma_edges_are_the_weights_limits_not_a_division_by_zero() -> None:
    """No time passed (a repeated instant, the clock stepped back): the old value,
    whatever the half-life (a zero half-life at dt 0 raised ZeroDivisionError). A zero
    or negative half-life with time passed remembers nothing: the new value."""
    for dt in (0.0, -5.0, math.nan):
        for hl in (0.0, 300.0, -1.0):
            assert ewma(2000.0, 4000.0, dt, hl) == 2000.0
    assert ewma(2000.0, 4000.0, 5.0, 0.0) == 4000.0
    assert ewma(2000.0, 4000.0, 5.0, -1.0) == 4000.0
    assert ewma(2000.0, 4000.0, 5.0, 300.0) == pytest.approx(2022.97, abs=0.01)


def test_profile_worked_examples() -> None:
    p = load_profile()
    m = p.step_model()
    assert p.kv_capacity_tokens == 464_688 and p.kv_capacity_blocks == 29_043
    assert m.decode_step_ms(1, 1000) == pytest.approx(7.365)
    assert m.prefill_ms(2048) == pytest.approx(50.4084, abs=1e-3)
    with pytest.raises(FileNotFoundError, match=r"shipped: llama-3\.1-8b-h100"):
        load_profile("no-such-profile")


def test_observation_refuses_non_finite_demand() -> None:
    with pytest.raises(ValueError, match="arrival_rate_rps"):
        Observation(model="m", observed_at_s=0.0, arrival_rate_rps=math.nan)
    assert (
        finite_or_none("inf") is None
        and finite_or_none("1.5") == 1.5
        and finite_or_none(None) is None
    )
