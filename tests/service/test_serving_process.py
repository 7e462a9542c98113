"""The serving process (service.serving): engine and KEDA calls answered while a tick
holds the governor's interpreter, a killed serving process restarted with the current
board, the serving process gone when the governor is, admin calls and the serving
side's metrics passed through. Real gRPC on loopback, real processes."""

from __future__ import annotations

import json
import os
import select
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest

from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.core import ServiceCore
from service.leader import AlwaysLeader
from service.security import AdminToken
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread, ServiceProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "serving-test-token-0123456789"
POLICY: dict[str, Any] = {
    "knob_sustain_s": 0,
    "cooldown_after_scale_up_s": 0,
    "scale_down_stabilization_s": 0,
}


def _batching(channel: grpc.Channel, **kw: Any) -> pb.BatchingConfig:
    req = pb.GetBatchingConfigRequest(model="demo", engine_id="pod-1")
    return pb_grpc.BatchingServiceStub(channel).GetBatchingConfig(req, **kw)


def _keda(channel: grpc.Channel, **kw: Any) -> es.GetMetricsResponse:
    ref = es.ScaledObjectRef(scalerMetadata={"model": "demo"})
    return es_grpc.ExternalScalerStub(channel).GetMetrics(
        es.GetMetricsRequest(scaledObjectRef=ref), **kw
    )


def _wait_readable(fd: int, timeout_s: float) -> bool:
    return bool(select.select([fd], [], [], timeout_s)[0])


