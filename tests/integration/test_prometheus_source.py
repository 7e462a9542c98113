"""`PrometheusSource` against a real Prometheus scraping fake vLLM exporters.

The exporters (tests/integration/fake_vllm.py, fleet in conftest.py) emit known
distributions, so every estimate has a known right answer: quantiles equal the PromQL
interpolation of the known buckets (and the true quantile lies in the same bucket),
attainment is the exact bucket fraction, gauges are exact; rates equal PromQL's own
rate() exactly and the true rate within `RATE_REL`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_api_client import PrometheusConnect

from estimators.histogram import (
    E2E_BUCKETS_S,
    ITL_BUCKETS_S,
    PHASE_BUCKETS_S,
    QUEUE_BUCKETS_S,
    TPOT_BUCKETS_S,
    TTFT_BUCKETS_S,
    histogram_quantile,
)
from estimators.prometheus import PrometheusSource
from estimators.promql import (
    DECODE_METRICS,
    E2E_METRICS,
    ITL_METRICS,
    TPOT_METRICS,
    TTFT_METRICS,
    QueryBuilder,
)
from estimators.types import ModelQuery, NoDataError, Observation, ObservationResult
from tests.integration.conftest import (
    A_DECODE,
    A_TPOT,
    B_ITL,
    FLEET,
    MODEL_A,
    MODEL_B,
    MODEL_DRAIN,
    MODEL_DUAL,
    MODEL_ESCAPED,
    MODEL_LEGACY,
    MODEL_SHED,
    MODELS,
    VllmWorld,
)
from tests.integration.fake_vllm import (
    TOKEN_BUCKETS,
    ModelSpec,
    bucket_of,
    bucket_quantile,
    cumulative,
    true_quantile,
)
from tests.integration.promserver import SCRAPE_INTERVAL_S, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

MAX_QUERIES_PER_TICK = 15
RATE_REL = 0.15
"""Tolerance of a rate against its true value. rate() over a 5 s window of 1 s scrapes
is exact for a linear counter when scrapes are on time, but a scrape late by more than
10% of the interval makes PromQL extrapolate only half an interval at that end: up to
~12% low (seen on a loaded machine). Exact checks compare with PromQL itself instead."""


class CountingClient(PrometheusConnect):
    """A real PrometheusConnect that records every query and its parameters."""

    def __init__(self, url: str) -> None:
        super().__init__(url=url, timeout=5)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def custom_query(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        self.calls.append((query, dict(params or {})))
        return super().custom_query(query, params=params, timeout=timeout)  # type: ignore[arg-type]


_WORLD: list[VllmWorld] = []


@pytest.fixture(scope="module", autouse=True)
def _remember_world(vllm_world: VllmWorld) -> None:
    _WORLD[:] = [vllm_world]


def settled_now() -> float:
    """An evaluation time every scrape before it has been committed at (the queries of
    one tick then see the same samples), and with every scrape of the rate window before
    it successful: on a loaded machine the in-process exporters sometimes miss a 1 s
    scrape, which reads (correctly) as a target down or a rate from fewer samples.
    Polled with a deadline."""
    world = _WORLD[0]
    found: list[float] = []

    def healthy() -> bool:
        at = time.time() - 2.5 * SCRAPE_INTERVAL_S
        span = f"{world.window_s + 2 * SCRAPE_INTERVAL_S:g}s"
        rows = world.prometheus.query(f"min_over_time(up[{span}])", at_s=at)
        if rows and all(float(r["value"][1]) == 1.0 for r in rows):
            found.append(at)
            return True
        return False

    wait_for(healthy, 30.0, "a rate window in which every scrape succeeded")
    return found[-1]


def source(world: VllmWorld, **kwargs: Any) -> PrometheusSource:
    """A source on `world`, told the test Prometheus's scrape interval (the arrival
    rate's growth is a subquery with one point a scrape) unless `kwargs` say otherwise."""
    kwargs.setdefault("scrape_interval_s", SCRAPE_INTERVAL_S)
    return PrometheusSource(world.url, window_s=world.window_s, timeout_s=5.0, **kwargs)


