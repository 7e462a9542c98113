"""SimulatedSource: Prometheus-style estimates against per-request ground truth."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from estimators.histogram import E2E_BUCKETS_S, TTFT_BUCKETS_S
from estimators.types import MetricSource, ModelQuery, NoDataError, Observation
from simulator.fleet import Fleet
from simulator.metrics import SimulatedSource
from simulator.traces import synthetic

MODEL = "llama"


@pytest.fixture(scope="module")
def loaded() -> tuple[Fleet, SimulatedSource]:
    fleet = Fleet(initial_replicas=2)
    src = SimulatedSource(fleet, MODEL, window_s=60.0, scrape_interval_s=5.0, growth="delta")
    fleet.submit_trace(synthetic("poisson", seed=11, rate=25.0, duration=400.0))
    fleet.advance_to(300.0)
    return fleet, src


def _same_bucket(estimate: float, truth: float, bounds: tuple[float, ...]) -> bool:
    """Both values in the same (lower, upper] bucket, or the estimate on its edge."""
    i = bisect.bisect_left(bounds, truth)
    lower = bounds[i - 1] if i > 0 else 0.0
    upper = bounds[i] if i < len(bounds) else float("inf")
    return lower <= estimate <= upper


def test_is_a_metric_source(loaded: tuple[Fleet, SimulatedSource]) -> None:
    assert isinstance(loaded[1], MetricSource)


def test_estimates_match_ground_truth(loaded: tuple[Fleet, SimulatedSource]) -> None:
    fleet, src = loaded
    q = ModelQuery(MODEL, ttft_sla_s=0.25, itl_sla_s=0.05)
    obs = src.observe([q], 300.0)[MODEL]
    assert isinstance(obs, Observation)
    rec = fleet.records()
    t0, t1 = 245.0, 300.0  # first and last scrape inside (240, 300]
    assert obs.staleness_s == 0.0 and obs.extra["window_s"] == t1 - t0
    arrived = (rec.arrival_s > t0) & (rec.arrival_s <= t1)
    finished = (rec.finish_s > t0) & (rec.finish_s <= t1)
    first = (rec.first_token_s > t0) & (rec.first_token_s <= t1)
    # completions + growth of waiting+running (last - first) = arrivals, exactly
    assert obs.arrival_rate_rps * (t1 - t0) == pytest.approx(arrived.sum(), abs=1e-6)
    assert obs.extra["completions_rps"] * (t1 - t0) == pytest.approx(finished.sum())
    # exact attainment where the SLA is a bucket edge (TTFT observed at the first token)
    ttft = rec.first_token_s - rec.dispatch_s
    assert obs.ttft_attainment_frac == pytest.approx(np.mean(ttft[first] <= 0.25))
    assert obs.ttft_attainment_frac is not None and obs.ttft_attainment_frac < 1.0
    # quantiles within bucket resolution
    assert obs.ttft_p95_ms is not None and obs.e2e_p99_ms is not None
    true_ttft_p95 = float(np.quantile(ttft[first], 0.95))
    assert _same_bucket(obs.ttft_p95_ms / 1000, true_ttft_p95, TTFT_BUCKETS_S)
    e2e = rec.finish_s - rec.dispatch_s
    true_e2e_p99 = float(np.quantile(e2e[finished], 0.99))
    assert _same_bucket(obs.e2e_p99_ms / 1000, true_e2e_p99, E2E_BUCKETS_S)
    # means from histogram sums are exact
    assert obs.prompt_tokens_mean == pytest.approx(rec.prompt_tokens[finished].mean())
    assert obs.output_tokens_mean == pytest.approx(rec.output_tokens[finished].mean())
    assert obs.prompt_tokens_p95 is not None and obs.prompt_tokens_mean is not None
    assert obs.prompt_tokens_p95 > obs.prompt_tokens_mean
    assert obs.itl_p95_ms is not None and 6.0 < obs.itl_p95_ms < 100.0
    assert obs.itl_attainment_frac is not None and 0.5 < obs.itl_attainment_frac <= 1.0
    # gauges from the newest sample
    engines = [e for _, e in fleet.live_engines()]
    assert obs.running == sum(e.num_running for e in engines)
    assert obs.waiting == sum(e.num_waiting for e in engines)
    assert obs.kv_usage_frac == pytest.approx(np.mean([e.kv_usage_frac for e in engines]))
    assert obs.ready_replicas == 2
    assert obs.gpu_busy_frac is not None and 0.3 < obs.gpu_busy_frac <= 1.0
    assert obs.prefix_cache_hit_frac == 0.0
    assert obs.preemption_rate_per_s == 0.0


def test_prefix_cache_hits_read_as_the_share_of_prompt_tokens_hit() -> None:
    """Engines finding half of every prompt in their prefix cache (whole 16-token
    blocks, so a little less than half of the tokens): the window reads that share, and
    the prefills that did not compute it finish sooner (a mean TTFT lower than without)."""

    def observe(hit: float) -> Observation:
        fleet = Fleet(initial_replicas=2, prefix_hit_frac=hit)
        src = SimulatedSource(fleet, MODEL, window_s=60.0, scrape_interval_s=5.0)
        fleet.submit_trace(synthetic("poisson", seed=11, rate=25.0, duration=400.0))
        fleet.advance_to(300.0)
        obs = src.observe([ModelQuery(MODEL)], 300.0)[MODEL]
        assert isinstance(obs, Observation)
        return obs

    half, none = observe(0.5), observe(0.0)
    assert half.prefix_cache_hit_frac is not None
    assert 0.45 < half.prefix_cache_hit_frac < 0.5
    assert none.prefix_cache_hit_frac == 0.0
    assert half.ttft_mean_ms is not None and none.ttft_mean_ms is not None
    assert half.ttft_mean_ms < none.ttft_mean_ms


def test_deriv_growth_and_short_window() -> None:
    fleet = Fleet(initial_replicas=2)
    src = SimulatedSource(fleet, MODEL, short_window_s=6.0)
    fleet.submit_trace(synthetic("step", seed=2, low=10.0, high=40.0, at=0.5, duration=400.0))
    fleet.advance_to(180.0)
    calm = src.observe([ModelQuery(MODEL)], 180.0)[MODEL]
    fleet.advance_to(205.0)
    burst = src.observe([ModelQuery(MODEL)], 205.0)[MODEL]
    assert isinstance(calm, Observation) and isinstance(burst, Observation)
    assert calm.arrival_rate_rps == pytest.approx(10.0, rel=0.25)
    assert calm.arrival_rate_short_rps is not None
    # Five seconds into the step the short window sees it; the long one barely does.
    assert burst.arrival_rate_short_rps is not None
    assert burst.arrival_rate_short_rps > 1.5 * burst.arrival_rate_rps
    plain = SimulatedSource(Fleet(), MODEL)
    assert plain.short_window_s is None


def test_replicas_added_to_a_queued_fleet_do_not_read_as_arrivals() -> None:
    """One replica holds ~2,800 queued requests at 60 req/s; two more start at 60 s.
    The router sends the new ones every arrival while the old one drains, so each new
    engine's own slope is near the whole arrival rate: summed per engine (PromQL's
    `sum(deriv(...))`) that read 111 req/s at 80 s. The slope of the fleet's sum reads
    the arrivals (58 req/s), as the exact last-minus-first count does."""
    fleet = Fleet(initial_replicas=1, cold_start_s=10.0)
    src = SimulatedSource(fleet, MODEL, window_s=60.0, scrape_interval_s=5.0)
    trace = synthetic("poisson", seed=3, rate=60.0, duration=200.0)
    fleet.submit_trace(trace)
    fleet.advance_to(60.0)
    fleet.scale_to(3, 60.0)
    for t in (80.0, 90.0, 100.0):
        fleet.advance_to(t)
        obs = src.observe([ModelQuery(MODEL)], t)[MODEL]
        assert isinstance(obs, Observation) and obs.ready_replicas == 3
        assert obs.waiting is not None and obs.waiting > 2_000  # still queued
        truth = np.count_nonzero((trace.arrival_s > t - 60.0) & (trace.arrival_s <= t)) / 60.0
        assert obs.arrival_rate_rps == pytest.approx(truth, rel=0.06)


def test_staleness_between_scrapes(loaded: tuple[Fleet, SimulatedSource]) -> None:
    src = loaded[1]
    obs = src.observe([ModelQuery(MODEL)], 298.0)[MODEL]
    assert isinstance(obs, Observation)
    assert obs.staleness_s == pytest.approx(3.0)
    assert obs.ttft_attainment_frac is None  # no SLA given


def test_no_data_before_two_scrapes_and_for_unknown_models() -> None:
    fleet = Fleet(initial_replicas=1)
    src = SimulatedSource(fleet, MODEL)
    fleet.advance_to(0.0)
    out = src.observe([ModelQuery(MODEL), ModelQuery("other")], 0.0)
    assert isinstance(out[MODEL], NoDataError) and isinstance(out["other"], NoDataError)
    fleet.advance_to(5.0)
    obs = src.observe([ModelQuery(MODEL)], 5.0)[MODEL]
    assert isinstance(obs, Observation)
    assert obs.arrival_rate_rps == 0.0  # idle but observed: a real zero
    assert obs.ttft_p95_ms is None  # nothing completed: no data, not 0
    assert obs.gpu_busy_frac == 0.0


def test_router_queue_keeps_demand_visible_at_zero_replicas() -> None:
    fleet = Fleet(initial_replicas=0, cold_start_s=100.0)
    with_router = SimulatedSource(fleet, MODEL, growth="delta")
    deriv = SimulatedSource(fleet, MODEL)
    vllm_only = SimulatedSource(fleet, MODEL, include_router=False)
    fleet.scale_to(1, 0.0)
    for i in range(30):
        fleet.submit(10.0 + i, 100, 10)
    fleet.advance_to(60.0)
    obs = with_router.observe([ModelQuery(MODEL)], 60.0)[MODEL]
    assert isinstance(obs, Observation)
    assert obs.arrival_rate_rps * 55.0 == pytest.approx(30.0)  # window (0, 60]: 5..60 s
    assert obs.extra["router_queue"] == 30.0 and obs.ready_replicas == 0
    assert obs.running is None  # no engine series: no data, never 0
    obs_d = deriv.observe([ModelQuery(MODEL)], 60.0)[MODEL]
    assert isinstance(obs_d, Observation) and obs_d.arrival_rate_rps > 0.3
    assert isinstance(vllm_only.observe([ModelQuery(MODEL)], 60.0)[MODEL], NoDataError)


def test_drained_engine_counts_until_it_disappears() -> None:
    fleet = Fleet(initial_replicas=2)
    src = SimulatedSource(fleet, MODEL, window_s=120.0)
    fleet.submit_trace(synthetic("poisson", seed=4, rate=10.0, duration=200.0))
    fleet.advance_to(100.0)
    fleet.scale_to(1)
    fleet.advance_to(200.0)
    obs = src.observe([ModelQuery(MODEL)], 200.0)[MODEL]
    assert isinstance(obs, Observation)
    rec = fleet.records()
    fin = (rec.finish_s > 85.0) & (rec.finish_s <= 200.0)
    # Like Prometheus, completions of the drained engine after its last scrape are lost.
    drained = next(r for r in fleet.replicas if r.gone_s is not None)
    assert drained.gone_s is not None and 100.0 < drained.gone_s < 200.0
    last_scrape = 5.0 * np.ceil(drained.gone_s / 5.0) - 5.0
    lost = (rec.replica == drained.replica_id) & (rec.finish_s > last_scrape)
    assert lost.sum() > 0
    assert obs.extra["completions_rps"] * 115.0 == pytest.approx((fin & ~lost).sum())
    assert obs.ready_replicas == 1


def test_render_text_parses_as_prometheus_exposition(
    loaded: tuple[Fleet, SimulatedSource],
) -> None:
    fleet, src = loaded
    text = src.render_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:request_success",
        "vllm:num_preemptions",
        "vllm:prefix_cache_hits",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:iteration_tokens_total",
    ):
        assert name in fams, name
    success = {s.labels["engine"]: s.value for s in fams["vllm:request_success"].samples}
    ttft_count = {
        s.labels["engine"]: s.value
        for s in fams["vllm:time_to_first_token_seconds"].samples
        if s.name.endswith("_count")
    }
    engines = dict(fleet.live_engines())
    assert set(success) == {str(r) for r in engines}
    for rid, eng in engines.items():
        assert success[str(rid)] == eng.metrics.success
        assert ttft_count[str(rid)] == sum(eng.metrics.ttft)
    assert all(s.labels["model_name"] == MODEL for s in fams["vllm:kv_cache_usage_perc"].samples)
