"""The chart's recording rules in a real Prometheus: `PrometheusSource` finds their marker
in the demand answer and reads the recorded bucket rates, with the same quantiles and
attainment as from the raw buckets; with rules for another window, or once the rules are
removed, it reads the raw buckets again (and still observes every model).

The rule file is the chart's own rendering (tests/helm: the `llm-governor.recording`
group for the suite's window and a 1 s interval), loaded by the server at start."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from estimators.histogram import (
    E2E_BUCKETS_S,
    ITL_BUCKETS_S,
    PHASE_BUCKETS_S,
    QUEUE_BUCKETS_S,
    TPOT_BUCKETS_S,
    TTFT_BUCKETS_S,
)
from estimators.prometheus import RULES_MAX_AGE_INTERVALS, PrometheusSource
from estimators.promql import RULES_MARKER
from estimators.types import ModelQuery, Observation, ObservationResult
from tests.integration.conftest import BATCHES_PER_S, MODEL_A, MODEL_B, MODELS, WINDOW_S
from tests.integration.fake_vllm import (
    TOKEN_BUCKETS,
    FakeVllmCollector,
    ModelSpec,
    serve_registry,
)
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

QUERIES = [
    ModelQuery(MODEL_A.name, ttft_sla_s=0.25, itl_sla_s=0.05),  # both bucket edges
    ModelQuery(MODEL_B.name, ttft_sla_s=0.3, itl_sla_s=0.1),
]
SPECS = {MODEL_A.name: MODEL_A, MODEL_B.name: MODEL_B}
COMPARED = (
    "ttft_p95_ms",
    "itl_p95_ms",
    "e2e_p99_ms",
    "queue_time_p95_ms",
    "decode_time_p95_ms",
    "tpot_p95_ms",
    "prompt_tokens_p95",
    "output_tokens_p95",
    "ttft_attainment_frac",
    "itl_attainment_frac",
    "tpot_attainment_frac",
    "ttft_dist",
    "itl_dist",
    "e2e_dist",
)


def chart_rules(window_s: float) -> dict[str, object]:
    """The chart's recording group for `window_s`, evaluated every scrape interval."""
    from tests.helm.test_recording_rules import chart_recording_group

    interval = f"{SCRAPE_INTERVAL_S:g}s"
    group = chart_recording_group(
        policy={"window_s": window_s}, monitoring={"serviceMonitor": {"interval": interval}}
    )
    assert group is not None and group["interval"] == interval
    return {"groups": [group]}


@pytest.fixture(scope="module")
def prom(
    prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    """A Prometheus scraping the `MODELS` exporter with the chart's rules loaded, once
    the rules have recorded a full window of data for every model."""
    workdir: Path = tmp_path_factory.mktemp("prometheus-rules")
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump(chart_rules(WINDOW_S), sort_keys=False))
    registry = CollectorRegistry()
    registry.register(FakeVllmCollector(MODELS, batches_per_s=BATCHES_PER_S))
    served = serve_registry(registry)
    server = PrometheusServer(prometheus_bin, workdir, {"vllm": [served.target]}, [rules])
    try:
        server.start()
        names = {m.name for m in MODELS}

        def recorded() -> bool:  # a full window of data behind the recorded rates
            at = time.time() - 2.5 * SCRAPE_INTERVAL_S
            rows = server.query(f"governor:ttft_bucket:rate{WINDOW_S:g}s", at_s=at - WINDOW_S)
            return names <= {r["metric"].get("model_name") for r in rows}

        try:
            wait_for(recorded, 40.0, "recorded bucket rates for every model")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nPrometheus log:\n{server.log_tail()}") from None
        yield server
    finally:
        server.stop()
        served.stop()


