"""A pod IP reused by a new pod: two `up` series of one instance, against a real
Prometheus.

Service discovery names an engine target by its pod IP and port (`instance`) and labels
it with the pod; when a deleted pod's IP goes to a new pod within the source's lookback
(two scrape intervals), `up` holds two series of one instance that differ only in
`pod`. The state query joins the engine targets with `up` on the instance; matched one
to one, such a pair made Prometheus refuse the whole query ("found duplicate series for
the match group"), so every model of the tick had no data. Here two fake vLLM exporters
(tests/integration/fake_vllm.py) of one model are scraped under one `instance` label
with different `pod` labels (the two pods of one IP), next to another model's engine.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, Observation, ObservationResult
from tests.integration.conftest import one_engine
from tests.integration.fake_vllm import serving
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

REUSED, OTHER = "reused", "other"
SHARED_INSTANCE = "10.0.0.7:8000"


@pytest.fixture(scope="module")
def served(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Prometheus URL, once both pods of the shared instance have been scraped."""
    workdir: Path = tmp_path_factory.mktemp("prometheus-reused")
    with serving([one_engine(REUSED), one_engine(REUSED), one_engine(OTHER)]) as targets:
        old, new, _other = targets
        labels = {
            old: {"instance": SHARED_INSTANCE, "pod": "engine-old"},
            new: {"instance": SHARED_INSTANCE, "pod": "engine-new"},
        }
        jobs = {"engines": targets}
        with PrometheusServer(prometheus_bin, workdir, jobs, target_labels=labels) as prom:

            def both_pods_up() -> bool:
                rows = prom.query(f'up{{instance="{SHARED_INSTANCE}"}} == 1')
                return len(rows) == 2

            wait_for(both_pods_up, 30.0, "two up series of the shared instance")
            yield prom.url


def _observe(url: str) -> dict[str, ObservationResult]:
    src = PrometheusSource(url, window_s=10.0, timeout_s=5.0, scrape_interval_s=SCRAPE_INTERVAL_S)
    return src.observe([ModelQuery(REUSED), ModelQuery(OTHER)], _now())


def _now() -> float:
    return time.time() - 1.5 * SCRAPE_INTERVAL_S  # every scrape before it committed


def test_two_up_series_of_one_instance_still_observe_every_model(served: str) -> None:
    seen: list[dict[str, ObservationResult]] = []

    def observed() -> bool:
        seen.append(_observe(served))  # a SourceError (the refused join) fails here
        return all(isinstance(r, Observation) for r in seen[-1].values())

    wait_for(observed, deadline_s=20.0, what="both models observed")
    reused = seen[-1][REUSED]
    assert isinstance(reused, Observation)
    assert reused.targets_up == 1 and reused.targets_down == 0  # one instance, up
    assert isinstance(seen[-1][OTHER], Observation)
