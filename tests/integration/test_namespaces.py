"""One model name served in two namespaces, against a real Prometheus.

A shared Prometheus scrapes every team's engines; Kubernetes service discovery (a
ServiceMonitor, a PodMonitor) labels each series with its pod's `namespace`. Grouped by
the model label alone, a model's signals were the sum over every namespace serving a
model of that name: a staging load test read as production demand, and a production
fleet that was not reporting at all read as observed (another namespace's engines
answered for it) instead of no data. Here fake vLLM exporters
(tests/integration/fake_vllm.py) of one model name run in namespaces `prod` (one engine,
3 running) and `staging` (two engines, 3 running each), next to another model exported
without a namespace label (a scrape config that does not add one).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, NoDataError, Observation, ObservationResult
from tests.integration.conftest import one_engine
from tests.integration.fake_vllm import (
    EngineSpec,
    serving,
)
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SHARED, PLAIN = "shared-model", "plain-model"
PROD, STAGING = "prod", "staging"
INGRESS = "sum by (model_name) (rate(vllm:request_success_total[{window}]))"
"""An operator's ingress query grouped by the model label alone (no namespace)."""


@pytest.fixture(scope="module")
def served(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Prometheus URL, once every exporter has been scraped."""
    staging = replace(one_engine(SHARED), engines=(EngineSpec(3, 0, 0.4),) * 2)
    workdir: Path = tmp_path_factory.mktemp("prometheus-namespaces")
    with serving([one_engine(SHARED), staging, one_engine(PLAIN)]) as targets:
        prod_t, staging_t, _plain_t = targets
        labels = {prod_t: {"namespace": PROD}, staging_t: {"namespace": STAGING}}
        jobs = {"engines": targets}
        with PrometheusServer(prometheus_bin, workdir, jobs, target_labels=labels) as prom:
            wait_for(lambda: len(prom.query("up == 1")) == 3, 30.0, "three engine targets up")
            yield prom.url


def _observe(url: str, queries: list[ModelQuery], **kwargs: object) -> dict[str, ObservationResult]:
    src = PrometheusSource(
        url, window_s=10.0, timeout_s=5.0, scrape_interval_s=SCRAPE_INTERVAL_S, **kwargs
    )
    return src.observe(queries, time.time() - 1.5 * SCRAPE_INTERVAL_S)


def _settled(url: str, queries: list[ModelQuery], **kwargs: object) -> dict[str, ObservationResult]:
    """The first observation where every model that has engines is observed."""
    seen: list[dict[str, ObservationResult]] = []

    def ready() -> bool:
        seen.append(_observe(url, queries, **kwargs))
        return all(
            isinstance(r, Observation) and r.running is not None
            for q, r in zip(queries, seen[-1].values(), strict=True)
            if q.namespace != "elsewhere"
        )

    wait_for(ready, deadline_s=20.0, what="every model with engines observed")
    return seen[-1]


def test_a_model_reads_its_own_namespace_only(served: str) -> None:
    prod, staging = ModelQuery(SHARED, namespace=PROD), ModelQuery(SHARED, namespace=STAGING)
    for q, running in ((prod, 3.0), (staging, 6.0)):
        obs = _settled(served, [q])[SHARED]
        assert isinstance(obs, Observation)
        assert obs.running == running  # summed over both namespaces: 9
        # One pod each (staging's runs two engine ranks); leaked: 2 and 2.
        assert obs.ready_replicas == 1 and obs.targets_up == 1


def test_a_namespace_without_engines_is_no_data_not_another_namespaces_fleet(
    served: str,
) -> None:
    """Before: `elsewhere`'s model read staging's and prod's engines as its own."""
    result = _settled(served, [ModelQuery(SHARED, namespace="elsewhere")])[SHARED]
    assert isinstance(result, NoDataError)
    assert result.signal == "arrival_rate"


def test_series_without_the_label_and_an_ingress_by_model_alone_still_read(served: str) -> None:
    queries = [ModelQuery(PLAIN, namespace=PROD), ModelQuery(SHARED, namespace=PROD)]
    out = _settled(served, queries, ingress_rate_query=INGRESS)
    plain, shared = out[PLAIN], out[SHARED]
    assert isinstance(plain, Observation) and plain.running == 3.0
    assert isinstance(shared, Observation) and shared.running == 3.0
    assert shared.ingress_rate_rps is not None and shared.ingress_rate_rps > 0.0


def test_without_a_namespace_label_every_namespace_is_summed(served: str) -> None:
    """`namespace_label=None` (prometheus.namespace_label: null) is the old grouping."""
    obs = _settled(served, [ModelQuery(SHARED, namespace=PROD)], namespace_label=None)[SHARED]
    assert isinstance(obs, Observation) and obs.running == 9.0