def observed(results: dict[str, ObservationResult], name: str) -> Observation:
    result = results[name]
    assert isinstance(result, Observation), f"{name}: {result!r}"
    return result


def check_quantile(
    estimate: float | None,
    q: float,
    values: Sequence[float],
    bounds: Sequence[float],
    scale: float = 1.0,
) -> None:
    """`estimate` (in `scale` units) is the bucket interpolation, and the truth's bucket.

    Where the rank ties a bucket's count (B's TTFT p95: 19 of 20 at <= 20 ms), float
    noise in the summed rates picks that bound or interpolates in the next non-empty
    bucket (PromQL does the same): then it must lie between the truth's bucket's lower
    bound and the next bucket holding data."""
    assert estimate is not None
    rank = q * len(values)
    if any(math.isclose(rank, c) for _, c in cumulative(values, bounds)):
        lower, _ = bucket_of(true_quantile(q, values), bounds)
        above = [v for v in values if v > true_quantile(q, values)]
        upper = bucket_of(min(above), bounds)[1] if above else math.inf
        assert lower <= estimate / scale <= upper, (q, estimate)
        return
    expected = bucket_quantile(q, values, bounds)
    assert estimate / scale == pytest.approx(expected, rel=1e-9)
    lower, upper = bucket_of(true_quantile(q, values), bounds)
    assert lower * (1 - 1e-9) <= estimate / scale <= upper * (1 + 1e-9)


@pytest.fixture(scope="module")
def tick(vllm_world: VllmWorld) -> tuple[dict[str, ObservationResult], float, PrometheusSource]:
    """One observation of the main models with SLAs on (A) and off (B) bucket edges."""
    src = source(vllm_world)
    models = [
        ModelQuery(MODEL_A.name, ttft_sla_s=0.25, itl_sla_s=0.05),  # both bucket edges
        ModelQuery(MODEL_B.name, ttft_sla_s=0.3, itl_sla_s=0.1),  # 0.3 is no TTFT edge
        ModelQuery(MODEL_DRAIN.name),
        ModelQuery(MODEL_SHED.name),
        ModelQuery(MODEL_LEGACY.name, itl_sla_s=0.05),
        ModelQuery(MODEL_ESCAPED.name),
        ModelQuery(MODEL_DUAL.name, itl_sla_s=0.05),
    ]
    taken: list[tuple[dict[str, ObservationResult], float]] = []

    def every_model_observed() -> bool:
        at = settled_now()
        taken.append((src.observe(models, at), at))
        return all(isinstance(r, Observation) for r in taken[-1][0].values())

    # Polled with a deadline: on a loaded machine one scrape of the shared exporter may
    # time out, and at that instant its target reads down (no data, correctly).
    wait_for(every_model_observed, 20.0, "every model observed")
    results, now = taken[-1]
    return results, now, src


@pytest.mark.parametrize("spec", [MODEL_A, MODEL_B], ids=lambda s: s.name)
def test_latency_quantiles_are_promql_interpolations(
    spec: ModelSpec, tick: tuple[dict[str, ObservationResult], float, PrometheusSource]
) -> None:
    obs = observed(tick[0], spec.name)
    check_quantile(obs.ttft_p95_ms, 0.95, spec.ttft_s, TTFT_BUCKETS_S, 1000.0)
    check_quantile(obs.itl_p95_ms, 0.95, spec.itl_s, ITL_BUCKETS_S, 1000.0)
    check_quantile(obs.e2e_p99_ms, 0.99, spec.e2e_s, E2E_BUCKETS_S, 1000.0)
    check_quantile(obs.queue_time_p95_ms, 0.95, spec.queue_s, QUEUE_BUCKETS_S, 1000.0)


