"""A dead fleet is not an idle fleet (issue 10 item 5): `PrometheusSource` against a real
Prometheus whose engine targets go down, then vanish from service discovery.

Three fake vLLM exporters (tests/integration/fake_vllm.py) are scraped every second:
two serve model "dead" (one engine each), one serves model "alive". The test stops the
"dead" exporters and removes them from the scrape config (a deleted pod), one at a
time, and observes after each step, waiting (polling with a deadline) until Prometheus
has recorded the change:

- one of two targets down: still an observation, `targets_up` 1, `targets_down` 1;
- that one removed from discovery (a scale-in): `targets_down` 0 (gone is not down);
- the other down too: `NoDataError(model, "targets_up")`, although the rate window still holds
  samples (the arrival rate PromQL computes is positive and would decay to 0 over the
  window: the failure of the issue);
- both gone from discovery: still no data, and still for the cause `targets_up` (a
  vanished target counts as down for the lookback, checked before the arrival rate,
  whose window empties meanwhile), never an arrival rate of 0;
- the healthy model is observed throughout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, NoDataError, Observation, ObservationResult
from tests.integration.conftest import one_engine
from tests.integration.fake_vllm import (
    FakeVllmCollector,
    ServedRegistry,
    serve_registry,
)
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

WINDOW_S = 10.0
DEAD, ALIVE = "dead", "alive"


@dataclass
class World:
    prometheus: PrometheusServer
    dead: list[ServedRegistry]
    alive: ServedRegistry

    def observe(self) -> dict[str, ObservationResult]:
        src = PrometheusSource(
            self.prometheus.url,
            window_s=WINDOW_S,
            timeout_s=5.0,
            scrape_interval_s=SCRAPE_INTERVAL_S,  # down = no successful scrape in 2 of these
        )
        return src.observe([ModelQuery(DEAD), ModelQuery(ALIVE)], settled())

    def up(self, target: str) -> float | None:
        """`up` of `target` as the next `observe` will see it."""
        rows = self.prometheus.query(f'up{{instance="{target}"}}', at_s=settled())
        return float(rows[0]["value"][1]) if rows else None


def settled() -> float:
    """An evaluation time every scrape before it has been committed at."""
    return time.time() - 1.5 * SCRAPE_INTERVAL_S


@pytest.fixture(scope="module")
def world(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    served: list[ServedRegistry] = []
    prom: PrometheusServer | None = None
    try:
        for name in (DEAD, DEAD, ALIVE):
            registry = CollectorRegistry()
            registry.register(FakeVllmCollector([one_engine(name)]))
            served.append(serve_registry(registry))
        workdir: Path = tmp_path_factory.mktemp("prometheus-dead")
        prom = PrometheusServer(prometheus_bin, workdir, {"engines": [s.target for s in served]})
        prom.start()
        w = World(prom, served[:2], served[2])

        def ready() -> bool:
            results = w.observe()
            return all(isinstance(r, Observation) for r in results.values())

        wait_for(ready, deadline_s=30.0, what="both models observed")
        yield w
    finally:
        if prom is not None:
            prom.stop()
        for s in served:
            s.stop()


def _observed(results: dict[str, ObservationResult], name: str) -> Observation:
    obs = results[name]
    assert isinstance(obs, Observation), obs
    return obs


def _targets(results: dict[str, ObservationResult], name: str) -> tuple[int | None, ...] | str:
    r = results[name]
    return (r.targets_up, r.targets_down) if isinstance(r, Observation) else r.signal


def _until(
    world: World, name: str, expected: tuple[int, int] | str, what: str
) -> dict[str, ObservationResult]:
    """Observe until `name` reads `expected` ((up, down), or a NoDataError's signal):
    polled with a deadline, since on a loaded machine one scrape may time out and read
    as a target down for an instant."""
    seen: list[dict[str, ObservationResult]] = []

    def check() -> bool:
        seen.append(world.observe())
        return _targets(seen[-1], name) == expected

    wait_for(check, 20.0, what)
    return seen[-1]


def test_targets_going_down_then_gone_read_as_no_data(world: World) -> None:
    healthy = _observed(_until(world, DEAD, (2, 0), "both targets up"), DEAD)
    assert healthy.arrival_rate_rps > 0

    first, second = world.dead
    first.stop()
    obs = _observed(_until(world, DEAD, (1, 1), "the first target down"), DEAD)
    assert obs.running == 3.0  # the live engine's gauge; the dead one's is absent, not 0

    # A scale-in deletes the pod: gone from discovery is not "down".
    world.prometheus.reload({"engines": [second.target, world.alive.target]})
    wait_for(lambda: world.up(first.target) is None, 15.0, "the first target gone")
    _until(world, DEAD, (1, 0), "the first target gone, not down")

    second.stop()
    stopped_at = time.time()
    results = _until(world, DEAD, "targets_up", "every target down: no data")
    assert "0 of 2 up" in str(results[DEAD])
    # What the source refused to read as demand: the window still holds samples, so
    # PromQL's rate is positive for a window after the stop (read half a window in, so
    # a slow machine that took longer to see the targets down cannot miss it).
    rows = world.prometheus.query(
        f'sum(rate(vllm:request_success_total{{model_name="{DEAD}"}}[{WINDOW_S:g}s]))',
        at_s=min(settled(), stopped_at + WINDOW_S / 2),
    )
    assert rows and float(rows[0]["value"][1]) > 0

    world.prometheus.reload({"engines": [world.alive.target]})
    wait_for(lambda: world.up(second.target) is None, 15.0, "the dead targets gone")
    gone = _until(world, DEAD, "targets_up", "every target gone: still no data")
    alive = _until(world, ALIVE, (1, 0), "the healthy model observed")
    assert isinstance(gone[DEAD], NoDataError) and isinstance(alive[DEAD], NoDataError)