def _exited(pid: int, timeout_s: float) -> bool:
    """Whether process `pid` (not our child) ends within `timeout_s` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return _wait_readable(fd, timeout_s)
    finally:
        os.close(fd)


def _serving_pid(svc: ServiceProcess) -> int:
    def found() -> int | None:
        for line in svc.lines:
            if '"serving"' in line and "serving_pid" in line:
                return int(json.loads(line)["serving_pid"])
        return None

    return int(wait_until(found, 30, "the serving log line"))


def _held_governor(mode: str, pipes: list[tuple[int, int]]) -> ServiceProcess:
    (arm_r, _), (_, entered_w), (release_r, _) = pipes
    argv = [
        "-m", "tests.service.serve_held", "--serving", mode, "--arm-fd", str(arm_r),
        "--entered-fd", str(entered_w), "--release-fd", str(release_r),
    ]  # fmt: skip
    return ServiceProcess(argv, cwd=str(ROOT), pass_fds=(arm_r, entered_w, release_r))


@pytest.mark.parametrize("mode", ["process", "inline"])
def test_engine_and_keda_calls_answer_while_a_tick_holds_the_interpreter(mode: str) -> None:
    """A tick holds the governor's GIL (HeldSource): in the serving process the
    engines' and KEDA's calls answer meanwhile; inline they cannot (the proof that
    the hold is real), and answer once the tick goes on."""
    pipes = [os.pipe() for _ in range(3)]
    svc = _held_governor(mode, pipes)
    (_, arm_w), (entered_r, _), (_, release_w) = pipes
    try:
        port = svc.port()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            # a decision is on the board (KEDA answers only then)
            wait_until(lambda: _replicas(channel), 30, "a decision")
            os.write(arm_w, b"x")
            assert _wait_readable(entered_r, 30), "the tick did not reach the source"
            if mode == "process":
                for _ in range(20):
                    assert _batching(channel, timeout=5).model == "demo"
                    assert _keda(channel, timeout=5).metricValues[0].metricValue >= 1
            else:
                with pytest.raises(grpc.RpcError) as err:
                    _batching(channel, timeout=1)
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            os.write(release_w, b"x")
            assert _batching(channel, timeout=10).model == "demo"
            admin = pb_grpc.AdminServiceStub(channel)  # through the proxy, in process mode

            def engines_seen() -> int:
                req = pb.GetStatusRequest(models=["demo"])
                return admin.GetStatus(req, timeout=10).models[0].published.engines_seen

            wait_until(lambda: engines_seen() == 1, 10, "the engine reported")
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(timeout=20) == 0
    finally:
        svc.kill()
        for r, w in pipes:
            for fd in (r, w):
                os.close(fd)


def _replicas(channel: grpc.Channel) -> int | None:
    try:
        return _keda(channel, timeout=2).metricValues[0].metricValue
    except grpc.RpcError:
        return None


def test_serving_process_exits_when_the_governor_dies() -> None:
    """SIGKILL of the governor: its serving process stops (never serves stale decisions
    for long) and the port stops answering."""
    pipes = [os.pipe() for _ in range(3)]
    svc = _held_governor("process", pipes)
    try:
        port = svc.port()
        child = _serving_pid(svc)
        assert child != svc.proc.pid
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert _batching(channel, timeout=10).model == "demo"
        svc.proc.kill()
        svc.proc.wait(10)
        assert _exited(child, 15), "the serving process outlived the governor"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError):
            _batching(channel, timeout=2)
    finally:
        svc.kill()
        for r, w in pipes:
            for fd in (r, w):
                os.close(fd)


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
        self.channel = grpc.insecure_channel(self.thread.address)
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        self.thread.stop()

    def tick(self) -> None:
        self.core.tick(self.clock.advance(5.0))

    def served(self) -> tuple[int, int, int, int]:
        """(generation, max_num_seqs, max_num_batched_tokens, replicas) the engines and
        KEDA are served (waits for a serving process)."""
        got = _batching(self.channel, timeout=10, wait_for_ready=True)
        replicas = _keda(self.channel, timeout=10).metricValues[0].metricValue
        return (got.generation, got.max_num_seqs, got.max_num_batched_tokens, replicas)

    def board(self) -> tuple[int, int, int, int]:
        want = self.core.board.get("demo")
        knobs = want.knobs
        assert want.replicas is not None
        return (want.generation, knobs.max_num_seqs, knobs.max_num_batched_tokens, want.replicas)


def test_killed_serving_process_is_restarted_and_serves_the_current_board() -> None:
    with _Served() as s:
        proc = s.thread.server.serving_process
        assert proc is not None and proc.pid is not None
        first = proc.pid
        s.tick()
        wait_until(lambda: s.served() == s.board(), 10, "the first decision served")
        before = s.board()
        os.kill(first, signal.SIGKILL)
        s.source.set("demo", 200.0)
        s.tick()  # the board moves while no serving process holds it
        assert s.board() != before
        second = proc.wait_serving(first, 30)
        assert second is not None and second != first
        # a new process: it can only know the board from the snapshot it was sent
        assert s.served() == s.board()
        assert s.core.m_serving_restarts.labels("exited")._value.get() == 1
        assert s.core.m_serving_restarts.labels("unresponsive")._value.get() == 0
        # the channel still points at the first port: the new process listens there
        assert proc.spec.grpc_listen == f"127.0.0.1:{s.thread.server.port}"


def test_watch_gets_each_decision_and_admin_and_metrics_pass_through() -> None:
    """A watch stream sees the tick's decision (the feed, no extra tick); an admin
    call with wrong credentials is refused by the serving process and counted in the
    governor's metrics; an authorized one reaches the core."""
    with _Served(allow_unauthenticated_admin=False, admin_token=AdminToken.from_value(TOKEN)) as s:
        stub = pb_grpc.BatchingServiceStub(s.channel)
        req = pb.GetBatchingConfigRequest(model="demo", engine_id="pod-7")
        stream = iter(stub.WatchBatchingConfig(req, timeout=30))
        assert next(stream).generation == 0
        wait_until(lambda: s.thread.server.serving_process.watch_streams == 1, 10, "1 stream")
        s.tick()
        changed = next(stream)
        assert changed.generation == 1 and changed.reason == "KNOBS_CHANGED"
        assert changed.max_num_seqs_ceiling > 0  # the slot's ceiling crossed too
        admin = pb_grpc.AdminServiceStub(s.channel)
        with pytest.raises(grpc.RpcError) as err:
            admin.GetStatus(
                pb.GetStatusRequest(), timeout=5, metadata=[("authorization", "Bearer nope")]
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        wait_until(lambda: s.core.m_admin_denied._value.get() == 1, 10, "the denial counted")
        auth = [("authorization", f"Bearer {TOKEN}")]

        def published() -> Any:
            req = pb.GetStatusRequest(models=["demo"])
            return admin.GetStatus(req, timeout=10, metadata=auth).models[0].published

        assert published().generation == 1
        wait_until(lambda: published().engines_seen == 1, 10, "the engine reported")
        with pytest.raises(grpc.RpcError) as err:
            admin.GetTarget(pb.GetTargetRequest(model="nope"), timeout=10, metadata=auth)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND  # the core's status, passed on


def test_governor_run_defaults_to_the_serving_process() -> None:
    from service.cli import build_parser

    assert build_parser().parse_args(["run"]).serving == "process"
    assert build_parser().parse_args(["run", "--serving", "inline"]).serving == "inline"


def test_the_tick_thread_runs_niced_and_the_rest_of_the_process_does_not() -> None:
    """TickScheduler(nice=N): the tick runs on a thread whose nice is N above the
    process's; the event loop's thread keeps its priority."""
    import asyncio
    import threading

    from service.ticker import TickScheduler

    seen: list[tuple[int, int]] = []
    ran = threading.Event()

    def tick() -> None:
        tid = threading.get_native_id()
        seen.append((tid, os.getpriority(os.PRIO_PROCESS, tid)))
        ran.set()

    async def run() -> int:
        ticker = TickScheduler(tick, 60.0, quiet_logger(), nice=5)
        ticker.start()
        try:
            assert await asyncio.to_thread(ran.wait, 10)
        finally:
            ticker.stop()
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base = os.getpriority(os.PRIO_PROCESS, 0)
    loop_nice = asyncio.run(run())
    assert loop_nice == base
    assert seen and seen[0][1] == min(19, base + 5)
    assert seen[0][0] != threading.get_native_id()


class _Follower(AlwaysLeader):
    """Never the leader: the core mirrors the leader's saved publications."""

    def is_leader(self) -> bool:
        return False

    def leader_identity(self) -> str:
        return "leader"


def test_a_followers_serving_process_serves_the_leaders_publications() -> None:
    clock = FakeClock()
    source = FakeSource({"demo": 60.0})
    store = MemoryStore()
    cfg = make_config(model_entry("demo"), **POLICY)
    leader = ServiceCore(cfg, source, store, clock=clock, logger=quiet_logger())
    follower = ServiceCore(
        cfg, source, store, clock=clock, elector=_Follower("b"), logger=quiet_logger()
    )
    with (
        ServerThread(follower, serving="process", log_level="warning") as t,
        grpc.insecure_channel(t.address) as channel,
    ):

        def served() -> tuple[int, int, int]:
            got = _batching(channel, timeout=10)
            replicas = _keda(channel, timeout=10).metricValues[0].metricValue
            return (got.generation, got.max_num_seqs, replicas)

        for rate in (60.0, 150.0):
            source.set("demo", rate)
            leader.tick(clock.advance(5.0))
            follower.tick(clock.monotonic())
            lp = leader.board.get("demo")
            assert lp.replicas is not None
            want = (lp.generation, lp.knobs.max_num_seqs, lp.replicas)
            wait_until(lambda w=want: served() == w, 10, f"the leader's decision at {rate}")
        assert follower.board.get("demo").origin == "leader"
        assert follower.loop.snapshot().at_s is None  # the follower decided nothing


def test_a_serving_process_that_cannot_listen_fails_the_start_naming_the_flag() -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    core = ServiceCore(
        make_config(model_entry("demo")), FakeSource(), MemoryStore(), logger=quiet_logger()
    )
    server = ServerThread(core, serving="process", grpc_listen=f"127.0.0.1:{port}")
    try:
        with pytest.raises(OSError, match="--grpc-listen"), server:
            pass
    finally:
        taken.close()
        server.loop.call_soon_threadsafe(server.loop.stop)
