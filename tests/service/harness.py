"""Runs a GovernorServer on 127.0.0.1 (port 0) in a background event-loop thread, for
tests that talk real gRPC on loopback. Ticks are driven by the test (`autotick=False`)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from service.core import ServiceCore
from service.server import GovernorServer


class ServerThread:
    """`with ServerThread(core) as s:` serves `core` at `s.address` until the block ends."""

    def __init__(self, core: ServiceCore, **server_kw: Any) -> None:
        kw: dict[str, Any] = {
            "grpc_listen": "127.0.0.1:0",
            "metrics_listen": None,
            "autotick": False,
            # These tests exercise the admin API itself; tests/faults covers its credentials.
            "allow_unauthenticated_admin": True,
        }
        kw.update(server_kw)
        self.core = core
        self.server = GovernorServer(core, **kw)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.stopped = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(20)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        if self.stopped:
            return
        self.stopped = True
        asyncio.run_coroutine_threadsafe(self.server.stop(grace_s), self.loop).result(grace_s + 20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "") -> Any:
    """Poll `predicate` until it returns a truthy value (bounded deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        time.sleep(0.01)


class ServiceProcess:
    """A service subprocess whose stderr is drained on a thread; `port` is parsed from
    the line `serve` prints once the gRPC server listens."""

    PORT_LINE = re.compile(r"governor: serving gRPC on port (\d+), metrics on port (\w+)")

    def __init__(
        self, argv: list[str], cwd: str | None = None, pass_fds: tuple[int, ...] = ()
    ) -> None:
        import os
        import subprocess
        import sys

        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
            pass_fds=pass_fds,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def ports(self, timeout_s: float = 30.0) -> tuple[int, str]:
        """(gRPC port, metrics port or "None") once the service listens."""

        def found() -> tuple[int, str] | None:
            for line in self.lines:
                m = self.PORT_LINE.search(line)
                if m:
                    return int(m.group(1)), m.group(2)
            if self.proc.poll() is not None:
                raise AssertionError("service exited early:\n" + "\n".join(self.lines[-40:]))
            return None

        return wait_until(found, timeout_s, "the service to listen")

    def port(self, timeout_s: float = 30.0) -> int:
        return self.ports(timeout_s)[0]

    def output(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def keda_replicas(channel: grpc.Channel, model: str = "demo") -> int | None:
    """The replica count KEDA would read (GetMetrics' metricValue); None while the
    scaler answers with an error (no decision yet, server not ready)."""
    stub = es_grpc.ExternalScalerStub(channel)
    ref = es.ScaledObjectRef(scalerMetadata={"model": model})
    try:
        resp = stub.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=2)
    except grpc.RpcError:
        return None
    return resp.metricValues[0].metricValue
