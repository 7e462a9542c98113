"""Child processes of the service benchmarks: `governor run`, the fake Prometheus and the
gRPC ceiling server, started, read and stopped from the benchmark process.

This owns starting a child with a port line to wait for (on stdout or stderr), draining
its output on a thread (line arrival times are kept: the governor's one log line per
model per tick shows when each tick ran), its CPU seconds and resident set from /proc,
and writing the governor config for N models pointed at the fake Prometheus.

Units: seconds (CPU, wall), MB (10^6 bytes) of resident memory.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from benchmarks.common import SLA_MS

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


class Child:
    """A child process whose `port_prefix` line (on `stream`) gives its port.

    `line_times`: monotonic arrival time of every other output line (bounded only by
    the run's length: a 1,000-model governor writes 1,000 lines per 5 s tick).
    """

    def __init__(
        self,
        argv: Sequence[str],
        port_prefix: str,
        *,
        stream: str = "stdout",
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        keep_lines: int = 0,
    ) -> None:
        self.port_prefix = port_prefix
        self.line_times: list[float] = []
        self.kept: list[str] = []
        self._keep = keep_lines
        self.ports: list[int] = []
        self._port_seen = threading.Event()
        self.proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
            stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=cwd,
        )
        pipe = self.proc.stdout if stream == "stdout" else self.proc.stderr
        assert pipe is not None
        self._reader = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self._reader.start()

    def _drain(self, pipe: object) -> None:
        for raw in iter(pipe.readline, b""):  # type: ignore[attr-defined]
            now = time.monotonic()
            line = raw.decode(errors="replace")
            if line.startswith(self.port_prefix):
                rest = line[len(self.port_prefix) :]
                self.ports = [int(p) for p in _ints(rest)]
                self._port_seen.set()
                continue
            self.line_times.append(now)
            if len(self.kept) < self._keep:
                self.kept.append(line.rstrip("\n"))

    def port(self, timeout_s: float = 120.0) -> int:
        """The first port on the port line (waits for it; RuntimeError if the child dies)."""
        deadline = time.monotonic() + timeout_s
        while not self._port_seen.wait(0.1):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.proc.args!r} exited ({self.proc.returncode}):\n" + "\n".join(self.kept)
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.proc.args!r}: no port line in {timeout_s} s")
        return self.ports[0]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pids(self) -> list[int]:
        """The child and its running descendants (`governor run` serves from a child
        process of its own: service/serving.py)."""
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    todo += [int(c) for c in task.read_text().split()]
                except OSError:
                    continue
        return out

    def cpu_s(self) -> float:
        """User + system CPU seconds so far of the child and its running descendants
        (all their threads)."""
        total = 0.0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        return total

    def rss_mb(self) -> tuple[float, float]:
        """(current, peak) resident set, MB, summed over the child and its running
        descendants (pages they share count once per process: an upper bound)."""
        cur = peak = 0.0
        for c, p in self.rss_by_process().values():
            cur, peak = cur + c, peak + p
        return cur, peak

    def pss_mb(self) -> float:
        """Proportional set size, MB, summed over the child and its descendants: each
        shared page counted once in total (Pss of /proc/PID/smaps_rollup)."""
        total = 0.0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/smaps_rollup") as fh:
                    for line in fh:
                        if line.startswith("Pss:"):
                            total += int(line.split()[1]) * 1024 / 1e6
            except OSError:
                continue
        return total

    def unique_mb(self) -> float:
        """Resident memory of the child and its descendants with shared file pages
        counted once, MB: their anonymous pages summed, plus for each mapped file the
        most any of them holds resident (the processes are separate executables; what
        they share is the interpreter's and the libraries' file pages). A lower bound
        of what a container holding them all is charged, close to it."""
        anon = 0.0
        files: dict[str, float] = {}
        for pid in self.pids():
            per_file: dict[str, float] = {}
            try:
                with open(f"/proc/{pid}/smaps") as fh:
                    path = ""
                    for line in fh:
                        head = line.split()
                        if not head:
                            continue
                        if "-" in head[0] and not head[0].endswith(":"):
                            path = head[5] if len(head) > 5 and head[5].startswith("/") else ""
                        elif head[0] == "Rss:" and path:
                            per_file[path] = per_file.get(path, 0.0) + int(head[1]) * 1024 / 1e6
                        elif head[0] == "Anonymous:":
                            anon += int(head[1]) * 1024 / 1e6
            except OSError:
                continue
            for path, mb in per_file.items():
                files[path] = max(files.get(path, 0.0), mb)
        return anon + sum(files.values())

    def rss_by_process(self) -> dict[int, tuple[float, float]]:
        """pid -> (current, peak) resident set, MB, of the child and its descendants."""
        out: dict[int, tuple[float, float]] = {}
        for pid in self.pids():
            cur = peak = 0.0
            try:
                with open(f"/proc/{pid}/status") as fh:
                    for line in fh:
                        if line.startswith("VmRSS:"):
                            cur = int(line.split()[1]) * 1024 / 1e6
                        elif line.startswith("VmHWM:"):
                            peak = int(line.split()[1]) * 1024 / 1e6
            except OSError:
                continue
            out[pid] = (cur, peak)
        return out

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _ints(text: str) -> list[str]:
    out, cur = [], ""
    for ch in text:
        if ch.isdigit():
            cur += ch
        elif cur:
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


SCRAPE_INTERVAL_S = 15.0
"""How often the benchmarks' Prometheus scrapes the engines, s: stated in the governor
config (`prometheus.scrape_interval_s`) and reported by the fake Prometheus's targets."""
UNUSED_URL = "http://fake-prometheus.invalid"
"""The Prometheus URL of the config the fake Prometheus reads (it reads no URL)."""


def write_governor_config(
    path: Path, names: Sequence[str], prometheus_url: str = UNUSED_URL, **policy: object
) -> Path:
    """A `governor run` config for `names` (SLA as the tick benchmark's, engines scraped
    every `SCRAPE_INTERVAL_S`) -> `path`."""
    doc = {
        "prometheus": {
            "url": prometheus_url,
            "timeout_s": 30,
            "scrape_interval_s": SCRAPE_INTERVAL_S,
        },
        "policy": dict(policy),
        "models": [
            {
                "name": n,
                "deployment": f"d{i}",
                "sla": dict(SLA_MS),
                "replicas": {"min_replicas": 1, "max_replicas": 64},
            }
            for i, n in enumerate(names)
        ],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def fake_prometheus(config: Path, variants: int = 4) -> tuple[Child, str]:
    """Start the fake Prometheus answering the queries of a governor with `config` (its
    URL unused; see benchmarks.fake_prometheus); returns (child, base URL)."""
    from benchmarks.fake_prometheus import PORT_LINE

    child = Child(
        [
            sys.executable,
            "-m",
            "benchmarks.fake_prometheus",
            "--config",
            str(config),
            "--variants",
            str(variants),
        ],
        PORT_LINE,
        stream="stdout",
        keep_lines=20,
    )
    return child, f"http://127.0.0.1:{child.port()}"


class NoTickDataError(RuntimeError):
    """The governor's ticks had no data: numbers measured on it would be on errors."""


def tick_data_problem(metrics_text: str) -> str | None:
    """Why the governor's ticks had no data, from its /metrics text; None when every
    model had data at the latest tick and the source never failed."""
    errors = {
        kind: float(v)
        for kind, v in re.findall(
            r'^governor_source_errors_total\{kind="([^"]+)"\} (\S+)$', metrics_text, re.M
        )
        if float(v) > 0
    }
    flags = re.findall(r"^governor_model_stale\{[^}]*\} (\S+)$", metrics_text, re.M)
    stale = sum(float(v) > 0 for v in flags)
    if errors or stale or not flags:
        listed = ", ".join(f"{k} {v:g}" for k, v in sorted(errors.items())) or "none"
        return (
            f"the governor's ticks had no data: {stale} of {len(flags)} models without "
            f"data, source errors by kind: {listed} (does the fake Prometheus answer the "
            "governor's queries? see benchmarks/fake_prometheus.py)"
        )
    return None


def governor_run(config: Path, extra: Sequence[str] = (), keep_lines: int = 50) -> Child:
    """Start `governor run --config CONFIG` on loopback ports (memory store); its port line
    gives the gRPC port (`ports[0]`) and the /metrics port (`ports[1]`)."""
    argv = [
        sys.executable,
        "-m",
        "service.cli",
        "run",
        "--config",
        str(config),
        "--grpc-listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--store",
        "memory",
        "--leader-election",
        "off",
        *extra,
    ]
    return Child(argv, "governor: serving gRPC on port ", stream="stderr", keep_lines=keep_lines)


def grpc_ceiling() -> Child:
    """Start the minimal grpc.aio server (benchmarks.grpc_ceiling)."""
    from benchmarks.grpc_ceiling import PORT_LINE

    return Child([sys.executable, "-m", "benchmarks.grpc_ceiling"], PORT_LINE)
