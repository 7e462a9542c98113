"""A dead fleet is not an idle fleet: a real Prometheus (1 s scrapes) scrapes a fake
vLLM exporter with vLLM's metric names; the exporter then vanishes. The observations the
real `PrometheusSource` makes of it, before and after, are recorded once (real time,
polled with a deadline) and fed to the decider under every stabilization setting: after
the targets vanish it holds (NO_DATA_HOLD) and never scales down.

Real parts: Prometheus, its scraping and staleness handling, the source's PromQL. The
exporter is the tests' fake vLLM (no GPU engine can run here)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from controller.config import PrometheusSettings
from controller.decider import Decider
from controller.types import Reason
from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, NoDataError, Observation, SourceError
from tests.conftest import make_model, make_policy
from tests.integration.conftest import MODEL_A, _enough_samples
from tests.integration.fake_vllm import FakeVllmCollector, serve_registry
from tests.integration.promserver import PrometheusServer, wait_for

pytestmark = pytest.mark.slow

WINDOW_S = 10.0
TICK_S = 1.0
START_REPLICAS = 4


@dataclass
class Recording:
    ticks: list[tuple[float, Observation | NoDataError | SourceError]]
    vanished_at_s: float


@pytest.fixture(scope="module")
def recording(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    registry = CollectorRegistry()
    registry.register(FakeVllmCollector((MODEL_A,), batches_per_s=10.0))
    served = serve_registry(registry)
    prom = PrometheusServer(
        prometheus_bin, tmp_path_factory.mktemp("dead"), {"vllm": [served.target]}
    )
    stopped = False
    try:
        prom.start()
        wait_for(
            lambda: _enough_samples(prom, {MODEL_A.name}, WINDOW_S),
            deadline_s=40.0,
            what="a full rate window of samples",
        )
        source = PrometheusSource(
            PrometheusSettings(url=prom.url, scrape_interval_s=1.0),
            window_s=WINDOW_S,
            short_window_s=2.0,
        )
        query = [ModelQuery(MODEL_A.name, 0.5, 0.05)]
        ticks: list[tuple[float, Observation | NoDataError | SourceError]] = []

        def tick() -> None:
            now = time.time()
            try:
                got: Observation | NoDataError | SourceError = source.observe(query, now)[
                    MODEL_A.name
                ]
            except SourceError as exc:
                got = exc
            ticks.append((now, got))

        def healthy_ticks(n: int) -> bool:
            tick()
            return len(ticks) >= n

        wait_for(lambda: healthy_ticks(3), deadline_s=20.0, what="3 ticks", poll_s=TICK_S)
        served.stop()
        stopped = True
        vanished = time.time()
        # ticks over more than one rate window after the exporter is gone
        wait_for(
            lambda: healthy_ticks(3) and time.time() - vanished > WINDOW_S + 3.0,
            deadline_s=WINDOW_S + 30.0,
            what="ticks over a window after the targets vanished",
            poll_s=TICK_S,
        )
        return Recording(ticks, vanished)
    finally:
        prom.stop()
        if not stopped:
            served.stop()


@pytest.mark.parametrize("stabilization_s", [0.0, 10.0, 60.0, 300.0])
def test_targets_that_vanish_hold_and_never_scale_down(
    recording: Recording, stabilization_s: float
) -> None:
    policy = make_policy(
        window_s=WINDOW_S,
        panic_window_s=2.0,
        tick_interval_s=TICK_S,
        scale_down_stabilization_s=stabilization_s,
        max_staleness_s=5.0,
        # a small per-replica capacity, so the healthy fleet needs several replicas and
        # a scale-down on the dead one would show
        target_utilization_frac=0.15,
    )
    d = Decider(make_model(max_replicas=20), policy)
    first = recording.ticks[0][0]
    state = d.initial_state(START_REPLICAS, now_s=first - 1000.0)  # windows long expired
    before = None
    after = []
    for t, o in recording.ticks:
        dec, state = d.decide(o, state, t)
        if t < recording.vanished_at_s:
            before = dec
        else:
            after.append(dec)
    assert before is not None and before.valid, "healthy ticks before the targets vanished"
    assert before.replicas >= 3, before.explain()
    assert len(after) >= WINDOW_S / TICK_S
    floor = before.replicas
    assert all(dec.replicas >= floor for dec in after), [
        (round(dec.at_s - recording.vanished_at_s, 1), dec.replicas, dec.reasons) for dec in after
    ]
    # within two scrapes and a tick of the vanish every decision is a hold
    late = [dec for dec in after if dec.at_s - recording.vanished_at_s > 3.0]
    assert late and all(not dec.valid or Reason.NO_DATA_FALLBACK in dec.reasons for dec in late), [
        (round(dec.at_s - recording.vanished_at_s, 1), dec.reasons) for dec in late
    ]
    assert any(Reason.NO_DATA_HOLD in dec.reasons for dec in after)
