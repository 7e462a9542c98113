"""Scale from zero needs a demand signal that outlives the engines: `PrometheusSource`
with `ingress_rate_query` against a real Prometheus (the Debian package, started on a
free loopback port) scraping a fake gateway and a fake vLLM exporter every second.

The gateway (a counter per model, `gateway_requests_total`, growing at a set rate:
what an Envoy, an inference gateway or a router exports) counts requests for "cold",
a model with no engine at all (scaled to zero), and for "warm", whose one engine
(tests/integration/fake_vllm.py) completes 10 req/s while the gateway takes 40 (a
server falling behind before its engine):

- without the ingress query "cold" is no data, as before: no engine, no demand signal,
  and the source says it cannot see demand at zero (`sees_demand_at_zero` False);
- with it, "cold" is observed at the gateway's rate with no engine signal and
  `targets_up` 0, and "warm"'s arrival rate is the gateway's 40, not the engine's 10;
- `ControlLoop` over that source asks for one replica for "cold" at once
  (SCALE_FROM_ZERO), and none while the gateway is quiet;
- "gone", whose engine stops (just scaled to zero: its target is still within the
  lookback), is observed at the gateway's rate with `targets_up` 0 once the target reads
  down, where the source without the query reports `NoDataError(targets_up)`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from controller.config import GovernorConfig, PrometheusSettings
from controller.loop import ControlLoop
from controller.types import Reason
from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, NoDataError, Observation
from tests.conftest import make_model, make_policy
from tests.integration.conftest import one_engine
from tests.integration.fake_vllm import (
    FakeVllmCollector,
    ServedRegistry,
    serve_registry,
)
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

WINDOW_S = 10.0
COLD, WARM, GONE = "cold", "warm", "gone"
GATEWAY_RPS = {COLD: 3.0, WARM: 40.0, GONE: 2.0}
QUERY = "sum by (model_name) (rate(gateway_requests_total[{window}]))"


class GatewayCollector(Collector):
    """`gateway_requests_total{model_name}` growing at `rates` req/s since start."""

    def __init__(self, rates: dict[str, float]) -> None:
        self.rates = rates
        self.t0 = time.time()

    def collect(self) -> Iterator[CounterMetricFamily]:
        c = CounterMetricFamily(
            "gateway_requests", "Requests the gateway took.", labels=["model_name"]
        )
        for model, rps in self.rates.items():
            c.add_metric([model], rps * (time.time() - self.t0))
        yield c


def _engine(name: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FakeVllmCollector([one_engine(name)]))
    return registry


@dataclass
class World:
    prometheus: PrometheusServer
    gone_engine: ServedRegistry

    def source(self, ingress: str | None) -> PrometheusSource:
        settings = PrometheusSettings(
            url=self.prometheus.url, scrape_interval_s=SCRAPE_INTERVAL_S, ingress_rate_query=ingress
        )
        return PrometheusSource(settings, window_s=WINDOW_S, timeout_s=5.0)


def settled() -> float:
    """An evaluation time every scrape before it has been committed at."""
    return time.time() - 1.5 * SCRAPE_INTERVAL_S


@pytest.fixture(scope="module")
def world(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    gateway = CollectorRegistry()
    gateway.register(GatewayCollector(GATEWAY_RPS))
    served = [serve_registry(r) for r in (_engine(WARM), _engine(GONE), gateway)]
    prom: PrometheusServer | None = None
    try:
        workdir: Path = tmp_path_factory.mktemp("prometheus-ingress")
        jobs = {"engines": [served[0].target, served[1].target], "gateway": [served[2].target]}
        prom = PrometheusServer(prometheus_bin, workdir, jobs)
        prom.start()
        w = World(prom, served[1])

        def ready() -> bool:
            got = w.source(QUERY).observe([ModelQuery(COLD), ModelQuery(WARM)], settled())
            return all(isinstance(r, Observation) and r.running != 0 for r in got.values()) and (
                abs(got[COLD].arrival_rate_rps - GATEWAY_RPS[COLD]) < 0.3  # type: ignore[union-attr]
            )

        wait_for(ready, deadline_s=45.0, what="a full window of gateway and engine samples")
        yield w
    finally:
        if prom is not None:
            prom.stop()
        for s in served:
            s.stop()


def test_without_ingress_a_model_with_no_engine_is_no_data(world: World) -> None:
    src = world.source(None)
    got = src.observe([ModelQuery(COLD), ModelQuery(WARM)], settled())
    assert isinstance(got[COLD], NoDataError) and got[COLD].signal == "arrival_rate"
    warm = got[WARM]
    assert isinstance(warm, Observation) and warm.ingress_rate_rps is None
    assert warm.arrival_rate_rps == pytest.approx(10.0, rel=0.2)  # the engine's completions
    assert src.sees_demand_at_zero is False


def test_with_ingress_the_gateway_rate_is_the_demand(world: World) -> None:
    src = world.source(QUERY)
    got = src.observe([ModelQuery(COLD), ModelQuery(WARM)], settled())
    cold, warm = got[COLD], got[WARM]
    assert isinstance(cold, Observation) and isinstance(warm, Observation)
    assert cold.arrival_rate_rps == pytest.approx(GATEWAY_RPS[COLD], rel=0.1)
    assert cold.ingress_rate_rps == cold.arrival_rate_rps
    assert cold.targets_up == 0 and cold.running is None and cold.waiting is None
    # The gateway takes 40 req/s where the engine finishes 10: demand is what arrives.
    assert warm.arrival_rate_rps == pytest.approx(GATEWAY_RPS[WARM], rel=0.1)
    assert warm.running == 3.0 and warm.targets_up == 1
    assert src.sees_demand_at_zero is True
    assert src.queries_last_tick == len(list(src.queries.items()))  # no extra query


def test_the_loop_wakes_a_model_at_zero_on_gateway_traffic(world: World) -> None:
    policy = make_policy(scale_to_zero_idle_s=60.0)
    models = (make_model(COLD, min_replicas=0), make_model("quiet", min_replicas=0))
    config = GovernorConfig(models=models, policy=policy)
    loop = ControlLoop(config, world.source(QUERY), initial_replicas=lambda m: 0)
    loop.tick(settled())
    cold = loop.snapshot().models[COLD].decision
    assert cold is not None and cold.replicas == 1
    assert cold.stages[0].reason == Reason.SCALE_FROM_ZERO
    quiet = loop.snapshot().models["quiet"].decision  # no gateway series: no data, held
    assert quiet is not None and quiet.replicas == 0 and not quiet.valid


def test_a_fleet_just_scaled_to_zero_is_observed_at_the_gateway_rate(world: World) -> None:
    world.gone_engine.stop()  # the last engine of "gone" ends; its target stays known
    blind, seeing = world.source(None), world.source(QUERY)

    def down() -> bool:
        got = blind.observe([ModelQuery(GONE)], settled())[GONE]
        return isinstance(got, NoDataError) and got.signal == "targets_up"

    wait_for(down, deadline_s=20.0, what="the stopped engine's target read as down")
    gone = seeing.observe([ModelQuery(GONE)], settled())[GONE]
    assert isinstance(gone, Observation) and gone.targets_up == 0 and gone.running is None
    assert gone.arrival_rate_rps == pytest.approx(GATEWAY_RPS[GONE], rel=0.1)
