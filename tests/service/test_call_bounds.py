"""Calls in progress on the gRPC listeners (service.security.HardeningInterceptor):
a call that never sends its request message ends after REQUEST_WAIT_S, and one client
host holds at most half of --max-concurrent-rpcs. Calls that sent their headers and
nothing else had held every slot from one connection for as long as it lived, and the
health probes, KEDA and the engines got RESOURCE_EXHAUSTED. Real gRPC on loopback: an
IPv4 client (127.0.0.1) and an IPv6 one (::1) are two hosts of one dual-stack listener.
No sleeps: the tests wait for the server's count of calls, and for the calls' ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import service.security as security
from tests.service.harness import ServerThread, wait_until
from tests.service.test_stream_per_client import _core

RPCS = 8
"""--max-concurrent-rpcs of the served listener: 4 per client host."""

CHECK = "/grpc.health.v1.Health/Check"


@pytest.fixture
def served() -> Iterator[ServerThread]:
    with ServerThread(
        _core(), grpc_listen="[::]:0", log_level="warning", max_concurrent_rpcs=RPCS
    ) as s:
        yield s


def _silent_calls(channel: grpc.Channel, n: int, stop: threading.Event) -> list[Any]:
    """`n` Health/Check calls that send their headers and never their request."""

    def never() -> Iterator[bytes]:
        stop.wait(60.0)
        return
        yield b""  # a generator that sends nothing

    send = channel.stream_unary(CHECK, request_serializer=None, response_deserializer=None)
    return [send.future(never()) for _ in range(n)]


def _calls_held(s: ServerThread) -> Any:
    listeners = s.server._listeners
    assert listeners is not None
    return listeners._calls


def test_one_host_holds_at_most_half_the_calls(served: ServerThread) -> None:
    port = served.server.port
    stop = threading.Event()
    with (
        grpc.insecure_channel(f"127.0.0.1:{port}") as v4,
        grpc.insecure_channel(f"[::1]:{port}") as v6,
    ):
        held = _silent_calls(v4, RPCS // 2, stop)
        try:
            calls = _calls_held(served)
            wait_until(lambda: calls.active == RPCS // 2, 20, "the silent calls counted")
            with pytest.raises(grpc.RpcError) as ei:
                health_pb2_grpc.HealthStub(v4).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"from this client 127.0.0.1 (limit {RPCS // 2}" in (ei.value.details() or "")
            # the other host (the kubelet's probe, KEDA, an engine) is served
            answer = health_pb2_grpc.HealthStub(v6).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            for call in held:
                call.cancel()
            stop.set()


def test_a_call_without_its_request_ends_and_frees_its_slot(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(security, "REQUEST_WAIT_S", 0.3)
    stop = threading.Event()
    with grpc.insecure_channel(f"127.0.0.1:{served.server.port}") as v4:
        held = _silent_calls(v4, RPCS // 2, stop)
        try:
            for call in held:
                with pytest.raises(grpc.RpcError) as ei:
                    call.result(timeout=30)
                assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert f"no request message for {CHECK}" in (ei.value.details() or "")
            calls = _calls_held(served)
            wait_until(lambda: calls.active == 0, 20, "the slots freed")
            answer = health_pb2_grpc.HealthStub(v4).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            stop.set()


@pytest.mark.slow
def test_an_idle_watch_stream_with_keepalive_pings_stays_open(served: ServerThread) -> None:
    """The engine plugin pings every 30 s on a watch stream that may carry nothing for
    hours; the listener allows a ping every 10 s without data. Its option was misspelt,
    so grpc's 5 minutes held: the third ping was answered GOAWAY "too_many_pings" and
    the stream cut (every ~90 s at 30 s). Pinging every 12 s here, the cut came at ~36 s;
    the stream must instead last to its own 45 s deadline."""
    from governor_api import governor_v1_pb2 as pb
    from governor_api import governor_v1_pb2_grpc as pb_grpc

    options = [
        ("grpc.keepalive_time_ms", 12_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(f"127.0.0.1:{served.server.port}", options=options) as ch:
        stream = pb_grpc.BatchingServiceStub(ch).WatchBatchingConfig(
            pb.GetBatchingConfigRequest(model="demo"), timeout=45
        )
        updates = iter(stream)
        assert next(updates).model == "demo"  # the current knobs, then nothing changes
        with pytest.raises(grpc.RpcError) as ei:
            next(updates)
    assert ei.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, ei.value.details()


def test_a_silent_connection_is_closed_at_the_handshake_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that never sends the HTTP/2 preface is closed by the server (it had
    been kept a minute, and any number of them accepted)."""
    import socket

    import service.listeners as listeners

    monkeypatch.setattr(listeners, "HANDSHAKE_TIMEOUT_MS", 300)
    with (
        ServerThread(_core(), log_level="warning") as s,
        socket.create_connection(("127.0.0.1", s.server.port), timeout=30) as sock,
    ):
        while sock.recv(1024):  # the server's own SETTINGS frame, then its close
            pass  # (a recv past 30 s raises: never closed)


def test_an_idle_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A channel without a call open is told to go away after CONNECTION_IDLE_MS (it
    had been kept for good); the client reconnects at its next call."""
    import service.listeners as listeners

    monkeypatch.setattr(listeners, "CONNECTION_IDLE_MS", 300)
    states: list[grpc.ChannelConnectivity] = []
    idle = threading.Event()

    def seen(state: grpc.ChannelConnectivity) -> None:
        states.append(state)
        if grpc.ChannelConnectivity.READY in states and state != grpc.ChannelConnectivity.READY:
            idle.set()

    with (
        ServerThread(_core(), log_level="warning") as s,
        grpc.insecure_channel(f"127.0.0.1:{s.server.port}") as channel,
    ):
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1
        channel.subscribe(seen)
        assert idle.wait(30), states  # the server closed it: READY -> IDLE
        channel.unsubscribe(seen)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1


def test_the_call_limiters_refusal_names_the_limit_hit() -> None:
    calls = security.CallLimiter(3, per_client=2)
    a, b, c = "ipv4:10.0.0.7:1", "ipv4:10.0.0.8:1", "ipv4:10.0.0.9:1"
    assert calls.try_acquire(a) and calls.try_acquire(a) and not calls.try_acquire(a)
    assert "from this client 10.0.0.7 (limit 2, half of" in calls.message("m", a)
    assert calls.try_acquire(b) and not calls.try_acquire(c)  # every slot taken
    assert "(limit 3, --max-concurrent-rpcs); m was refused" in calls.message("m", c)