def observe_all(
    src: PrometheusSource, models: Sequence[ModelQuery]
) -> tuple[dict[str, Observation], float]:
    """Every model observed at one settled instant (polled: on a loaded machine a missed
    scrape of the in-process exporter reads, correctly, as a target down)."""
    taken: list[tuple[dict[str, ObservationResult], float]] = []

    def every_model_observed() -> bool:
        at = time.time() - 2.5 * SCRAPE_INTERVAL_S
        taken.append((src.observe(models, at), at))
        return all(isinstance(r, Observation) for r in taken[-1][0].values())

    wait_for(every_model_observed, 20.0, "every model observed")
    results, at = taken[-1]
    return {k: v for k, v in results.items() if isinstance(v, Observation)}, at


RECORDED = f"governor:ttft_bucket:rate{WINDOW_S:g}s"


def observe_at_an_evaluation(
    prom: PrometheusServer, ruled: PrometheusSource, raw: PrometheusSource
) -> tuple[dict[str, Observation], dict[str, Observation]]:
    """Both sources at one instant at which the rule group was evaluated (polled until
    every model is observed both ways). At that instant the recorded rates are the very
    rates the raw path computes; at any other instant the two windows hold different
    scrapes, which differ in their counts whenever a scrape came late or was missed (a
    loaded machine: the exporter is in the test process), and then so do the quantiles."""
    taken: list[tuple[dict[str, ObservationResult], dict[str, ObservationResult]]] = []

    def both() -> bool:
        at = time.time() - 2.5 * SCRAPE_INTERVAL_S
        rows = prom.query(f"timestamp({RECORDED})", at_s=at)
        if not rows:
            return False
        evaluated = float(rows[0]["value"][1])
        taken.append((ruled.observe(QUERIES, evaluated), raw.observe(QUERIES, evaluated)))
        results = [*taken[-1][0].values(), *taken[-1][1].values()]
        return ruled.rules_in_use and all(isinstance(r, Observation) for r in results)

    wait_for(both, 20.0, "every model observed both ways at an evaluation")
    ruled_obs, raw_obs = taken[-1]
    pick = lambda d: {k: v for k, v in d.items() if isinstance(v, Observation)}  # noqa: E731
    return pick(ruled_obs), pick(raw_obs)


def test_source_reads_the_recorded_bucket_rates(prom: PrometheusServer) -> None:
    ruled = PrometheusSource(prom.url, window_s=WINDOW_S, timeout_s=5.0)
    raw = PrometheusSource(prom.url, window_s=WINDOW_S, timeout_s=5.0, recording_rules=False)
    obs, plain = observe_at_an_evaluation(prom, ruled, raw)
    assert ruled.rules_in_use and ruled.queries_last_tick == 8
    assert RECORDED in ruled.queries.ttft_quantiles and RECORDED in ruled.queries.sla_buckets
    assert "rate(vllm:" not in ruled.queries.quantiles + ruled.queries.sla_buckets
    a, b = obs[MODEL_A.name], obs[MODEL_B.name]
    assert a.itl_p95_ms == pytest.approx(65.625)  # as from the raw buckets (see
    assert a.ttft_p95_ms == pytest.approx(625.0)  # test_prometheus_source.py)
    assert a.e2e_p99_ms == pytest.approx(12_500.0)
    assert b.itl_p95_ms == pytest.approx(125.0)
    assert a.ttft_attainment_frac is not None and a.itl_attainment_frac is not None
    # The same instant through the raw buckets: every quantile and attainment equal.
    assert not raw.rules_in_use and "rate(vllm:" in raw.queries.ttft_quantiles
    for q in QUERIES:
        p = plain[q.name]
        got, want = numbers(obs[q.name]), numbers(p)
        for key in on_an_edge(SPECS[q.name]) & set(got):
            del got[key], want[key]
        missing = {k for k, v in want.items() if v is None}
        assert {k for k, v in got.items() if v is None} == missing, q.name
        got = {k: v for k, v in got.items() if k not in missing}
        want = {k: v for k, v in want.items() if k not in missing}
        assert got == pytest.approx(want, rel=1e-9), q.name


