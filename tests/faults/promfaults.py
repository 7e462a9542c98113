"""Prometheus-side fault injection: a Prometheus that can be killed and restarted on
the same port and TSDB, and a fault proxy between the governor and it.

`FaultProxy` forwards the query API to the real Prometheus and, by `mode`, answers
slowly (`slow`: holds each request `delay_s`, past the client's timeout), with garbage
(`garbage`: HTTP 200, an HTML body), with every sample value `NaN` (`nan`), with empty
vectors (`empty`), or without the series of some models (`drop`: `hidden` names).
Mode `pass` forwards untouched. Times are seconds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

from tests.integration.promserver import PrometheusServer, free_port, wait_for

MODES = ("pass", "slow", "garbage", "nan", "empty", "drop")


class RestartablePrometheus(PrometheusServer):
    """A PrometheusServer whose `kill()` is SIGKILL and whose `restart()` comes back on
    the same port with the same TSDB folder (the WAL is replayed)."""

    def start(self, ready_deadline_s: float = 30.0, attempts: int = 3) -> None:
        self._config_path = self._write_config()
        self._data = self.workdir / "data"
        for _ in range(attempts):
            self.port = free_port()
            if self._spawn(ready_deadline_s):
                return
        raise AssertionError(f"Prometheus did not start; log:\n{self.log_tail()}")

    def _spawn(self, ready_deadline_s: float) -> bool:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self._config_path}",
                    f"--storage.tsdb.path={self._data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise _Exited
            return requests.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200

        try:
            wait_for(ready, ready_deadline_s, "Prometheus /-/ready")
        except _Exited:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush (the WAL is what survives)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, ready_deadline_s: float = 60.0) -> None:
        """Start again on the same port and TSDB folder (after `kill`)."""
        assert self.proc is None or self.proc.poll() is not None, "still running"
        if not self._spawn(ready_deadline_s):
            raise AssertionError(f"Prometheus did not restart; log:\n{self.log_tail()}")


class _Exited(Exception):
    pass


class FaultProxy:
    """An HTTP proxy for the Prometheus query API with injectable faults (module doc)."""

    def __init__(self, upstream: str, model_label: str = "model_name") -> None:
        self.upstream = upstream.rstrip("/")
        self.model_label = model_label
        self.mode = "pass"
        self.delay_s = 1.0
        self.hidden: set[str] = set()
        self.requests = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                with contextlib.suppress(OSError):  # the client may have given up
                    self.send_response(code)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(n) if n else None
                with proxy._lock:
                    proxy.requests += 1
                    mode, delay, hidden = proxy.mode, proxy.delay_s, set(proxy.hidden)
                if mode == "slow":
                    time.sleep(delay)
                if mode == "garbage":
                    self._reply(200, b"<html><body>502 Bad Gateway (nginx)</body></html>",
                                "text/html")  # fmt: skip
                    return
                try:
                    resp = requests.request(
                        method,
                        proxy.upstream + self.path,
                        data=data,
                        headers={"Content-Type": self.headers.get("Content-Type", "")},
                        timeout=10,
                    )
                except requests.RequestException:
                    self._reply(502, b'{"status":"error","error":"upstream unreachable"}')
                    return
                body = resp.content
                if resp.status_code == 200 and mode in ("nan", "empty", "drop"):
                    body = proxy._rewrite(body, mode, hidden)
                self._reply(resp.status_code, body)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def set(self, mode: str, *, hidden: set[str] | None = None, delay_s: float = 1.0) -> None:
        assert mode in MODES, mode
        with self._lock:
            self.mode, self.delay_s, self.hidden = mode, delay_s, set(hidden or ())

    def _rewrite(self, body: bytes, mode: str, hidden: set[str]) -> bytes:
        doc = json.loads(body)
        result = doc.get("data", {}).get("result")
        if doc.get("data", {}).get("resultType") != "vector" or not isinstance(result, list):
            return body  # the faults are in vectors' series: a scalar (time()) passes
        if mode == "empty":
            doc["data"]["result"] = []
        elif mode == "drop":
            doc["data"]["result"] = [
                r for r in result if r.get("metric", {}).get(self.model_label) not in hidden
            ]
        else:  # nan
            for r in result:
                if "value" in r:
                    r["value"][1] = "NaN"
        return json.dumps(doc).encode()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def data_ready(prom: PrometheusServer, models: set[str], window_s: float) -> bool:
    """True when Prometheus answers a non-empty rate for every model at now."""
    rows = prom.query(
        f"sum by (model_name) (rate(vllm:request_success_total[{window_s:g}s]))",
        at_s=time.time(),
    )
    return models <= {r["metric"].get("model_name", "") for r in rows}
