"""Ready replicas are pods (scrape targets), not vLLM data-parallel ranks, against a
real Prometheus.

vLLM started with `--data-parallel-size N` runs N engine cores behind one API server and
exports one series per core from that pod's single /metrics endpoint, labelled
`engine="0"`, `engine="1"`, ... (vllm/v1/metrics/loggers.py: label names `model_name`,
`engine`, one set of label values per engine index). The state query counted the series
of `vllm:num_requests_running` as ready replicas, so a fleet of 2 pods at DP=2 read 4
while the Deployment asked for 2: the controller took a half-started fleet for whole
and divided the load by twice the pods. Here one fake vLLM exporter
(tests/integration/fake_vllm.py) has two engine ranks and another has one, both of
model "dp": two ready replicas, with the gauges still summed over all three engines.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, Observation, ObservationResult
from tests.integration.conftest import one_engine
from tests.integration.fake_vllm import (
    EngineSpec,
    serving,
)
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

DP = "dp"
TWO_RANKS = replace(one_engine(DP), engines=(EngineSpec(3, 1, 0.4), EngineSpec(5, 0, 0.6)))
"""One pod at `--data-parallel-size 2`: two engine ranks on one /metrics endpoint."""
ONE_RANK = replace(one_engine(DP), engines=(EngineSpec(2, 0, 0.2),))


@pytest.fixture(scope="module")
def served(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Prometheus URL, once both pods have been scraped."""
    workdir: Path = tmp_path_factory.mktemp("prometheus-dp")
    with (
        serving([TWO_RANKS, ONE_RANK]) as targets,
        PrometheusServer(prometheus_bin, workdir, {"engines": targets}) as prom,
    ):
        wait_for(lambda: len(prom.query("up == 1")) == 2, 30.0, "two engine targets up")
        yield prom.url


def _observe(url: str) -> ObservationResult:
    src = PrometheusSource(url, window_s=10.0, timeout_s=5.0, scrape_interval_s=SCRAPE_INTERVAL_S)
    return src.observe([ModelQuery(DP)], time.time() - 1.5 * SCRAPE_INTERVAL_S)[DP]


def test_ready_replicas_count_pods_not_data_parallel_ranks(served: str) -> None:
    seen: list[ObservationResult] = []

    def observed() -> bool:
        seen.append(_observe(served))
        obs = seen[-1]
        return isinstance(obs, Observation) and obs.running == 10.0

    wait_for(observed, deadline_s=20.0, what="both pods observed")
    obs = seen[-1]
    assert isinstance(obs, Observation)
    assert obs.ready_replicas == 2  # the engine series: 3
    assert (obs.targets_up, obs.targets_down) == (2, 0)
    assert (obs.running, obs.waiting) == (10.0, 1.0)  # still summed over every rank
    assert obs.kv_usage_frac == pytest.approx(0.4)  # the mean over the three ranks
