"""Prometheus queries per tick are constant in the number of models (issue 7, item 2).

A `PrometheusSource` over a fake query client (`benchmarks.promreplay.ReplayClient`: the
answers a real Prometheus gave for two models, scaled to N) is observed for 1 and 1,000
models, alone and through `ControlLoop.tick`: the same number of queries each time, at
most `MAX_QUERIES_PER_TICK`, and every model observed (none missing from the answers).
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from benchmarks.common import fleet_config
from benchmarks.promreplay import ReplayClient, model_names
from controller.loop import ControlLoop
from controller.metrics import GovernorMetrics
from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, Observation
from tests.service.fakes import quiet_logger

MAX_QUERIES_PER_TICK = 15
NOW_S = 1_800_000_000.0


def _source(n_models: int) -> tuple[PrometheusSource, ReplayClient]:
    src = PrometheusSource("http://replay.invalid", window_s=60.0, short_window_s=10.0)
    client = ReplayClient(src.queries, n_models, variants=1)
    # Injected after construction: the replay client needs the source's query texts.
    src._client = client
    src._per_call_timeout = True
    return src, client


@pytest.mark.parametrize("n_models", [1, 1000])
def test_observe_sends_the_same_queries_for_any_number_of_models(n_models: int) -> None:
    src, client = _source(n_models)
    names = model_names(n_models)
    results = src.observe([ModelQuery(n, 1.0, 0.05) for n in names], NOW_S)
    assert set(results) == set(names)
    assert all(isinstance(r, Observation) for r in results.values())
    assert src.queries_last_tick == client.calls == len(list(src.queries.items()))
    assert src.queries_last_tick <= MAX_QUERIES_PER_TICK


def test_queries_per_tick_are_equal_for_1_and_1000_models_through_the_loop() -> None:
    counts = {}
    for n in (1, 1000):
        src, client = _source(n)
        names = model_names(n)
        loop = ControlLoop(
            fleet_config(n, names),
            src,
            [],
            metrics=GovernorMetrics(CollectorRegistry()),
            logger=quiet_logger(),
        )
        for tick in range(3):
            before = client.calls
            decisions = loop.tick(1000.0 + 5.0 * tick)
            assert client.calls - before == src.queries_last_tick
            assert len(decisions) == n and all(d.valid for d in decisions)
        counts[n] = src.queries_last_tick
    assert counts[1] == counts[1000] <= MAX_QUERIES_PER_TICK
