"""Record the answers of one tick's PromQL queries from a REAL Prometheus, once.

This owns producing `benchmarks/data/prometheus_answers.json`, the recording that the
tick benchmark (`benchmarks/bench_tick.py`) and the perf tests replay, scaled to N
models, through a fake query client (`benchmarks/promreplay.py`). It starts the same
world the integration tests use (tests/integration: a real Prometheus scraping the
deterministic fake vLLM exporters, 1 s scrapes), waits for a full rate window, runs the
eight queries of `estimators.promql.queries_of` once and stores each query's
`data.result` list exactly as Prometheus answered it (labels, `[timestamp, "value"]`
strings), keyed by query name, with the query text and the Prometheus version.

Run: `.venv/bin/python -m benchmarks.record_prometheus` (needs the `prometheus` binary,
about 15 s). Windows are seconds: rate window `WINDOW_S`, panic window `SHORT_WINDOW_S`
and seed window `SEED_WINDOW_S` (the answers' shape does not depend on them; the replay
matches queries by name), SLA-edge buckets at `EDGES`.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import requests
from prometheus_client import CollectorRegistry

from estimators.promql import DEFAULT_MODEL_LABEL, QueryBuilder, queries_of
from tests.integration.conftest import MODEL_A, MODEL_B, _enough_samples
from tests.integration.fake_vllm import FakeVllmCollector, serve_registry
from tests.integration.promserver import (
    SCRAPE_INTERVAL_S,
    PrometheusServer,
    find_prometheus,
    wait_for,
)

WINDOW_S = 5.0
SHORT_WINDOW_S = 3.0
SEED_WINDOW_S = 8.0
BATCHES_PER_S = 10.0
EDGES = {"ttft": [1.0], "itl": [0.05], "tpot": [0.05]}
"""SLA thresholds of the recorded SLA-edge buckets: the benchmark fleet's SLA (TTFT 1 s,
ITL 50 ms; benchmarks.common.SLA_MS)."""
OUT = Path(__file__).resolve().parent / "data" / "prometheus_answers.json"


def record(out: Path = OUT) -> dict[str, object]:
    """Start the world, query once, write `out`; returns the recording."""
    binary = find_prometheus()
    if binary is None:
        raise SystemExit("no prometheus binary (apt-get install prometheus, or PROMETHEUS_BIN)")
    specs = (MODEL_A, MODEL_B)
    registry = CollectorRegistry()
    registry.register(FakeVllmCollector(specs, batches_per_s=BATCHES_PER_S))
    served = serve_registry(registry)
    with tempfile.TemporaryDirectory() as tmp:
        prom = PrometheusServer(binary, Path(tmp), {"vllm": [served.target]})
        try:
            prom.start()
            names = {m.name for m in specs}
            full = max(WINDOW_S, SEED_WINDOW_S)
            wait_for(lambda: _enough_samples(prom, names, full), 30.0, "a full window")
            b = QueryBuilder(
                DEFAULT_MODEL_LABEL,
                WINDOW_S,
                short_window_s=SHORT_WINDOW_S,
                seed_window_s=SEED_WINDOW_S,
                scrape_interval_s=SCRAPE_INTERVAL_S,
            )
            queries = queries_of(b, EDGES)
            now = time.time() - 1.5  # every scrape before it committed: one instant
            answers: dict[str, object] = {}
            texts: dict[str, str] = {}
            for name, q in queries.items():
                answers[name] = prom.query(q, at_s=now)
                texts[name] = q
            info = requests.get(f"{prom.url}/api/v1/status/buildinfo", timeout=5).json()
            version = info.get("data", {}).get("version", "unknown")
        finally:
            prom.stop()
            served.stop()
    doc: dict[str, object] = {
        "about": "data.result of each tick query from a real Prometheus "
        "(benchmarks/record_prometheus.py); models: " + ", ".join(m.name for m in specs),
        "prometheus_version": version,
        "recorded_at_unix_s": round(now, 3),
        "model_label": DEFAULT_MODEL_LABEL,
        "models": [m.name for m in specs],
        "window_s": WINDOW_S,
        "short_window_s": SHORT_WINDOW_S,
        "seed_window_s": SEED_WINDOW_S,
        "edges": EDGES,
        "queries": texts,
        "answers": answers,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main() -> int:
    doc = record()
    answers = doc["answers"]
    assert isinstance(answers, dict)
    for name, result in answers.items():
        print(f"{name:24s} {len(result):4d} series")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
