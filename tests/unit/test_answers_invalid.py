"""Answers a real Prometheus cannot give from vLLM's series but a misbehaving backend, a
recording rule or an operator's query can (estimators.answers, estimators.types): each
is no reading, never a number the decider sizes on."""

from __future__ import annotations

import math

import pytest

from estimators.answers import BUCKET_NOISE, _dist, edge_buckets
from estimators.histogram import fraction_le
from estimators.types import FRACTIONS, TOKEN_LENGTHS, Observation


def _attainment(by_le: dict[str, float], sla_s: float = 0.5) -> float | None:
    """The share within `sla_s` that `edge_buckets` then `fraction_le` read off one
    model's bucket rates (`le` text -> rate)."""
    buckets = edge_buckets({"ttft": {"m": by_le}}).get("ttft", {}).get("m")
    return None if buckets is None else fraction_le(sla_s, buckets)


def test_buckets_that_fall_past_noise_are_no_attainment() -> None:
    """The running maximum against float noise made `+Inf` at 0 under `le="0.5"` at 4
    read 100 % within 500 ms (and grew the capacity correction where TTFT p95 read
    3 s); a lower bucket over a higher one, or one bound spelled twice summing past
    `+Inf`, read 100 % or 80 % where no share is known."""
    assert _attainment({"0.5": 4.0, "+Inf": 0.0}) is None
    assert _attainment({"0.05": 10.0, "0.1": 2.0, "0.5": 9.0, "+Inf": 10.0}) is None
    assert _attainment({"0.5": 4.0, "5e-01": 4.0, "+Inf": 5.0}) is None
    # noise within BUCKET_NOISE is held by the running maximum, as before
    noisy = 8.0 * (1.0 - BUCKET_NOISE / 2.0)
    assert _attainment({"0.1": 8.0, "0.5": noisy, "+Inf": 10.0}) == pytest.approx(0.8)
    assert _attainment({"0.5": 4.0, "5e-01": 4.0, "+Inf": 10.0}) == pytest.approx(0.8)


def test_a_share_past_1_and_a_length_under_a_token_are_none() -> None:
    """A prefix-hit share of 3 priced every prompt at the cap of hits (6 replicas where
    16 serve); a prompt mean of 0 read 88 req/s a replica. Float noise past 1 reads 1."""
    obs = Observation(
        model="m",
        observed_at_s=0.0,
        arrival_rate_rps=1.0,
        prefix_cache_hit_frac=3.0,
        kv_usage_frac=1.0 + 1e-9,
        ttft_attainment_frac=1.0,
        prompt_tokens_mean=0.0,
        output_tokens_p95=0.5,
        output_tokens_mean=1.0,
    )
    assert obs.prefix_cache_hit_frac is None
    assert obs.kv_usage_frac == 1.0 and obs.ttft_attainment_frac == 1.0
    assert obs.prompt_tokens_mean is None and obs.output_tokens_p95 is None
    assert obs.output_tokens_mean == 1.0
    assert {"prefix_cache_hit_frac", "ttft_attainment_frac", "kv_usage_frac"} <= set(FRACTIONS)
    assert len(TOKEN_LENGTHS) == 4


def test_latency_quantiles_below_0_or_past_a_float_are_none() -> None:
    tags = ("p50", "p90", "p95", "p99")
    assert _dist({"p50": -0.5, "p99": 1e306}, tags) is None
    got = _dist({"p50": 0.1, "p90": -1.0, "p95": math.inf, "p99": 0.4}, tags)
    assert got is not None
    assert (got.p50_ms, got.p90_ms, got.p95_ms) == (pytest.approx(100.0), None, None)
    assert got.p99_ms == pytest.approx(400.0)
