"""A governor host whose wall clock is off from Prometheus's (service.promclock), against a
real Prometheus.

Two fake vLLM exporters are scraped every second: model "now" exports as usual; model
"past" exports samples stamped 10 minutes before Prometheus's clock (explicit
timestamps in the exposition), so by Prometheus's clock its newest data is always 10
minutes old, while a host 10 minutes behind would see it as fresh. The host's clock is
injected (`SkewedClock`: the real clocks, wall time shifted); nothing sleeps for timing.

- host 10 minutes behind: "now" is observed at its current rate, "past" is no data
  (the wall-time adapter of before asked Prometheus's past: "now" had no data there
  and "past" read as fresh);
- host 10 minutes ahead: "now" is still observed (before: no data, forever);
- the skew is measured (about -600 / +600 s) and on /metrics' gauge after a tick;
- Prometheus unreachable: the tick has no data (SourceError), no skew is kept.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.config import GovernorConfig
from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, NoDataError, Observation, SourceError
from service.core import ServiceCore
from service.run import WallClockSource
from service.store import MemoryStore
from tests.integration.conftest import one_engine
from tests.integration.fake_vllm import FakeVllmCollector, ServedRegistry, serve_registry
from tests.integration.promserver import (
    SCRAPE_INTERVAL_S,
    PrometheusServer,
    free_port,
    wait_for,
)
from tests.service.fakes import quiet_logger

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

WINDOW_S = 5.0
SKEW_S = 600.0
BATCHES_PER_S = 10.0
NOW, PAST = "now", "past"
NOW_RPS = 1.0 * BATCHES_PER_S  # one engine, one completion per batch
MAX_STALENESS_S = 30.0
PAST_TARGET = {"job": "past-engines", "instance": "10.0.0.9:8000"}


class _Stamped(Collector):
    """`inner`'s samples stamped `shift_s` from the real clock (explicit timestamps), as
    the scrape target `PAST_TARGET` (its `job` and `instance` labels, kept by
    `honor_labels`), with that target's `up` 1 stamped alike: by Prometheus's clock a
    healthy fleet of `shift_s` ago that has sent nothing since."""

    def __init__(self, inner: FakeVllmCollector, shift_s: float) -> None:
        self.inner = inner
        self.shift_s = shift_s

    def collect(self) -> Iterator[Metric]:
        at_s = time.time() + self.shift_s
        up = GaugeMetricFamily("up", "the past target's health", labels=list(PAST_TARGET))
        up.add_metric(list(PAST_TARGET.values()), 1.0)
        for family in (*self.inner.collect(), up):
            family.samples = [
                s._replace(labels={**s.labels, **PAST_TARGET}, timestamp=at_s)
                for s in family.samples
            ]
            yield family


@dataclass
class SkewedClock:
    """The host's clocks with the wall clock `skew_s` seconds off (negative: behind)."""

    skew_s: float

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time() + self.skew_s


def _rate_models(prom: PrometheusServer, at_s: float) -> set[str]:
    rows = prom.query(
        f"sum by (model_name) (rate(vllm:request_success_total[{WINDOW_S:g}s]))", at_s=at_s
    )
    return {r["metric"].get("model_name", "") for r in rows}


