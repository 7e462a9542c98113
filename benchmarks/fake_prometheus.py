"""A Prometheus query API on loopback that answers the tick's queries from the recording.

This owns serving `benchmarks.promreplay` answers over HTTP, so a real `governor run`
(its PrometheusConnect client, HTTP and JSON decoding included) can be benchmarked at N
models without a Prometheus holding N models' series. `GET/POST /api/v1/query?query=Q`
answers `{"status": "success", "data": {"resultType": "vector", "result": [...]}}` for
each of the five tick queries (built with the same model label, rate window and panic
window as the governor's; the SLA-edge one recognized by its shape), pre-rendered per
tick variant; the variant advances on each
`demand` query. Any other query gets HTTP 400 with Prometheus's error shape.

Run: `python -m benchmarks.fake_prometheus --models 1000 [--window-s 60] [--short-window-s
10]`; prints `fake-prometheus: port N` on stdout once listening, serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import sys
import threading
import time
import urllib.parse

from benchmarks.promreplay import (
    fill_now,
    load_recording,
    model_names,
    query_namer,
    render_answers,
)
from estimators.promql import DEFAULT_MODEL_LABEL, build_queries

PORT_LINE = "fake-prometheus: port "


class Answers:
    """Pre-rendered HTTP bodies per (variant, query text)."""

    def __init__(
        self, n_models: int, window_s: float, short_window_s: float | None, variants: int
    ) -> None:
        import random

        rec = load_recording()
        queries = build_queries(DEFAULT_MODEL_LABEL, window_s, short_window_s=short_window_s)
        self.name_of = query_namer(queries)
        rng = random.Random(0)
        self.bodies: list[dict[str, bytes]] = []
        for v in range(max(1, variants)):
            factors = (
                None
                if v == 0
                else {m: 1.0 + 0.05 * rng.uniform(-1.0, 1.0) for m in model_names(n_models)}
            )
            rendered = render_answers(rec, n_models, factors=factors)
            self.bodies.append(
                {
                    name: b'{"status":"success","data":{"resultType":"vector","result":'
                    + body
                    + b"}}"
                    for name, body in rendered.items()
                }
            )
        self.tick = -1
        self.lock = threading.Lock()

    def body(self, query: str, eval_time_s: float) -> bytes | None:
        try:
            name = self.name_of(query)
        except KeyError:
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

        def _answer(self, params: dict[str, list[str]]) -> None:
            query = params.get("query", [""])[0]
            try:
                at = float(params.get("time", [""])[0])
            except ValueError:
                at = time.time()
            body = answers.body(query, at)
            status = 200
            if body is None:
                status = 400
                body = json.dumps(
                    {"status": "error", "errorType": "bad_data", "error": f"unknown {query!r}"}
                ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self._answer(urllib.parse.parse_qs(self.rfile.read(length).decode()))

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--short-window-s", type=float, default=10.0)
    ap.add_argument("--variants", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    answers = Answers(args.models, args.window_s, args.short_window_s, args.variants)
    server = serve(answers, args.port)
    print(f"{PORT_LINE}{server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
