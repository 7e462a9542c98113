"""Start and drive a real Prometheus server for the integration tests.

Owns: finding the binary (env `PROMETHEUS_BIN`, else `prometheus` on PATH), writing a
scrape config, starting the server on a free loopback port with its TSDB in a temporary
folder, waiting for readiness (`/-/ready`) and for data (the query API), both polled
against a deadline, and stopping it. Times are seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

SCRAPE_INTERVAL_S = 1.0
MISSING_BINARY = (
    "no Prometheus server binary: these tests start a real one. Install it "
    "(`make prometheus`, or `apt-get install prometheus`) or set PROMETHEUS_BIN to a "
    "prometheus 2.x+ binary."
)


def find_prometheus() -> str | None:
    """Path of the Prometheus binary: $PROMETHEUS_BIN, else `prometheus` on PATH."""
    env = os.environ.get("PROMETHEUS_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("prometheus")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago and that this process has not been
    given before.

    The kernel may hand the same ephemeral port to two binds in a row once the first socket
    is closed, so two ports taken for one test (a gRPC and a metrics port, an engine's port
    and its Prometheus's, before either server has bound) could be the same. Remembering the
    ports already given makes every port from this function distinct within a test run.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_for(check: Callable[[], bool], deadline_s: float, what: str, poll_s: float = 0.2) -> None:
    """Poll `check` until it returns True or `deadline_s` seconds pass (AssertionError).

    HTTP errors count as "not yet" (a server still starting refuses or answers 503).
    """
    end = time.monotonic() + deadline_s
    last_exc: Exception | None = None
    while time.monotonic() < end:
        try:
            if check():
                return
        except requests.RequestException as exc:
            last_exc = exc
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {deadline_s} s waiting for {what} (last: {last_exc})")


class PrometheusServer:
    """A Prometheus process scraping `targets` (job -> host:port list) every second."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        targets: Mapping[str, Sequence[str]],
        rule_files: Sequence[Path] = (),
        target_labels: Mapping[str, Mapping[str, str]] | None = None,
        honor_labels: Sequence[str] = (),
        job_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.targets = targets
        self.target_labels = dict(target_labels or {})
        """Labels a target's series get (host:port -> labels; `instance` overrides the
        address, as a service discovery's relabeling does)."""
        self.job_labels = dict(job_labels or {})
        """Labels every target of a job gets (job -> labels), after its own
        `target_labels`: what one scrape config adds and another does not (a
        ServiceMonitor's `service`)."""
        self.honor_labels = frozenset(honor_labels)
        """Jobs whose scraped `job` and `instance` labels are kept (`honor_labels: true`):
        an exporter that speaks for other targets, e.g. with their own `up` series."""
        self.rule_files = tuple(rule_files)
        """Rule files (Prometheus rule-group YAML) the server loads, evaluated every
        scrape interval unless a group sets its own."""
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        """Base URL of the HTTP API."""
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        lines = [
            "global:",
            f"  scrape_interval: {SCRAPE_INTERVAL_S:g}s",
            f"  scrape_timeout: {SCRAPE_INTERVAL_S:g}s",
            f"  evaluation_interval: {SCRAPE_INTERVAL_S:g}s",
        ]
        if self.rule_files:
            lines.append("rule_files:")
            lines += [f"  - '{p}'" for p in self.rule_files]
        lines.append("scrape_configs:")
        for job, targets in self.targets.items():
            plain = [t for t in targets if t not in self.target_labels]
            lines.append(f"  - job_name: {job}")
            if job in self.honor_labels:
                lines.append("    honor_labels: true")
            lines.append("    static_configs:")
            common = self.job_labels.get(job, {})
            if plain or not targets:
                lines.append(f"      - targets: [{', '.join(f'{t!r}' for t in plain)}]")
                if common:
                    lines.append(f"        labels: {_yaml_labels(common)}")
            for t in targets:
                if t in self.target_labels:
                    labels = _yaml_labels({**self.target_labels[t], **common})
                    lines += [f"      - targets: [{t!r}]", f"        labels: {labels}"]
        path = self.workdir / "prometheus.yml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def reload(self, targets: Mapping[str, Sequence[str]]) -> None:
        """Scrape `targets` from now on (config rewritten, SIGHUP): targets left out
        vanish from service discovery, as a deleted pod does."""
        assert self.proc is not None, "start() first"
        self.targets = targets
        self._write_config()
        self.proc.send_signal(signal.SIGHUP)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log, for failure messages."""
        try:
            return self.log_path.read_text()[-chars:]
        except OSError:
            return "<no log>"

    def start(self, ready_deadline_s: float = 30.0, attempts: int = 3) -> None:
        """Start the server and wait until `/-/ready` answers 200 (retries on port races)."""
        config = self._write_config()
        for attempt in range(attempts):
            self.port = free_port()
            data = self.workdir / f"data-{attempt}"
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={data}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            proc = self.proc

            def ready(proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    raise _Exited
                return requests.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200

            try:
                wait_for(ready, ready_deadline_s, "Prometheus /-/ready")
                return
            except _Exited:
                continue  # most likely the port was taken meanwhile: try another
            except AssertionError:
                self.stop()
                raise
        raise AssertionError(f"Prometheus did not start; log:\n{self.log_tail()}")

    def query(self, expr: str, at_s: float | None = None) -> list[dict[str, Any]]:
        """Run an instant query directly (not through the code under test)."""
        params: dict[str, str] = {"query": expr}
        if at_s is not None:
            params["time"] = f"{at_s:.3f}"
        resp = requests.get(f"{self.url}/api/v1/query", params=params, timeout=5.0)
        resp.raise_for_status()
        body = resp.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def __enter__(self) -> PrometheusServer:
        """Start it (`start`); stopped on leaving the block."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Terminate the server (kill after 10 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)


def _yaml_labels(labels: Mapping[str, str]) -> str:
    """`labels` as a YAML flow mapping: {"a": "b"} -> `{a: 'b'}`."""
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in labels.items()) + "}"


class _Exited(Exception):
    """The Prometheus process exited while we waited for it."""
