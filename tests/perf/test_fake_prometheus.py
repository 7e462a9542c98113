"""The benchmarks' fake Prometheus answers every query a `governor run` sends for the
benchmark config, and the benchmarks refuse to report numbers on ticks without data.

`benchmarks/fake_prometheus.py` stands in for a Prometheus holding 1,000 models' series
(a real one cannot hold them on this machine in a test's time); the governor's source
is built as `governor run` builds it (`service.run.prometheus_source`, its default HTTP
client and the start-up scrape-interval check included) and observes the config's
models over real HTTP on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from benchmarks.bench_grpc import failed_calls
from benchmarks.common import Row
from benchmarks.fake_prometheus import Answers, serve
from benchmarks.procs import SCRAPE_INTERVAL_S, tick_data_problem, write_governor_config
from benchmarks.promreplay import load_recording, model_names
from controller.config import GovernorConfig, load_config
from controller.loop import model_query
from estimators.promql import QueryBuilder, TickQueries, queries_of
from estimators.types import Observation
from service.run import prometheus_source

N_MODELS = 3


@pytest.fixture(scope="module")
def bench_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fake") / "governor.yaml"
    return write_governor_config(path, model_names(N_MODELS), tick_interval_s=5.0)


@pytest.fixture(scope="module")
def fake(bench_config: Path) -> Iterator[tuple[Answers, str]]:
    answers = Answers(load_config(bench_config), variants=1)
    server = serve(answers)
    try:
        yield answers, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _pointed_at(config: Path, url: str) -> GovernorConfig:
    doc = yaml.safe_load(config.read_text())
    doc["prometheus"]["url"] = url
    return GovernorConfig.model_validate(doc)


def test_the_benchmark_config_states_its_scrape_interval(bench_config: Path) -> None:
    doc = yaml.safe_load(bench_config.read_text())
    assert doc["prometheus"]["scrape_interval_s"] == SCRAPE_INTERVAL_S
    # two scrape intervals, above the 10 s panic window: the short window the source reads
    assert load_config(bench_config).short_window_s == 2 * SCRAPE_INTERVAL_S


def test_the_fake_answers_every_query_of_the_governor(
    bench_config: Path, fake: tuple[Answers, str]
) -> None:
    answers, url = fake
    config = _pointed_at(bench_config, url)
    source = prometheus_source(config)  # as `governor run`: start-up check over HTTP too
    results = source.observe([model_query(m) for m in config.models], 1_800_000_000.0)
    assert answers.unknown == 0
    assert source.queries_last_tick == len(list(source.queries.items()))
    assert dict(source.queries.items()) == dict(answers.queries.items())
    assert set(results) == set(model_names(N_MODELS))
    no_data = {n: str(r) for n, r in results.items() if not isinstance(r, Observation)}
    assert no_data == {}


def test_the_fake_refuses_a_query_the_governor_does_not_send(fake: tuple[Answers, str]) -> None:
    answers, _ = fake
    before = answers.unknown
    # the old fake's set: a 10 s short window, which the 15 s scrape raises to 30 s
    old = queries_of(QueryBuilder(window_s=60.0, short_window_s=10.0))
    assert answers.body(old.demand, 0.0) is None
    assert answers.unknown == before + 1


def test_the_recording_holds_every_tick_query() -> None:
    rec = load_recording()
    assert set(rec["answers"]) == {f.name for f in fields(TickQueries)}


def test_ticks_without_data_are_named() -> None:
    clean = 'governor_model_stale{model="a"} 0.0\ngovernor_model_stale{model="b"} 0.0\n'
    assert tick_data_problem(clean) is None
    failing = (
        clean.replace('"b"} 0.0', '"b"} 1.0') + 'governor_source_errors_total{kind="source"} 3.0\n'
    )
    problem = tick_data_problem(failing)
    assert problem is not None
    assert "1 of 2 models without data" in problem and "source 3" in problem
    assert tick_data_problem("") is not None  # no model reported: nothing to trust


def test_calls_failing_other_than_by_load_shedding_are_counted() -> None:
    idle = {"error_codes": {"UNAVAILABLE": 2}}
    open_loop = {
        "rate_per_s": 1000.0,
        "error_codes": {"RESOURCE_EXHAUSTED": 9, "UNAVAILABLE": 1},
        "ceiling": {"error_codes": {"DEADLINE_EXCEEDED": 4, "CANCELLED": 2}},
        "governor_loop_idle": idle,
    }
    closed = {"runs": {"governor": [{"error_codes": {"NOT_FOUND": 5}}], "ceiling": []}}
    rows = [Row("3", "closed", "", data=closed), Row("3", "open", "", data=open_loop)]
    assert failed_calls(rows) == {"UNAVAILABLE": 3, "NOT_FOUND": 5}
