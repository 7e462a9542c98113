"""Latency distributions (p50/p90/p95/p99 of TTFT, ITL, e2e) over real gRPC on loopback:
GetLatencyDistribution (what engines put in `X-Latency-Dist`), GetStatus, and a follower
that mirrors the leader's through the shared store. Ticks on a fake clock (no sleeps)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from estimators.types import LatencyQuantiles
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.core import ServiceCore
from service.leader import AlwaysLeader
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread

TTFT = LatencyQuantiles(p50_ms=110.0, p90_ms=240.0, p95_ms=310.0, p99_ms=900.0)
ITL = LatencyQuantiles(p50_ms=18.0, p90_ms=26.0, p95_ms=31.0, p99_ms=48.0)
E2E = LatencyQuantiles(p50_ms=2100.0, p90_ms=5200.0, p95_ms=None, p99_ms=9800.0)


class _Follower(AlwaysLeader):
    """An instance that never leads (it mirrors the leader's state from the store)."""

    def is_leader(self) -> bool:
        return False


def _q(q: Any) -> tuple[float | None, ...]:
    return tuple(
        getattr(q, f"{n}_ms") if q.HasField(f"{n}_ms") else None
        for n in ("p50", "p90", "p95", "p99")
    )


def _core(source: FakeSource, store: MemoryStore, clock: FakeClock, **kw: Any) -> ServiceCore:
    cfg = make_config(model_entry("demo"), knob_sustain_s=0)
    return ServiceCore(cfg, source, store, clock=clock, logger=quiet_logger(), **kw)


def test_engines_and_status_get_the_observed_distribution() -> None:
    clock, store = FakeClock(), MemoryStore()
    source = FakeSource({"demo": 10.0}, dists={"ttft": TTFT, "itl": ITL, "e2e": E2E})
    core = _core(source, store, clock)
    with ServerThread(core, logger=quiet_logger()) as srv:
        channel = grpc.insecure_channel(srv.address)
        stub = pb_grpc.BatchingServiceStub(channel)
        req = pb.GetBatchingConfigRequest(model="demo", engine_id="pod-1")
        before = stub.GetLatencyDistribution(req, timeout=5)
        assert before.present is False and not before.ttft.HasField("p50_ms")

        core.tick(clock.advance(5))
        got = stub.GetLatencyDistribution(req, timeout=5)
        assert got.present and got.model == "demo"
        assert got.observed_at_unix_s == pytest.approx(clock.wall())
        assert _q(got.ttft) == (110.0, 240.0, 310.0, 900.0)
        assert _q(got.itl) == (18.0, 26.0, 31.0, 48.0)
        # e2e p95 missing from the source's distribution: unset, never 0
        assert _q(got.e2e) == (2100.0, 5200.0, None, 9800.0)

        status = pb_grpc.AdminServiceStub(channel).GetStatus(pb.GetStatusRequest(), timeout=5)
        obs = status.models[0].observation
        assert _q(obs.ttft) == (110.0, 240.0, 310.0, 900.0)
        assert _q(obs.e2e) == (2100.0, 5200.0, None, 9800.0)

        # A tick without latency data keeps the last distribution (with its time).
        source.dists = {}
        source.set("demo", None)
        core.tick(clock.advance(5))
        kept = stub.GetLatencyDistribution(req, timeout=5)
        assert kept.present and kept.observed_at_unix_s == got.observed_at_unix_s

        with pytest.raises(grpc.RpcError) as ei:
            stub.GetLatencyDistribution(pb.GetBatchingConfigRequest(model="nope"), timeout=5)
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        channel.close()


def test_a_follower_serves_the_leaders_distribution() -> None:
    clock, store = FakeClock(), MemoryStore()
    leader = _core(FakeSource({"demo": 10.0}, dists={"ttft": TTFT, "itl": ITL}), store, clock)
    follower = _core(FakeSource({"demo": 10.0}), store, clock, elector=_Follower("follower-0"))
    leader.tick(clock.advance(5))
    saved = store.load_state()
    assert saved is not None
    assert saved.published["demo"].latency.itl == (18.0, 26.0, 31.0, 48.0)  # p50..p99, ms
    follower.tick(clock.mono)
    with ServerThread(follower, logger=quiet_logger()) as srv:
        channel = grpc.insecure_channel(srv.address)
        got = pb_grpc.BatchingServiceStub(channel).GetLatencyDistribution(
            pb.GetBatchingConfigRequest(model="demo"), timeout=5
        )
        assert got.present
        assert _q(got.itl) == (18.0, 26.0, 31.0, 48.0)
        assert not got.e2e.HasField("p99_ms")
        channel.close()
