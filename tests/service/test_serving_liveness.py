"""The serving process's liveness check (service.serving, "Liveness"): a child that hangs
without dying (SIGSTOP) is killed and restarted, serving the current board again; a child
that answers late but answers is never killed; a tick that holds the governor's
interpreter longer than the whole threshold does not count as missed beats; a child that
cannot be started (fork/exec refused) is started again after the back-off. Real
processes, real gRPC on loopback."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from actuators.publisher import DecisionBoard
from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.core import ServiceCore
from service.listeners import ListenerSpec
from service.serving import RESTART_BACKOFF_S, InternalAdmin, ServingProcess
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread, wait_until

POLICY: dict[str, Any] = {
    "knob_sustain_s": 0,
    "cooldown_after_scale_up_s": 0,
    "scale_down_stabilization_s": 0,
}


class _Served:
    """A core served with serving="process" in this test process (ticks by the test)."""

    def __init__(self, **server_kw: Any) -> None:
        self.clock = FakeClock()
        self.source = FakeSource({"demo": 20.0})
        cfg = make_config(model_entry("demo"), **POLICY)
        self.core = ServiceCore(
            cfg, self.source, MemoryStore(), clock=self.clock, logger=quiet_logger()
        )
        self.thread = ServerThread(self.core, serving="process", log_level="warning", **server_kw)

    def __enter__(self) -> _Served:
        self.thread.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.stop()

    @property
    def proc(self) -> ServingProcess:
        proc = self.thread.server.serving_process
        assert proc is not None
        return proc

    def tick(self) -> None:
        self.core.tick(self.clock.advance(5.0))

    def served(self, channel: grpc.Channel) -> tuple[int, int, int] | None:
        """(generation, max_num_seqs, replicas) the engines and KEDA are served; None
        while KEDA is told there is no decision yet (UNAVAILABLE: the serving process has
        not received the first board, which it gets after the tick that made it)."""
        req = pb.GetBatchingConfigRequest(model="demo", engine_id="pod-1")
        got = pb_grpc.BatchingServiceStub(channel).GetBatchingConfig(
            req, timeout=10, wait_for_ready=True
        )
        ref = es.ScaledObjectRef(scalerMetadata={"model": "demo"})
        try:
            keda = es_grpc.ExternalScalerStub(channel).GetMetrics(
                es.GetMetricsRequest(scaledObjectRef=ref), timeout=10
            )
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return None
            raise
        return (got.generation, got.max_num_seqs, keda.metricValues[0].metricValue)

    def board(self) -> tuple[int, int, int]:
        want = self.core.board.get("demo")
        assert want.replicas is not None
        return (want.generation, want.knobs.max_num_seqs, want.replicas)

    def restarts(self, reason: str) -> float:
        return float(self.core.m_serving_restarts.labels(reason)._value.get())

    def up(self) -> float:
        value = self.core.metrics.registry.get_sample_value("governor_serving_up")
        assert value is not None
        return value


@pytest.fixture
def stopped_pids() -> Iterator[list[int]]:
    """Pids a test SIGSTOPs: continued at the end whatever happened (never left stopped)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _health(address: str, timeout_s: float) -> Any:
    """The server's health as a probe sees it (a new connection each time)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout_s, wait_for_ready=True
        ).status


def test_a_hung_serving_process_is_killed_and_restarted(stopped_pids: list[int]) -> None:
    """SIGSTOP (alive, answers nothing): after 10 unanswered beats (the heartbeat thread,
    0.1 s apart: 1 s, well above what a loaded machine delays a healthy child's answer)
    the governor kills it and starts another on the same port, which serves the board
    that moved meanwhile; counted as "unresponsive", not "exited"."""
    with _Served(serving_heartbeat_s=0.1, serving_heartbeat_misses=10) as s:
        channel = grpc.insecure_channel(s.thread.address)
        s.tick()
        wait_until(lambda: s.served(channel) == s.board(), 10, "the first decision served")
        assert s.up() == 1
        first = s.proc.pid
        assert first is not None
        wait_until(lambda: s.proc.beats_answered >= 2, 10, "heartbeats answered")
        os.kill(first, signal.SIGSTOP)
        stopped_pids.append(first)
        before = s.board()
        s.source.set("demo", 200.0)
        s.tick()  # the board moves while the child is hung
        assert s.board() != before
        second = s.proc.wait_serving(first, 30)
        assert second is not None and second != first
        assert s.served(channel) == s.board()
        assert _health(s.thread.address, 10) == health_pb2.HealthCheckResponse.SERVING
        assert s.restarts("unresponsive") == 1 and s.restarts("exited") == 0
        wait_until(lambda: s.up() == 1, 10, "governor_serving_up back to 1")
        with pytest.raises(ProcessLookupError):
            os.kill(first, 0)  # killed and reaped, not left stopped
        channel.close()


def test_a_late_child_is_not_killed_and_the_threshold_is_exact(stopped_pids: list[int]) -> None:
    """Beats driven by the test (no heartbeat thread, so nothing here depends on time):
    a stopped child misses 3 beats of a threshold of 4 and is continued: its late answer
    resets the count and it is never killed, however often that happens; governor_serving_up
    says 0 while it does not answer. Then stopped for good: the 4th miss kills it, not the
    3rd."""
    with _Served(serving_heartbeat_s=None, serving_heartbeat_misses=4) as s:
        proc = s.proc
        pid = proc.pid
        assert pid is not None
        for _ in range(3):
            os.kill(pid, signal.SIGSTOP)
            stopped_pids.append(pid)
            answered = proc.beats_answered
            assert [proc.beat() for _ in range(3)] == [False] * 3
            assert s.up() == 0  # 3 beats unanswered
            with pytest.raises(grpc.RpcError) as err:
                _health(s.thread.address, 0.5)  # what a readiness probe sees meanwhile
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            os.kill(pid, signal.SIGCONT)
            wait_until(lambda a=answered: proc.beats_answered >= a + 3, 10, "the late answer")
            assert s.up() == 1
            assert proc.beat() is False  # the count restarted: no kill
        wait_until(lambda: proc.beats_answered == proc.beats_asked, 10, "all beats answered")
        os.kill(pid, signal.SIGSTOP)
        assert [proc.beat() for _ in range(4)] == [False] * 4  # 4 sent, none answered
        assert proc.pid == pid and s.restarts("unresponsive") == 0
        assert proc.beat() is True  # the 4 misses: killed
        assert s.up() == 0
        assert proc.wait_serving(pid, 30) not in (None, pid)
        assert s.restarts("unresponsive") == 1
        assert _health(s.thread.address, 10) == health_pb2.HealthCheckResponse.SERVING


def test_a_tick_holding_the_interpreter_past_the_threshold_kills_nothing() -> None:
    """The whole governor interpreter held (as a 1,000-model tick holds it, here by a
    read(2) through ctypes.PyDLL, which keeps the GIL) for 5 s, 2.5x the threshold of
    10 beats 0.2 s apart: no beats are sent meanwhile, so none are missed; afterwards
    the same child answers the following beats."""
    with _Served(serving_heartbeat_s=0.2, serving_heartbeat_misses=10) as s:
        proc = s.proc
        pid = proc.pid
        wait_until(lambda: proc.beats_answered >= 3, 10, "heartbeats answered")
        read_fd, write_fd = os.pipe()
        writer = subprocess.Popen(["sh", "-c", "sleep 5; printf x"], stdout=write_fd)
        os.close(write_fd)
        read = ctypes.PyDLL(None).read
        read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
        buf = ctypes.create_string_buffer(1)
        try:
            assert read(read_fd, buf, 1) == 1  # the GIL held until the writer writes
        finally:
            os.close(read_fd)
            writer.wait(10)
        after = proc.beats_answered
        wait_until(lambda: proc.beats_answered >= after + 12, 30, "beats after the hold")
        assert proc.pid == pid
        assert s.restarts("unresponsive") == 0 and s.restarts("exited") == 0


class _Events:
    """A logger that keeps the events it was given, by level."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.seen.append((level, event, kw))


def test_a_failed_start_is_retried_with_the_back_off_until_a_child_serves(
    tmp_path: Any,
) -> None:
    """The child dies while fork/exec fails (EAGAIN, 3 times): each failure is logged and
    tried again after the next back-off (0.5, 1, 2, 4 s: recorded by an injected sleeper,
    not waited) until a child starts on the same port and serves; one restart counted."""
    real = subprocess.Popen
    failing = [0]
    attempts: list[int] = []

    def popen(*args: Any, **kw: Any) -> Any:
        attempts.append(failing[0])
        if failing[0] > 0:
            failing[0] -= 1
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(*args, **kw)

    waits: list[float] = []
    log = _Events()
    admin = InternalAdmin(f"unix:{tmp_path / 'none.sock'}", "token")
    proc = ServingProcess(
        DecisionBoard(),
        ListenerSpec(grpc_listen="127.0.0.1:0"),
        admin,
        log_level="error",
        heartbeat_s=None,
        popen=popen,
        sleep=lambda s: bool(waits.append(s)),
        logger=log,
    )
    port, _ = proc.start()
    proc.spec = ListenerSpec(grpc_listen=f"127.0.0.1:{port}")  # as the server does
    try:
        first = proc.pid
        assert first is not None
        failing[0] = 3
        os.kill(first, signal.SIGKILL)
        second = proc.wait_serving(first, 60)
        assert second is not None and second != first
        assert _health(f"127.0.0.1:{port}", 10) == health_pb2.HealthCheckResponse.SERVING
        assert proc.up
        assert len(attempts) == 5  # the first start, 3 refused, the restart
        b = RESTART_BACKOFF_S
        assert waits == [b, 2 * b, 4 * b, 8 * b]
        failed = [kw for level, event, kw in log.seen if event == "serving_process_start_failed"]
        assert [kw["retry_in_s"] for kw in failed] == [2 * b, 4 * b, 8 * b]
        assert all(level == "error" for level, event, _ in log.seen if "failed" in event)
        assert proc.restarts == 1
    finally:
        proc.stop(1)