_QUANTILES = {  # compared key: (ModelSpec field, the exporter's bucket bounds, quantile)
    "ttft_p95_ms": ("ttft_s", TTFT_BUCKETS_S, "0.95"),
    "itl_p95_ms": ("itl_s", ITL_BUCKETS_S, "0.95"),
    "e2e_p99_ms": ("e2e_s", E2E_BUCKETS_S, "0.99"),
    "queue_time_p95_ms": ("queue_s", QUEUE_BUCKETS_S, "0.95"),
    "decode_time_p95_ms": ("decode_s", PHASE_BUCKETS_S, "0.95"),
    "tpot_p95_ms": ("tpot_s", TPOT_BUCKETS_S, "0.95"),
    "prompt_tokens_p95": ("prompt_tokens", TOKEN_BUCKETS, "0.95"),
    "output_tokens_p95": ("output_tokens", TOKEN_BUCKETS, "0.95"),
} | {
    f"{name}_dist.p{p}_ms": (f"{name}_s", bounds, f"0.{p}")
    for name, bounds in (("ttft", TTFT_BUCKETS_S), ("itl", ITL_BUCKETS_S), ("e2e", E2E_BUCKETS_S))
    for p in (50, 90, 95, 99)
}


def on_an_edge(spec: ModelSpec) -> set[str]:
    """The compared quantiles of `spec` whose rank falls exactly on a bucket's cumulative
    count with an empty bucket after it (llama-a's TTFT p90: 18 of 20 requests at or under
    0.25 s, none in (0.25, 0.5]; qwen-b's ITL p90: 90 of 100 at or under 0.1 s).
    histogram_quantile then answers that bucket's bound or one
    in the next bucket depending on float noise in the rates, and that noise differs
    between the recorded and the raw path whenever the counts are not round: on a loaded
    machine the exporter (in the test process) computes its counts later than the scrape
    it is stamped with, or misses a scrape. Computed from the specs (exact fractions),
    not listed by hand: a hand list named one of them and the others failed under load."""
    out: set[str] = set()
    for key, (field, bounds, q) in _QUANTILES.items():
        values = getattr(spec, field)
        rank = Fraction(q) * len(values)
        counts = [sum(v <= b for v in values) for b in (*bounds, float("inf"))]
        # on a bound, with the next bucket empty (else the next bucket's interpolation
        # starts at that same bound and the two answers agree)
        if values and any(a == b == rank for a, b in itertools.pairwise(counts)):
            out.add(key)
    return out


def numbers(o: Observation) -> dict[str, float | None]:
    """`COMPARED` of `o`, the distributions spread into their quantiles."""
    # (llama-b has no phase histograms: its decode time and TPOT p95 are None both ways)
    out: dict[str, float | None] = {}
    for name in COMPARED:
        v = getattr(o, name)
        if name.endswith("_dist"):
            out |= {f"{name}.{k}": x for k, x in (vars_of(v) if v else {}).items()}
        else:
            out[name] = v
    assert sum(v is not None for v in out.values()) >= 15, out  # compared numbers, not Nones
    return out


def vars_of(dist: object) -> dict[str, float | None]:
    from dataclasses import asdict

    return asdict(dist)  # type: ignore[call-overload, no-any-return]


def test_rules_for_another_window_are_not_read(prom: PrometheusServer) -> None:
    src = PrometheusSource(prom.url, window_s=2 * WINDOW_S, timeout_s=5.0)
    obs, _at = observe_all(src, QUERIES)
    assert not src.rules_in_use and "rate(vllm:" in src.queries.ttft_quantiles
    assert obs[MODEL_A.name].itl_p95_ms == pytest.approx(65.625)


BROKEN_EXPR = (
    'vector(1) * on () group_left () (vector(1) or label_replace(vector(1), "a", "b", "", ""))'
)
"""A rule expression a reload accepts (it parses) that fails at every evaluation with a
many-to-many matching error (two series on the "one" side), as a relabelling change
can make a real rule fail."""


