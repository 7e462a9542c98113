"""One missed scrape is not a dead target; two in a row are. A real Prometheus (1 s
scrapes) scrapes a fake vLLM exporter that answers 503 to the scrapes it is told to
fail: a failed scrape records `up` 0 and marks every series of the target stale, so an
instant query at that moment sees no gauges and a target down. `PrometheusSource`
reads gauges and `up` over two scrape intervals (`scrape_interval_s`):

- evaluated just after ONE failed scrape (the next one not yet due): `up` reads 0 there,
  yet the model is observed, its target up and its gauges at their last values;
- evaluated just after the second of TWO failed scrapes in a row: no data
  (`NoDataError(model, "targets_up")`), never an idle reading.

For a one-engine model at a 15 s scrape, a single missed scrape used to hold the model
(NO_DATA) for that tick; three such ticks reached the no-data fallback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from wsgiref.simple_server import WSGIServer, make_server

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from controller.config import PrometheusSettings
from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, NoDataError, Observation, ObservationResult
from tests.integration.conftest import MODEL_A, _enough_samples
from tests.integration.fake_vllm import FakeVllmCollector, _QuietHandler
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

WINDOW_S = 10.0
EVAL_AFTER_S = 0.3
"""How long after a failed scrape the source evaluates (before the next scrape, 1 s on)."""


@dataclass
class FlakyExporter:
    """Serves `registry`, answering 503 to the next `fail_next` scrapes; `failed_at`:
    the wall time of each failed scrape (unix seconds)."""

    registry: CollectorRegistry
    fail_next: int = 0
    failed_at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: WSGIServer | None = None

    def app(self, environ: object, start_response: Callable[..., object]) -> list[bytes]:
        with self.lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                self.failed_at.append(time.time())
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"busy\n"]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [generate_latest(self.registry)]

    def start(self) -> str:
        self.server = make_server(
            "127.0.0.1",
            0,
            self.app,  # type: ignore[arg-type]
            handler_class=_QuietHandler,
        )
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return f"127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def fail(self, scrapes: int) -> list[float]:
        """Fail the next `scrapes` scrapes; returns their times once all have happened
        and Prometheus has recorded them."""
        with self.lock:
            done = len(self.failed_at)
            self.fail_next = scrapes
        wait_for(lambda: len(self.failed_at) >= done + scrapes, 15.0, f"{scrapes} failed scrapes")
        times = self.failed_at[done:]
        time.sleep(EVAL_AFTER_S + 0.5)  # committed to the TSDB (the test's only wait)
        return times


@dataclass
class World:
    prometheus: PrometheusServer
    exporter: FlakyExporter
    target: str

    def observe(self, at_s: float) -> ObservationResult:
        settings = PrometheusSettings(url=self.prometheus.url, scrape_interval_s=SCRAPE_INTERVAL_S)
        src = PrometheusSource(settings, window_s=WINDOW_S, timeout_s=5.0)
        return src.observe([ModelQuery(MODEL_A.name)], at_s)[MODEL_A.name]

    def up(self, at_s: float) -> float | None:
        rows = self.prometheus.query(f'up{{instance="{self.target}"}}', at_s=at_s)
        return float(rows[0]["value"][1]) if rows else None


@pytest.fixture(scope="module")
def world(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    registry = CollectorRegistry()
    registry.register(FakeVllmCollector((MODEL_A,), batches_per_s=10.0))
    exporter = FlakyExporter(registry)
    target = exporter.start()
    workdir: Path = tmp_path_factory.mktemp("prometheus-missed")
    prom = PrometheusServer(prometheus_bin, workdir, {"vllm": [target]})
    try:
        prom.start()
        wait_for(
            lambda: _enough_samples(prom, {MODEL_A.name}, WINDOW_S),
            deadline_s=40.0,
            what="a full rate window of samples",
        )
        yield World(prom, exporter, target)
    finally:
        prom.stop()
        exporter.stop()


def test_one_missed_scrape_is_not_a_dead_target(world: World) -> None:
    wait_for(lambda: isinstance(world.observe(time.time() - 1.5), Observation), 15.0, "healthy")
    (failed,) = world.exporter.fail(1)
    at = failed + EVAL_AFTER_S
    assert world.up(at) == 0.0  # an instant read sees the target down and its series stale
    obs = world.observe(at)
    assert isinstance(obs, Observation), obs
    assert obs.targets_up == 1 and obs.targets_down == 0
    engines = MODEL_A.engines  # two engines behind the one target
    assert obs.running == sum(e.running for e in engines)  # their last values, not absent
    assert obs.waiting == sum(e.waiting for e in engines)
    assert obs.ready_replicas == 1  # one pod, however many engine ranks it runs
    assert obs.staleness_s <= 2 * SCRAPE_INTERVAL_S + EVAL_AFTER_S  # the scrape before


def test_two_missed_scrapes_in_a_row_are_no_data(world: World) -> None:
    wait_for(lambda: isinstance(world.observe(time.time() - 1.5), Observation), 15.0, "healthy")
    first, second = world.exporter.fail(2)
    assert second - first < 1.5 * SCRAPE_INTERVAL_S  # in a row
    at = second + EVAL_AFTER_S
    assert world.up(at) == 0.0
    result = world.observe(at)
    assert isinstance(result, NoDataError) and result.signal == "targets_up", result
    # recovered: the next successful scrape makes it observable again
    wait_for(lambda: isinstance(world.observe(time.time() - 1.5), Observation), 15.0, "back")
