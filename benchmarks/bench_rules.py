"""Prometheus's evaluation work per tick with and without the chart's recording rules.

A real Prometheus (tests/integration's server, 1 s scrapes) scrapes `--models` fake vLLM
models of two engines each (tests/integration's exporter, llama-a's distributions) and
evaluates the recording rules `QueryBuilder.recording_rules` renders (the chart's, by
tests/helm/test_recording_rules.py) every second. Then, at one settled instant, rounds
alternate between the tick's quantile and SLA-edge queries on the raw buckets and the
same queries on the recorded series (`PrometheusSource` picks the latter when the rules
are loaded), each timed by Prometheus itself (`stats=all`: `evalTotalTime`). The rule
group's own evaluation time (`/api/v1/rules`) is what the rules cost per evaluation; in
a cluster it runs once per scrape interval (15 s by default), against a tick every 5 s.

Reported: median ms of Prometheus evaluation per tick for the five queries, raw and
recorded; the rule group's median evaluation ms; and the ratio raw / (recorded + the
group's cost per 5 s tick at a 15 s interval). Not part of `make bench` (it needs the
`prometheus` binary and about a minute).
Run: `.venv/bin/python -m benchmarks.bench_rules [--models 40] [--rounds 15]` (the fake
exporters are Python: much over 40 models of two engines misses 1 s scrapes).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests
import yaml
from prometheus_client import CollectorRegistry

from benchmarks.common import Row, bench_args, median, print_rows, write_rows
from estimators.promql import QueryBuilder, queries_of
from tests.integration.conftest import MODEL_A
from tests.integration.fake_vllm import FakeVllmCollector, serve_registry
from tests.integration.promserver import PrometheusServer, find_prometheus, wait_for

WINDOW_S = 5.0
EDGES = {"ttft": [1.0], "itl": [0.05], "tpot": [0.05]}
TICK_S, RULE_INTERVAL_S = 5.0, 15.0
TIMED = ("ttft_quantiles", "itl_quantiles", "e2e_quantiles", "other_quantiles", "sla_buckets")


def _eval_ms(prom: PrometheusServer, query: str, at_s: float) -> float:
    params = {"query": query, "time": f"{at_s:.3f}", "stats": "all"}
    body = requests.get(f"{prom.url}/api/v1/query", params=params, timeout=30).json()
    assert body["status"] == "success", body
    assert body["data"]["result"], query[:200]  # timed on data, not on an empty answer
    return float(body["data"]["stats"]["timings"]["evalTotalTime"]) * 1000.0


def _group_ms(prom: PrometheusServer) -> float:
    groups = requests.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    return float(groups[0]["evaluationTime"]) * 1000.0


def measure(prom: PrometheusServer, rounds: int) -> dict[str, Any]:
    """Alternating rounds of the timed queries, raw and recorded, at one instant."""
    at = time.time() - 2.5
    by_mode = {
        rec: dict(queries_of(QueryBuilder(window_s=WINDOW_S, recorded=rec), EDGES).items())
        for rec in (False, True)
    }
    ms: dict[bool, list[float]] = {False: [], True: []}
    group: list[float] = []
    for _ in range(rounds):
        for rec in (False, True):
            ms[rec].append(sum(_eval_ms(prom, by_mode[rec][n], at) for n in TIMED))
        group.append(_group_ms(prom))
    raw, recorded, rule = median(ms[False]), median(ms[True]), median(group)
    per_tick = recorded + rule * TICK_S / RULE_INTERVAL_S
    return {"raw_ms": raw, "recorded_ms": recorded, "rule_group_ms": rule,
            "recorded_with_rules_ms": per_tick, "ratio": raw / per_tick}  # fmt: skip


def run(n_models: int, rounds: int) -> dict[str, Any]:
    binary = find_prometheus()
    if binary is None:
        raise SystemExit("no prometheus binary (apt-get install prometheus, or PROMETHEUS_BIN)")
    specs = tuple(replace(MODEL_A, name=f"bench-{i:04d}") for i in range(n_models))
    registry = CollectorRegistry()
    registry.register(FakeVllmCollector(specs, batches_per_s=10.0))
    served = serve_registry(registry)
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.yaml"
        group = {"name": "llm-governor.recording", "interval": "1s",
                 "rules": QueryBuilder(window_s=WINDOW_S).recording_rules()}  # fmt: skip
        rules.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False))
        prom = PrometheusServer(binary, Path(tmp), {"vllm": [served.target]}, [rules])
        try:
            prom.start()

            def recorded() -> bool:
                rows = prom.query('count(governor:ttft_bucket:rate5s{le="+Inf"})')
                return bool(rows) and int(float(rows[0]["value"][1])) == n_models

            wait_for(recorded, 60.0, "recorded series for every model")
            time.sleep(WINDOW_S + 3.0)  # a full window behind every recorded rate
            return {"models": n_models, "rounds": rounds, **measure(prom, rounds)}
        finally:
            prom.stop()
            served.stop()


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--models", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.rounds = 10, 3
    r = run(args.models, args.rounds)
    n = r["models"]
    rows = [
        Row("2 Prometheus queries", f"quantile + SLA-edge evaluation per tick, {n} models, raw",
            f"{r['raw_ms']:.1f} ms", data=r),
        Row("2 Prometheus queries", f"the same on the recording rules' series, {n} models",
            f"{r['recorded_ms']:.1f} ms + rule group {r['rule_group_ms']:.1f} ms per "
            f"{RULE_INTERVAL_S:g} s = {r['recorded_with_rules_ms']:.1f} ms per tick "
            f"({r['ratio']:.1f}x less)", data=r),
    ]  # fmt: skip
    write_rows(args.json, "rules", rows, r)
    return rows


if __name__ == "__main__":
    print_rows(main())
