"""`Observation` is clean by construction: NaN, infinite and negative optional numbers
are None (missing data), so no reader has to clean it again (the decider does not)."""

from __future__ import annotations

import math
from dataclasses import fields, replace

import pytest

from estimators.types import OPTIONAL_NUMBERS, LatencyQuantiles, Observation


def test_every_optional_number_is_cleaned() -> None:
    # A new float/int field must be in the cleaned set, or readers could see a NaN.
    not_numbers = {"model", "observed_at_s", "arrival_rate_rps", "staleness_s", "extra"}
    dists = {"ttft_dist", "itl_dist", "e2e_dist"}
    assert set(OPTIONAL_NUMBERS) == {f.name for f in fields(Observation)} - not_numbers - dists


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, -3])
@pytest.mark.parametrize("name", OPTIONAL_NUMBERS)
def test_bad_optional_number_is_none(name: str, bad: float) -> None:
    o = Observation("m", 0.0, 1.0, **{name: bad})
    assert getattr(o, name) is None


def test_good_values_bools_and_non_numbers_are_kept() -> None:
    dist = LatencyQuantiles(p95_ms=-1.0)  # not a number field: left as given
    o = Observation(
        "m", 0.0, 2.0, running=0.0, waiting=3.5, ready_replicas=0, targets_up=2,
        kv_usage_frac=1.0, ttft_dist=dist, extra={"x": math.nan},
    )  # fmt: skip
    assert (o.running, o.waiting, o.ready_replicas, o.targets_up) == (0.0, 3.5, 0, 2)
    assert o.kv_usage_frac == 1.0 and o.ttft_dist is dist and math.isnan(o.extra["x"])


def test_replace_cleans_too() -> None:
    o = replace(Observation("m", 0.0, 1.0, waiting=2.0), waiting=math.nan, running=-2.0)
    assert o.waiting is None and o.running is None


def test_required_arrival_is_still_refused() -> None:
    with pytest.raises(ValueError, match="arrival_rate_rps"):
        Observation("m", 0.0, math.nan)


def test_latency_quantiles_read_the_distribution_and_fall_back_per_quantile() -> None:
    from estimators.types import latency_quantiles

    full = LatencyQuantiles(10.0, 20.0, 30.0, 40.0)
    o = Observation("m", 0.0, 1.0, ttft_dist=full, ttft_p95_ms=99.0)
    assert latency_quantiles(o, "ttft") == full  # the distribution wins where complete
    gap = LatencyQuantiles(10.0, 20.0, None, math.nan)
    o = Observation("m", 0.0, 1.0, ttft_dist=gap, ttft_p95_ms=99.0, extra={"ttft_p99_ms": 7.0})
    assert latency_quantiles(o, "ttft") == LatencyQuantiles(10.0, 20.0, 99.0, None)
    inf = LatencyQuantiles(10.0, 20.0, 30.0, math.inf)
    o = Observation("m", 0.0, 1.0, e2e_dist=inf, e2e_p99_ms=50.0)
    assert latency_quantiles(o, "e2e") == LatencyQuantiles(10.0, 20.0, 30.0, None)  # no data