def test_hand_computed_quantiles(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    a = observed(tick[0], MODEL_A.name)
    assert a.itl_p95_ms == pytest.approx(65.625)  # 50 + 25 * (95 - 90) / 8
    assert a.ttft_p95_ms == pytest.approx(625.0)  # 500 + 250 * (19 - 18) / 2
    assert a.e2e_p99_ms == pytest.approx(12_500.0)  # 10 s + 5 s * (99 - 98) / 2
    b = observed(tick[0], MODEL_B.name)
    assert b.itl_p95_ms == pytest.approx(125.0)
    assert b.prompt_tokens_p95 == pytest.approx(2000.0)  # +Inf bucket: highest finite bound


def test_quantiles_equal_the_interpolation_of_the_raw_buckets(vllm_world: VllmWorld) -> None:
    """PromQL computes the quantiles now; they equal PromQL-style interpolation of the
    full bucket answer (the parser this replaced), so nothing changed for the decider."""
    src = source(vllm_world)
    now = settled_now()
    obs = observed(src.observe([ModelQuery(MODEL_A.name)], now), MODEL_A.name)
    builder = QueryBuilder(window_s=vllm_world.window_s)
    for estimate, q, metrics in (
        (obs.ttft_p95_ms, 0.95, TTFT_METRICS),
        (obs.itl_p95_ms, 0.95, ITL_METRICS),
        (obs.e2e_p99_ms, 0.99, E2E_METRICS),
        (obs.decode_time_p95_ms, 0.95, DECODE_METRICS),
        (obs.tpot_p95_ms, 0.95, TPOT_METRICS),
    ):
        rows = vllm_world.prometheus.query(builder.buckets(metrics), at_s=now)
        buckets = sorted(
            (float(r["metric"]["le"]), float(r["value"][1]))
            for r in rows
            if r["metric"]["model_name"] == MODEL_A.name
        )
        expected = histogram_quantile(q, buckets)
        assert estimate is not None and expected is not None, metrics
        assert estimate / 1000.0 == pytest.approx(expected, rel=1e-9), metrics


def test_latency_distributions(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    for spec in (MODEL_A, MODEL_B):
        obs = observed(tick[0], spec.name)
        for dist, values, bounds in (
            (obs.ttft_dist, spec.ttft_s, TTFT_BUCKETS_S),
            (obs.itl_dist, spec.itl_s, ITL_BUCKETS_S),
            (obs.e2e_dist, spec.e2e_s, E2E_BUCKETS_S),
        ):
            assert dist is not None
            for q, value in zip(
                (0.5, 0.9, 0.95, 0.99),
                (dist.p50_ms, dist.p90_ms, dist.p95_ms, dist.p99_ms),
                strict=True,
            ):
                check_quantile(value, q, values, bounds, 1000.0)
        assert obs.ttft_dist is not None and obs.ttft_p95_ms == obs.ttft_dist.p95_ms
        assert obs.e2e_dist is not None and obs.e2e_p99_ms == obs.e2e_dist.p99_ms
    a = observed(tick[0], MODEL_A.name)
    assert a.itl_dist is not None
    assert a.itl_dist.p50_ms == pytest.approx(10 + 15 * (50 - 0) / 60)  # 25 ms bucket
    assert a.itl_dist.p99_ms == pytest.approx(75 + 25 * (99 - 98) / 2)


def test_per_request_phases_tpot_and_step_tokens(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    """The signals of the seed policy (decode p95), of issue 12 item 7 (TPOT) and of the
    online plant calibration (means, tokens per step), from vLLM's own metric names."""
    a = observed(tick[0], MODEL_A.name)
    check_quantile(a.decode_time_p95_ms, 0.95, A_DECODE, PHASE_BUCKETS_S, 1000.0)
    assert a.decode_time_p95_ms == pytest.approx(1750.0)  # 1.5 s + 0.5 s * (95 - 90) / 10
    assert a.decode_time_mean_ms == pytest.approx(740.0, rel=1e-9)
    assert a.prefill_time_mean_ms == pytest.approx(100.0, rel=1e-9)
    assert a.queue_time_mean_ms == pytest.approx(130.0, rel=1e-9)  # 90 x 0.1 s, 10 x 0.4 s
    check_quantile(a.tpot_p95_ms, 0.95, A_TPOT, TPOT_BUCKETS_S, 1000.0)
    assert a.tpot_p95_ms == pytest.approx(62.5)
    assert a.tpot_attainment_frac == pytest.approx(0.9, rel=1e-12)  # TPOT <= 50 ms
    assert a.itl_mean_ms == pytest.approx(30.6, rel=1e-9)
    assert a.ttft_mean_ms == pytest.approx(116.0, rel=1e-9)
    assert a.step_tokens_mean == pytest.approx(288.0, rel=1e-9)
    b = observed(tick[0], MODEL_B.name)
    assert b.tpot_attainment_frac == pytest.approx(0.95, rel=1e-12)  # TPOT <= 100 ms
    # B's engines export no phase or step histograms: no data, never 0.
    for field in ("decode_time_p95_ms", "decode_time_mean_ms", "prefill_time_mean_ms"):
        assert getattr(b, field) is None, field
    assert b.step_tokens_mean is None
    assert b.queue_time_mean_ms == pytest.approx(50.0, rel=1e-9)  # B exports queue times
    assert b.itl_mean_ms == pytest.approx(1000 * sum(B_ITL) / len(B_ITL), rel=1e-9)


def test_seed_window_arrival(
    vllm_world: VllmWorld, tick: tuple[dict[str, ObservationResult], float, PrometheusSource]
) -> None:
    """The 5-minute arrival rate is PromQL's own over 300 s (a young fleet under-reads
    it: rate() divides by the whole window); over a window the data covers it is the
    true rate. It rides in the demand query: no extra round trip."""
    results, now, src = tick
    a = observed(results, MODEL_A.name)
    rows = vllm_world.prometheus.query(
        "sum by (model_name) (rate(vllm:request_success_total[300s]))", at_s=now
    )
    promql = {r["metric"]["model_name"]: float(r["value"][1]) for r in rows}
    assert a.arrival_rate_5m_rps == pytest.approx(promql[MODEL_A.name], rel=1e-9)
    short = source(vllm_world, seed_window_s=4.0)
    a4 = observed(short.observe([ModelQuery(MODEL_A.name)], now), MODEL_A.name)
    assert short.queries_last_tick == src.queries_last_tick
    bps = vllm_world.batches_per_s
    assert a4.arrival_rate_5m_rps == pytest.approx(MODEL_A.completions_rps(bps), rel=RATE_REL)
    none = source(vllm_world, seed_window_s=None)
    assert (
        observed(none.observe([ModelQuery(MODEL_A.name)], now), MODEL_A.name).arrival_rate_5m_rps
        is None
    )


def test_targets_up_from_the_scrape_targets(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    for spec in MODELS:  # all served by one exporter: one target, up
        obs = observed(tick[0], spec.name)
        assert (obs.targets_up, obs.targets_down) == (1, 0), spec.name


def test_stale_data_is_no_data(vllm_world: VllmWorld) -> None:
    """Evaluated 12 s after the newest sample (Prometheus still answers from its 5-minute
    lookback) the data is too old: no data, not an observation of an old instant."""
    later = time.time() + 12.0  # the 30 s rate window still holds samples
    src = PrometheusSource(vllm_world.url, window_s=30.0, timeout_s=5.0, max_staleness_s=10.0)
    results = src.observe([ModelQuery(MODEL_A.name)], later)
    err = results[MODEL_A.name]
    assert isinstance(err, NoDataError) and err.signal == "staleness", err
    assert "limit 10 s" in str(err)


@pytest.mark.parametrize("spec", [MODEL_A, MODEL_B], ids=lambda s: s.name)
def test_token_lengths(
    spec: ModelSpec, tick: tuple[dict[str, ObservationResult], float, PrometheusSource]
) -> None:
    obs = observed(tick[0], spec.name)
    check_quantile(obs.prompt_tokens_p95, 0.95, spec.prompt_tokens, TOKEN_BUCKETS)
    check_quantile(obs.output_tokens_p95, 0.95, spec.output_tokens, TOKEN_BUCKETS)
    mean_prompt = sum(spec.prompt_tokens) / len(spec.prompt_tokens)
    mean_output = sum(spec.output_tokens) / len(spec.output_tokens)
    assert obs.prompt_tokens_mean == pytest.approx(mean_prompt, rel=1e-9)
    assert obs.output_tokens_mean == pytest.approx(mean_output, rel=1e-9)


def test_hand_computed_token_means(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    a = observed(tick[0], MODEL_A.name)
    assert (a.prompt_tokens_mean, a.output_tokens_mean) == (pytest.approx(330), pytest.approx(84))


def test_arrival_rate_is_completions_plus_queue_growth(
    vllm_world: VllmWorld, tick: tuple[dict[str, ObservationResult], float, PrometheusSource]
) -> None:
    results, now, src = tick
    bps = vllm_world.batches_per_s
    a = observed(results, MODEL_A.name)
    b = observed(results, MODEL_B.name)
    # The completion rate is exactly what PromQL's rate() says at the same instant...
    w = f"{vllm_world.window_s:g}s"
    rows = vllm_world.prometheus.query(
        f"sum by (model_name) (rate(vllm:request_success_total[{w}]))", at_s=now
    )
    promql = {r["metric"]["model_name"]: float(r["value"][1]) for r in rows}
    for obs in (a, b):
        assert obs.extra["completions_rps"] == pytest.approx(promql[obs.model], rel=1e-9)
    # ...and close to the truth (rate() extrapolation under scrape jitter, see RATE_REL).
    assert a.extra["completions_rps"] == pytest.approx(MODEL_A.completions_rps(bps), rel=RATE_REL)
    assert b.extra["completions_rps"] == pytest.approx(MODEL_B.completions_rps(bps), rel=RATE_REL)
    # A's queue is flat: arrivals are the completions. B's grows 2/s: arrivals 30 + 2.
    assert a.arrival_rate_rps == pytest.approx(a.extra["completions_rps"], rel=1e-9)
    growth = b.arrival_rate_rps - b.extra["completions_rps"]
    assert growth == pytest.approx(MODEL_B.waiting_growth_rps(), abs=0.25)
    assert src.queries_last_tick <= MAX_QUERIES_PER_TICK


def test_arrival_rate_is_never_negative_while_a_queue_drains(
    vllm_world: VllmWorld, tick: tuple[dict[str, ObservationResult], float, PrometheusSource]
) -> None:
    drain = observed(tick[0], MODEL_DRAIN.name)  # 10 completions/s, queue -50/s
    assert drain.arrival_rate_rps == 0.0
    expected = MODEL_DRAIN.completions_rps(vllm_world.batches_per_s)
    assert drain.extra["completions_rps"] == pytest.approx(expected, rel=RATE_REL)


def test_arrival_rate_counts_what_the_front_end_refused_at_its_queue_limit(
    vllm_world: VllmWorld, tick: tuple[dict[str, ObservationResult], float, PrometheusSource]
) -> None:
    """vLLM 0.32 counts requests refused at `--max-num-queued-reqs` in
    vllm:admission_rejections_total; they never reach the queue, so with it pinned at its
    limit completions + growth read only what the fleet serves (10 req/s) where 40 are
    offered. The refused ones are demand too."""
    results, now, _ = tick
    shed = observed(results, MODEL_SHED.name)
    w = f"{vllm_world.window_s:g}s"
    rows = vllm_world.prometheus.query(
        f"sum by (model_name) (rate(vllm:admission_rejections_total[{w}]))", at_s=now
    )
    rejected = {r["metric"]["model_name"]: float(r["value"][1]) for r in rows}[MODEL_SHED.name]
    bps = vllm_world.batches_per_s
    assert rejected == pytest.approx(MODEL_SHED.rejections_per_batch * bps, rel=RATE_REL)
    completions = shed.extra["completions_rps"]
    assert completions == pytest.approx(MODEL_SHED.completions_rps(bps), rel=RATE_REL)
    assert shed.arrival_rate_rps == pytest.approx(completions + rejected, rel=1e-6)
    # a model without the counter (an older vLLM) keeps completions + growth
    a = observed(results, MODEL_A.name)
    assert a.arrival_rate_rps == pytest.approx(a.extra["completions_rps"], rel=1e-9)


def test_gauges_and_counter_rates(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    results, now, _ = tick
    a = observed(results, MODEL_A.name)
    assert (a.running, a.waiting, a.kv_usage_frac) == (8.0, 1.0, 0.5)
    assert a.ready_replicas == 1  # one pod (one target) with two engine ranks, DP=2
    assert a.prefix_cache_hit_frac == pytest.approx(0.75, rel=1e-9)
    # Counters of one target share sample times, so ratios of their rates are exact:
    # 0.1 preemptions per batch against 2 completions per batch.
    assert a.preemption_rate_per_s is not None
    assert a.preemption_rate_per_s / a.extra["completions_rps"] == pytest.approx(0.05, rel=1e-9)
    assert a.preemption_rate_per_s == pytest.approx(2.0, rel=RATE_REL)
    assert a.observed_at_s == now
    assert 0.0 <= a.staleness_s <= 3 * 1.0  # scrapes every second
    b = observed(results, MODEL_B.name)
    assert b.running == 12.0
    assert b.kv_usage_frac == pytest.approx(0.2)
    assert b.ready_replicas == 1  # three ranks, one pod
    assert b.waiting is not None and b.waiting > 2.0  # growing 2/s from 2
    assert b.prefix_cache_hit_frac is None  # 0 hits / 0 queries = NaN: no data, not 0
    assert b.preemption_rate_per_s == 0.0  # the counter exists and is flat: a real zero


def test_attainment_exact_on_bucket_edges_and_none_elsewhere(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    a = observed(tick[0], MODEL_A.name)
    assert a.ttft_attainment_frac == pytest.approx(18 / 20, rel=1e-12)  # TTFT <= 0.25 s
    assert a.itl_attainment_frac == pytest.approx(90 / 100, rel=1e-12)  # ITL <= 0.05 s
    b = observed(tick[0], MODEL_B.name)
    assert b.ttft_attainment_frac is None  # 0.3 s is not a TTFT bucket edge
    assert b.itl_attainment_frac == pytest.approx(90 / 100, rel=1e-12)  # ITL <= 0.1 s
    drain = observed(tick[0], MODEL_DRAIN.name)
    assert drain.ttft_attainment_frac is None and drain.itl_attainment_frac is None  # no SLA


def test_deprecated_metric_names(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    legacy = observed(tick[0], MODEL_LEGACY.name)  # gpu_cache_usage_perc, time_per_output...
    assert legacy.kv_usage_frac == 0.4
    check_quantile(legacy.itl_p95_ms, 0.95, MODEL_LEGACY.itl_s, ITL_BUCKETS_S, 1000.0)
    assert legacy.itl_p95_ms == pytest.approx(48.75)
    assert legacy.itl_attainment_frac == pytest.approx(1.0)
    assert legacy.prefix_cache_hit_frac == pytest.approx(0.25)  # gpu_prefix_cache_*


def test_current_name_wins_per_engine_over_deprecated(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    dual = observed(tick[0], MODEL_DUAL.name)  # exports both spellings, deprecated = decoy
    assert dual.kv_usage_frac == 0.3  # not 0.99, not their mean
    assert dual.itl_p95_ms == pytest.approx(65.625)  # not the 5 s decoy, not a mixture
    assert dual.itl_attainment_frac == pytest.approx(0.9)
    assert dual.prefix_cache_hit_frac == pytest.approx(0.5)
    assert dual.ready_replicas == 1


def test_escaped_metric_names(
    tick: tuple[dict[str, ObservationResult], float, PrometheusSource],
) -> None:
    esc = observed(tick[0], MODEL_ESCAPED.name)  # vllm_... as an OpenMetrics scrape stores
    assert (esc.running, esc.waiting, esc.kv_usage_frac, esc.ready_replicas) == (6, 3, 0.6, 1)
    assert esc.itl_p95_ms == pytest.approx(65.625)
    assert esc.arrival_rate_rps == pytest.approx(10.0, rel=RATE_REL)


def test_escaped_names_can_be_refused(vllm_world: VllmWorld) -> None:
    results = source(vllm_world, accept_escaped=False).observe(
        [ModelQuery(MODEL_ESCAPED.name), ModelQuery(MODEL_A.name)], settled_now()
    )
    assert isinstance(results[MODEL_ESCAPED.name], NoDataError)
    assert isinstance(results[MODEL_A.name], Observation)


def test_query_count_is_constant_in_the_number_of_models(vllm_world: VllmWorld) -> None:
    client = CountingClient(vllm_world.url)
    src = source(vllm_world, client=client)
    few = [ModelQuery(MODEL_A.name), ModelQuery(MODEL_B.name)]
    many = [ModelQuery(m.name) for m in FLEET]
    assert len(many) == 50

    small = src.observe(few, settled_now())
    calls_small = list(client.calls)
    client.calls.clear()
    large = src.observe(many, settled_now())
    calls_large = list(client.calls)

    assert len(calls_small) == len(calls_large) == src.queries_last_tick
    assert src.queries_last_tick <= MAX_QUERIES_PER_TICK
    assert src.queries_total == 2 * src.queries_last_tick
    assert [q for q, _ in calls_small] == [q for q, _ in calls_large]  # same text, no names
    for calls in (calls_small, calls_large):
        assert len({params["time"] for _, params in calls}) == 1  # one evaluation time
        assert all("timeout" in params for _, params in calls)
    assert set(small) == {MODEL_A.name, MODEL_B.name}
    assert set(large) == {m.name for m in FLEET}
    arrivals = []
    for spec in FLEET:
        obs = observed(large, spec.name)
        assert obs.running == spec.engines[0].running
        assert obs.itl_p95_ms == pytest.approx(65.625)
        arrivals.append(obs.arrival_rate_rps)
    assert max(arrivals) == pytest.approx(min(arrivals), rel=1e-9)  # one target, same counts
    assert arrivals[0] == pytest.approx(10.0, rel=RATE_REL)


def test_partial_answer_observes_present_models(vllm_world: VllmWorld) -> None:
    results = source(vllm_world).observe(
        [ModelQuery(MODEL_A.name), ModelQuery("no-such-model")], settled_now()
    )
    assert set(results) == {MODEL_A.name, "no-such-model"}  # others exported: ignored
    assert isinstance(results[MODEL_A.name], Observation)
    missing = results["no-such-model"]
    assert isinstance(missing, NoDataError)
    assert (missing.model, missing.signal) == ("no-such-model", "arrival_rate")


def test_evaluation_before_any_data_is_no_data(vllm_world: VllmWorld) -> None:
    results = source(vllm_world).observe(
        [ModelQuery(m.name) for m in MODELS], settled_now() - 3600.0
    )
    assert all(isinstance(r, NoDataError) for r in results.values())


def test_short_window_arrival_rides_in_the_demand_query(
    vllm_world: VllmWorld, tick: tuple[dict[str, ObservationResult], float, PrometheusSource]
) -> None:
    """The panic-window arrival rate costs no extra query and agrees with the long one
    on a stationary load (model A: flat queue)."""
    _, now, plain = tick
    short = source(vllm_world, short_window_s=3.0)  # three 1 s scrapes
    results = short.observe([ModelQuery(MODEL_A.name)], now)
    a = observed(results, MODEL_A.name)
    assert short.queries_last_tick == plain.queries_last_tick
    assert a.arrival_rate_short_rps is not None
    assert a.arrival_rate_short_rps == pytest.approx(a.arrival_rate_rps, rel=0.35)
    assert observed(tick[0], MODEL_A.name).arrival_rate_short_rps is None
