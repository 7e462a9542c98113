"""Composite scale-out rules through the admin API over real gRPC on loopback: a rule
naming an unknown signal is refused with the signal named and nothing changes; a valid
rule round-trips and reaches the decider (its stage shows in Explain)."""

from __future__ import annotations

import grpc
import pytest

from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.core import ServiceCore
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread


def _target(signal: str) -> pb.ModelTarget:
    t = pb.ModelTarget(name="demo", deployment="demo")
    t.sla.ttft_p95_ms, t.sla.itl_p95_ms = 1000, 50
    rule = t.scale_out_rules.add(name="waiting-queue", join="all")
    rule.conditions.add(signal=signal, op=">", threshold=0.0, for_s=0)
    rule.action.add_replicas = 2
    return t


def test_rules_over_the_admin_api() -> None:
    clock = FakeClock()
    core = ServiceCore(
        make_config(model_entry("demo")),
        FakeSource({"demo": 10.0}),
        MemoryStore(),
        clock=clock,
        logger=quiet_logger(),
    )
    with ServerThread(core, logger=quiet_logger()) as srv:
        channel = grpc.insecure_channel(srv.address)
        admin = pb_grpc.AdminServiceStub(channel)
        before = admin.ListTargets(pb.ListTargetsRequest(), timeout=5).revision
        with pytest.raises(grpc.RpcError) as ei:
            admin.SetTarget(pb.SetTargetRequest(target=_target("queue_len")), timeout=5)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert "unknown signal 'queue_len'" in ei.value.details()  # type: ignore[attr-defined]
        assert admin.ListTargets(pb.ListTargetsRequest(), timeout=5).revision == before

        admin.SetTarget(pb.SetTargetRequest(target=_target("waiting")), timeout=5)
        got = admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5).target
        cond = got.scale_out_rules[0].conditions[0]
        assert (cond.signal, cond.op, cond.HasField("threshold")) == ("waiting", ">", True)
        core.tick(clock.advance(5))
        trace = admin.Explain(pb.ExplainRequest(model="demo", last=1), timeout=5)
        stages = [s.name for s in trace.decisions[-1].stages]
        assert stages[-1] == "rules"
        assert "waiting=0 > 0 not held" in trace.decisions[-1].stages[-1].detail
        channel.close()