@pytest.fixture(scope="module")
def prom(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping "now" (current samples) and "past" (stamped 10 min back)."""
    served: list[ServedRegistry] = []
    server: PrometheusServer | None = None
    try:
        now_reg, past_reg = CollectorRegistry(), CollectorRegistry()
        now_spec = replace(one_engine(NOW), itl_only=False)  # every histogram: decidable
        now_reg.register(FakeVllmCollector([now_spec], batches_per_s=BATCHES_PER_S))
        past_inner = FakeVllmCollector(
            [one_engine(PAST)],
            batches_per_s=BATCHES_PER_S,
            clock=lambda: time.time() - SKEW_S,
        )
        past_reg.register(_Stamped(past_inner, -SKEW_S))
        served = [serve_registry(now_reg), serve_registry(past_reg)]
        server = PrometheusServer(
            prometheus_bin,
            tmp_path_factory.mktemp("skew"),
            {"vllm": [served[0].target], "past": [served[1].target]},
            honor_labels=("past",),
        )
        server.start()
        p = server
        lag_s = WINDOW_S + 1.5 * SCRAPE_INTERVAL_S  # a full window, committed

        def ready() -> bool:
            now_s = time.time()
            return NOW in _rate_models(p, now_s) and PAST in _rate_models(p, now_s - SKEW_S)

        try:
            wait_for(ready, 40.0, "a rate window of both models")
            wait_for(lambda: NOW in _rate_models(p, time.time() - lag_s), 40.0, "a full window")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nPrometheus log:\n{server.log_tail()}") from None
        yield server.url
    finally:
        if server is not None:
            server.stop()
        for s in served:
            s.stop()


def _source(url: str, skew_s: float) -> WallClockSource:
    inner = PrometheusSource(
        url,
        window_s=WINDOW_S,
        short_window_s=WINDOW_S,
        timeout_s=5.0,
        max_staleness_s=MAX_STALENESS_S,
        scrape_interval_s=SCRAPE_INTERVAL_S,
    )
    return WallClockSource(inner, SkewedClock(skew_s), logger=quiet_logger())


def _observe(source: WallClockSource) -> dict[str, object]:
    return dict(source.observe([ModelQuery(NOW), ModelQuery(PAST)], time.monotonic()))


def test_the_past_is_visible_to_a_host_ten_minutes_behind(prom: str) -> None:
    """The world holds what the other tests rely on: "past" has fresh-looking data at
    Prometheus's time minus 10 minutes, read directly at that time."""
    inner = PrometheusSource(
        prom, window_s=WINDOW_S, timeout_s=5.0, scrape_interval_s=SCRAPE_INTERVAL_S
    )
    got = inner.observe([ModelQuery(PAST)], time.time() - SKEW_S)[PAST]
    assert isinstance(got, Observation), got
    assert got.staleness_s < MAX_STALENESS_S


@pytest.mark.parametrize("skew_s", [-SKEW_S, 0.0, SKEW_S], ids=["behind", "synced", "ahead"])
def test_old_data_never_reads_as_fresh(prom: str, skew_s: float) -> None:
    """ "past" (newest sample 10 minutes old by Prometheus's clock) is no data, however
    the host's clock is off; before, a host 10 minutes behind observed it as fresh."""
    got = _observe(_source(prom, skew_s))[PAST]
    assert isinstance(got, NoDataError), got


@pytest.mark.parametrize("skew_s", [-SKEW_S, 0.0, SKEW_S], ids=["behind", "synced", "ahead"])
def test_a_skewed_host_reads_current_data(prom: str, skew_s: float) -> None:
    """ "now" is observed at its current rate, at Prometheus's time, and the skew is
    measured; before, a host 10 minutes off either way had no data."""
    source = _source(prom, skew_s)
    now = _observe(source)[NOW]
    assert isinstance(now, Observation), now
    assert now.arrival_rate_rps == pytest.approx(NOW_RPS, rel=0.05)
    assert now.staleness_s < 3 * SCRAPE_INTERVAL_S
    assert abs(now.observed_at_s - time.time()) < 5.0  # Prometheus's (the real) time
    skew = source.clock_skew_s
    assert skew is not None and skew == pytest.approx(-skew_s, abs=2.0)


def test_the_skew_is_on_the_metrics_after_a_tick(prom: str) -> None:
    cfg = GovernorConfig.model_validate(
        {
            "models": [
                {
                    "name": NOW,
                    "deployment": NOW,
                    "sla": {"ttft_p95_ms": 2000, "itl_p95_ms": 100},
                    "replicas": {"min_replicas": 1, "max_replicas": 40},
                }
            ],
            "policy": {"window_s": WINDOW_S, "panic_window_s": WINDOW_S},
            "prometheus": {"scrape_interval_s": SCRAPE_INTERVAL_S},
        }
    )
    clock = SkewedClock(-SKEW_S)
    source = _source(prom, -SKEW_S)
    core = ServiceCore(cfg, source, MemoryStore(), clock=clock, logger=quiet_logger())
    try:
        decision = core.tick(clock.monotonic())[0]
        assert decision.valid and decision.demand_rps is not None, decision
        gauge = core.metrics.registry.get_sample_value("governor_prometheus_clock_skew_seconds")
        assert gauge == pytest.approx(SKEW_S, abs=2.0)
    finally:
        core.close()


def test_an_unreachable_prometheus_is_no_data_and_no_skew() -> None:
    source = _source(f"http://127.0.0.1:{free_port()}", -SKEW_S)
    with pytest.raises(SourceError):
        _observe(source)
    assert source.clock_skew_s is None
