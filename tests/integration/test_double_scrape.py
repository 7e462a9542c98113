"""A pod scraped by two jobs counts once, against a real Prometheus.

Two scrape configs can select one engine pod: a ServiceMonitor and a PodMonitor, or a
hand-written job next to one. Prometheus then stores every series of the pod twice,
once per `job` (and with whatever other labels each config adds, e.g. a
ServiceMonitor's `service`), and every per-model sum counted the pod twice: demand
(the completion rate) doubled, and with it the replicas asked for; running, waiting,
preemptions, ready replicas and targets doubled; means, quantiles and attainment
weighted the pod twice against the fleet's other pods. Here a fake vLLM exporter
(tests/integration/fake_vllm.py, one pod with two engine ranks, ITL 20 ms) is scraped
by jobs `engines` (which adds `service`) and `podmonitor`, and a second exporter of the
same model (one engine, ITL 90 ms) by `engines` alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, Observation, ObservationResult
from tests.integration.conftest import _enough_samples, one_engine
from tests.integration.fake_vllm import (
    EngineSpec,
    serving,
)
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

MODEL = "twice"
WINDOW_S = 5.0
RATE_REL = 0.15
"""Tolerance of a rate read from Prometheus (extrapolation at the window's ends)."""
TWICE = replace(
    one_engine(MODEL),
    engines=(EngineSpec(3, 1, 0.4), EngineSpec(5, 0, 0.6)),
    itl_s=(0.02,) * 10,
    preemptions_per_batch=0.1,
)
"""The pod both jobs scrape: two engine ranks, 10 completions/s and 1 preemption/s each."""
ONCE = replace(one_engine(MODEL), engines=(EngineSpec(2, 0, 0.2),), itl_s=(0.09,) * 10)
"""The pod one job scrapes: one engine, 10 completions/s, no preemptions."""


@pytest.fixture(scope="module")
def served(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Prometheus URL, once a full rate window of both pods has been scraped."""
    workdir: Path = tmp_path_factory.mktemp("prometheus-double")
    with serving([TWICE, ONCE]) as (twice, once):
        jobs = {"engines": [twice, once], "podmonitor": [twice]}
        labels = {"engines": {"service": "vllm"}}
        with PrometheusServer(prometheus_bin, workdir, jobs, job_labels=labels) as p:
            wait_for(lambda: len(p.query("up == 1")) == 3, 30.0, "three scrapes up")
            wait_for(
                lambda: _enough_samples(p, {MODEL}, WINDOW_S),
                deadline_s=30.0,
                what="a full rate window of samples",
            )
            yield p.url


def _observe(url: str) -> ObservationResult:
    src = PrometheusSource(
        url, window_s=WINDOW_S, timeout_s=5.0, scrape_interval_s=SCRAPE_INTERVAL_S
    )
    query = ModelQuery(MODEL, itl_sla_s=0.05)  # an ITL bucket edge: exact attainment
    return src.observe([query], time.time() - 1.5 * SCRAPE_INTERVAL_S)[MODEL]


def test_a_pod_scraped_by_two_jobs_counts_once(served: str) -> None:
    seen: list[ObservationResult] = []

    def observed() -> bool:
        seen.append(_observe(served))
        return isinstance(seen[-1], Observation)

    wait_for(observed, deadline_s=20.0, what="the model observed")
    obs = seen[-1]
    assert isinstance(obs, Observation)
    # Summed per (job, ...), the doubled pod read: 18, 2, 3, 3, 50 and 4.
    assert (obs.running, obs.waiting) == (10.0, 1.0)
    assert obs.ready_replicas == 2
    assert (obs.targets_up, obs.targets_down) == (2, 0)
    completions = 10.0 * len(TWICE.engines) + 10.0 * len(ONCE.engines)
    assert obs.extra["completions_rps"] == pytest.approx(completions, rel=RATE_REL)
    assert obs.arrival_rate_rps == pytest.approx(completions, rel=RATE_REL)
    assert obs.preemption_rate_per_s == pytest.approx(2.0, rel=RATE_REL)
    # Weighted by engines, each pod once (doubled: 0.44, 0.8 and 34 ms).
    assert obs.kv_usage_frac == pytest.approx(0.4)
    assert obs.itl_attainment_frac == pytest.approx(2 / 3, abs=0.05)  # ITL <= 50 ms
    assert obs.itl_mean_ms == pytest.approx((2 * 20.0 + 90.0) / 3, rel=0.05)
