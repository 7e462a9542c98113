"""Watch streams per client host: one host past `max_watch_streams_per_client` is refused
with RESOURCE_EXHAUSTED naming that limit, while another host still gets streams
(engines' WatchBatchingConfig and KEDA's StreamIsActive alike). Real gRPC on loopback:
an IPv4 client (127.0.0.1) and an IPv6 one (::1) are the two hosts of one dual-stack
listener. No sleeps: a stream holds its slot once its first message arrived."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.core import ServiceCore
from service.security import StreamLimiter, peer_host
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread, wait_until

PER_CLIENT = 2
REQ = pb.GetBatchingConfigRequest(model="demo")
REF = es.ScaledObjectRef(name="so", namespace="default", scalerMetadata={"model": "demo"})


def _core() -> ServiceCore:
    clock = FakeClock()
    core = ServiceCore(
        make_config(model_entry("demo")),
        FakeSource({"demo": 20.0}),
        MemoryStore(),
        clock=clock,
        logger=quiet_logger(),
    )
    core.tick(clock.advance(5))  # a decision: StreamIsActive has a value to send
    return core


def _open(call: Any) -> Any:
    """`call` once its first message arrived (its slot is held from then on)."""
    next(iter(call))
    return call


def _refusal(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        next(iter(call))
    return ei.value


@pytest.fixture(params=["inline", "process"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[ServerThread, int]]:
    """A dual-stack listener ([::], IPv4 clients too) at most 2 streams per client host
    and 8 in all; inline and in the serving process."""
    with ServerThread(
        _core(),
        grpc_listen="[::]:0",
        serving=request.param,
        log_level="warning",
        max_watch_streams=8,
        max_watch_streams_per_client=PER_CLIENT,
    ) as s:
        assert s.server.port is not None
        yield s, s.server.port


def test_one_host_over_its_share_is_refused_while_another_host_gets_streams(
    served: tuple[ServerThread, int],
) -> None:
    s, port = served
    with (
        grpc.insecure_channel(f"127.0.0.1:{port}") as v4,
        grpc.insecure_channel(f"[::1]:{port}") as v6,
    ):
        held = [_open(pb_grpc.BatchingServiceStub(v4).WatchBatchingConfig(REQ, timeout=30))]
        held.append(_open(es_grpc.ExternalScalerStub(v4).StreamIsActive(REF, timeout=30)))
        # the host's third stream, of any kind, is refused, naming the per-client limit
        for call in (
            pb_grpc.BatchingServiceStub(v4).WatchBatchingConfig(REQ, timeout=10),
            es_grpc.ExternalScalerStub(v4).StreamIsActive(REF, timeout=10),
            health_pb2_grpc.HealthStub(v4).Watch(health_pb2.HealthCheckRequest(), timeout=10),
        ):
            err = _refusal(call)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert f"limit {PER_CLIENT} per client" in (err.details() or ""), err.details()
        # the other host is still served: an engine's stream and KEDA's
        got = pb_grpc.BatchingServiceStub(v6).WatchBatchingConfig(REQ, timeout=30)
        assert next(iter(got)).model == "demo"
        keda = es_grpc.ExternalScalerStub(v6).StreamIsActive(REF, timeout=30)
        assert next(iter(keda)).result is True
        held += [got, keda]
        if s.server.serving == "inline":  # the limiter of the serving process is its own
            assert s.server.streams.active == 4 and s.server.streams.refused == 3
            # a stream given back is the host's to use again
            held.pop(0).cancel()
            wait_until(lambda: s.server.streams.client_active("ipv4:127.0.0.1:1") == 1, 10, "freed")
            again = pb_grpc.BatchingServiceStub(v4).WatchBatchingConfig(REQ, timeout=10)
            assert next(iter(again)).model == "demo"
            held.append(again)
        for call in held:
            call.cancel()


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.7:54321", "10.0.0.7"),
        ("ipv6:[fd00::7]:54321", "fd00::7"),
        ("ipv6:%5Bfd00::7%5D:54321", "fd00::7"),
        ("ipv6:[::ffff:10.0.0.7]:40000", "10.0.0.7"),
        ("unix:/run/governor.sock", "unix"),
        ("unix:", "unix"),
        ("unix-abstract:governor", "unix"),
        ("", None),
    ],
)
def test_peer_host_leaves_out_the_port(peer: str, host: str | None) -> None:
    assert peer_host(peer) == host


def test_per_client_limit_is_checked() -> None:
    assert StreamLimiter(1024).per_client == 512
    assert StreamLimiter(1).per_client == 1
    for bad in (0, 5):
        with pytest.raises(ValueError, match=rf"within \[1, 4\] \(got {bad}\)"):
            StreamLimiter(4, per_client=bad)
    limiter = StreamLimiter(3, per_client=1)
    assert limiter.try_acquire("ipv4:10.0.0.7:1") and not limiter.try_acquire("ipv4:10.0.0.7:2")
    assert "limit 1 per client" in limiter.message("x", "ipv4:10.0.0.7:2")
    assert limiter.try_acquire("ipv4:10.0.0.8:1") and limiter.try_acquire(None)
    assert not limiter.try_acquire("ipv4:10.0.0.9:1")  # all 3 taken
    assert "limit 3)" in limiter.message("x", "ipv4:10.0.0.9:1")
    limiter.release("ipv4:10.0.0.7:1")
    assert limiter.try_acquire("ipv4:10.0.0.7:3")