def _with_ttft_rule(expr: str | None) -> str:
    """The chart's rules (YAML) with the TTFT bucket rule's expression `expr` (None: as
    the chart has it)."""
    doc = chart_rules(WINDOW_S)
    for group in doc["groups"]:  # type: ignore[attr-defined]
        for rule in group["rules"]:
            if expr is not None and rule.get("record") == RECORDED:
                rule["expr"] = expr
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_rule_that_stops_evaluating_reads_as_no_data(prom: PrometheusServer) -> None:
    """A recorded series whose rule fails while the marker is still recorded is not
    read once older than the bound (three rule intervals), though Prometheus still
    answers its last samples (5-minute lookback); the other rules' series are read.
    Evaluated at an injected time, after the TTFT series' newest sample is older than
    the bound and while the marker is fresh. Before the last test (it unloads the rules);
    the chart's rules are restored after."""
    src = PrometheusSource(
        prom.url, window_s=WINDOW_S, timeout_s=5.0, scrape_interval_s=SCRAPE_INTERVAL_S
    )
    before, _at = observe_all(src, QUERIES)
    assert src.rules_in_use and before[MODEL_A.name].ttft_p95_ms == pytest.approx(625.0)
    bound_s = RULES_MAX_AGE_INTERVALS * SCRAPE_INTERVAL_S
    path = prom.rule_files[0]
    taken: list[dict[str, ObservationResult]] = []

    def failing_rule_still_answered() -> bool:
        at = time.time() - 2.5 * SCRAPE_INTERVAL_S
        ttft = prom.query(f"max(timestamp({RECORDED}))", at_s=at)
        marker = prom.query(f"timestamp({RULES_MARKER})", at_s=at)
        if not ttft or not marker or float(marker[0]["value"][1]) < at - 2 * SCRAPE_INTERVAL_S:
            return False
        if float(ttft[0]["value"][1]) > at - bound_s - SCRAPE_INTERVAL_S:
            return False  # not yet older than the bound (by an interval)
        taken.append(src.observe(QUERIES, at))
        return src.rules_in_use and all(isinstance(r, Observation) for r in taken[-1].values())

    try:
        path.write_text(_with_ttft_rule(BROKEN_EXPR))
        prom.reload(prom.targets)
        wait_for(failing_rule_still_answered, 30.0, "a failing TTFT rule, its series answered")
        a = taken[-1][MODEL_A.name]
        assert isinstance(a, Observation)
        assert a.ttft_p95_ms is None, a.ttft_p95_ms  # not the failed rule's last 625 ms
        assert a.ttft_attainment_frac is None
        assert a.itl_p95_ms == pytest.approx(65.625)  # its rule still evaluates
        assert a.itl_attainment_frac is not None
    finally:
        path.write_text(_with_ttft_rule(None))
        prom.reload(prom.targets)
        fresh = lambda: bool(prom.query(f"{RECORDED} and (timestamp({RECORDED}) > time() - 2)"))  # noqa: E731
        wait_for(fresh, 20.0, "the TTFT rule evaluating again")


def test_rules_removed_the_source_reads_raw_buckets_again(prom: PrometheusServer) -> None:
    """Last in this module: it unloads the rules."""
    src = PrometheusSource(prom.url, window_s=WINDOW_S, timeout_s=5.0)
    observe_all(src, QUERIES)
    assert src.rules_in_use
    prom.rule_files = ()
    prom.reload(prom.targets)  # the rule group is gone: its series are marked stale
    settled = 2.5 * SCRAPE_INTERVAL_S  # observe_all's evaluation time, before now
    gone = lambda: not prom.query(RULES_MARKER, at_s=time.time() - settled)  # noqa: E731
    wait_for(gone, 20.0, "the marker gone")
    obs, _at = observe_all(src, QUERIES)
    assert not src.rules_in_use and "rate(vllm:" in src.queries.ttft_quantiles
    assert obs[MODEL_A.name].itl_p95_ms == pytest.approx(65.625)
