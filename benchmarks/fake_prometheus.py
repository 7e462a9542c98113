"""A Prometheus query API on loopback that answers a `governor run`'s tick queries from
the recording.

This owns serving `benchmarks.promreplay` answers over HTTP, so a real `governor run`
(its PrometheusConnect client, HTTP and JSON decoding included) can be benchmarked at N
models without a Prometheus holding N models' series. It is started with the governor
config of the benchmark (`--config`; its URL is not read) and answers exactly the
queries a governor with that config sends (and `time()`, its clock probe, at the time
asked, else its own now), no others: they are listed by building the governor's own
source (`service.run.prometheus_source`, windows and the short window's
start-up check included) over a capturing client and running one tick for the config's
models (`controller.loop.model_query`, so the SLA-edge query is the governor's too).

`GET/POST /api/v1/query?query=Q` answers `{"status": "success", "data": {"resultType":
"vector", "result": [...]}}` for each of the eight tick queries, pre-rendered per tick
variant (the variant advances on each `demand` query), and for the start-up check's
engine-jobs query; `GET /api/v1/targets` lists one engine target scraped every
`prometheus.scrape_interval_s` of the config (so the check keeps the configured short
window). Any other query gets HTTP 400 with Prometheus's error shape and is counted
(`unknown`).

Run: `python -m benchmarks.fake_prometheus --config governor.yaml [--variants 4]`;
prints `fake-prometheus: port N` on stdout once listening, serves until killed. The
config's models must be `benchmarks.promreplay.model_names(N)`.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import random
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from benchmarks.promreplay import (
    fill_now,
    load_recording,
    model_names,
    query_namer,
    render_answers,
)
from controller.config import GovernorConfig, load_config
from controller.loop import model_query
from estimators.prometheus import SERVER_TIME_QUERY
from estimators.promql import TickQueries
from estimators.scrape import ENGINE_JOBS_QUERY

PORT_LINE = "fake-prometheus: port "
ENGINE_JOB = "vllm"


class _Capture:
    """A query client that answers every query with no series (lists nothing)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[Any]:
        return []


def governor_queries(config: GovernorConfig) -> TickQueries:
    """The queries one tick of `governor run --config` sends for `config`'s models, when
    Prometheus reports the engines scraped every `prometheus.scrape_interval_s`."""
    from service.run import prometheus_source

    interval = config.prometheus.scrape_interval_s
    source = prometheus_source(config, reported_s=lambda _settings: interval, client=_Capture())
    source.observe([model_query(m) for m in config.models], time.time())
    return source.queries


def _ok(result: object) -> bytes:
    return json.dumps({"status": "success", "data": result}).encode()


class Answers:
    """Pre-rendered HTTP bodies per (variant, query name) for the governor `config`."""

    def __init__(self, config: GovernorConfig, variants: int) -> None:
        names = [m.name for m in config.models]
        if names != model_names(len(names)):
            raise ValueError(
                "the config's models must be benchmarks.promreplay.model_names(N) "
                f"(model-00000, ...), got {names[:3]}..."
            )
        rec = load_recording()
        if rec["model_label"] != config.prometheus.model_label:
            raise ValueError(
                f"the recording groups by {rec['model_label']!r}, the config by "
                f"{config.prometheus.model_label!r}"
            )
        self.queries = governor_queries(config)
        self.name_of = query_namer(self.queries, any_edges=False)
        rng = random.Random(0)
        self.bodies: list[dict[str, bytes]] = []
        for v in range(max(1, variants)):
            factors = (
                None
                if v == 0
                else {m: 1.0 + 0.05 * rng.uniform(-1.0, 1.0) for m in model_names(len(names))}
            )
            self.bodies.append(render_answers(rec, len(names), factors=factors))
        interval = f"{config.prometheus.scrape_interval_s:g}s"
        jobs = [{"metric": {"job": ENGINE_JOB}, "value": [0, "1"]}]
        self.jobs = _ok({"resultType": "vector", "result": jobs})
        self.targets = _ok(
            {"activeTargets": [{"labels": {"job": ENGINE_JOB}, "scrapeInterval": interval}]}
        )
        self.tick = -1
        self.unknown = 0
        """Queries answered 400 (not the governor's) since start."""
        self.lock = threading.Lock()

    def body(self, query: str, eval_time_s: float) -> bytes | None:
        """The answer to `query` at `eval_time_s` (Unix s); None for an unknown query."""
        if query == ENGINE_JOBS_QUERY:
            return self.jobs
        if query == SERVER_TIME_QUERY:  # the source's clock probe (service.promclock)
            return _ok({"resultType": "scalar", "result": [eval_time_s, f"{eval_time_s:.3f}"]})
        try:
            name = self.name_of(query)
        except KeyError:
            with self.lock:
                self.unknown += 1
            return None
        with self.lock:
            if name == "demand":
                self.tick += 1
            body = self.bodies[max(0, self.tick) % len(self.bodies)][name]
        return fill_now(body, eval_time_s)


def serve(answers: Answers, port: int = 0) -> http.server.ThreadingHTTPServer:
    """Start serving `answers` on 127.0.0.1:`port` in a daemon thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _answer(self, path: str, params: dict[str, list[str]]) -> None:
            if path == "/api/v1/targets":
                self._send(200, answers.targets)
                return
            query = params.get("query", [""])[0]
            try:
                at = float(params.get("time", [""])[0])
            except ValueError:
                at = time.time()
            body = answers.body(query, at) if path == "/api/v1/query" else None
            if body is None:
                error = {"status": "error", "errorType": "bad_data", "error": f"unknown {query!r}"}
                self._send(400, json.dumps(error).encode())
                return
            self._send(200, body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            self._answer(url.path, urllib.parse.parse_qs(url.query))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            params = urllib.parse.parse_qs(self.rfile.read(length).decode())
            self._answer(urllib.parse.urlsplit(self.path).path, params)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", required=True, help="the governor config of the benchmark")
    ap.add_argument("--variants", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        answers = Answers(load_config(Path(args.config)), args.variants)
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError
        print(f"fake-prometheus: error: {exc}", flush=True)
        return 2
    server = serve(answers, args.port)
    print(f"{PORT_LINE}{server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
