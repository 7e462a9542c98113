"""The drain's one grouped query (running requests per pod of a model) against a real
Prometheus scraping engine gauges labelled as a PodMonitor labels them (`namespace`,
`pod`): the answer maps every pod of the model in that namespace, and nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from actuators.drain import prometheus_running_by_pod
from estimators.prometheus import http_query_client
from tests.integration.fake_vllm import serve_registry
from tests.integration.promserver import PrometheusServer, wait_for

RUNNING = {  # (model, namespace, pod) -> running requests
    ("m", "llm", "m-1"): 5,
    ("m", "llm", "m-2"): 0,
    ("m", "llm", "m-3"): 2,
    ("m", "other", "m-9"): 7,  # same model name in another namespace
    ("n", "llm", "n-1"): 4,  # another model
}


@pytest.fixture(scope="module")
def prom_url(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    registry = CollectorRegistry()
    g = Gauge(
        "vllm:num_requests_running",
        "running requests",
        ["model_name", "namespace", "pod", "engine"],
        registry=registry,
    )
    for (model, ns, pod), v in RUNNING.items():
        g.labels(model, ns, pod, "0").set(v)
    served = serve_registry(registry)
    prom = PrometheusServer(
        prometheus_bin, Path(tmp_path_factory.mktemp("drain")), {"vllm": [served.target]}
    )
    try:
        prom.start()
        wait_for(lambda: len(prom.query("vllm:num_requests_running")) == 5, 30.0, "samples")
        yield prom.url
    finally:
        prom.stop()
        served.stop()


def test_running_by_pod_through_prometheus(prom_url: str) -> None:
    running = prometheus_running_by_pod(http_query_client(prom_url, 3.0, False, 0))
    assert running("m", "llm") == {"m-1": 5.0, "m-2": 0.0, "m-3": 2.0}
    assert running("absent", "llm") is None  # no series: unknown, not zero


def test_running_by_pod_prometheus_down() -> None:
    running = prometheus_running_by_pod(http_query_client("http://127.0.0.1:9", 0.5, False, 0))
    assert running("m", "llm") is None
