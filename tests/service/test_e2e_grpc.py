"""End-to-end over real gRPC on loopback: KEDA conformance, engines' API, admin API and
the operator CLI. Ticks are driven by the test on a fake clock (no sleeps)."""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.cli import main as cli_main
from service.core import ServiceCore
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread, wait_until

POLICY: dict[str, Any] = {
    "knob_sustain_s": 0,
    "cooldown_after_scale_up_s": 0,
    "scale_down_stabilization_s": 0,
    "scale_to_zero_idle_s": 10,
}


class Service:
    """A served core with its fake clock and source, and client stubs."""

    def __init__(self, core: ServiceCore, clock: FakeClock, source: FakeSource, log: Any) -> None:
        self.core, self.clock, self.source = core, clock, source
        self.thread = ServerThread(core, logger=log)

    def __enter__(self) -> Service:
        self.thread.__enter__()
        self.channel = grpc.insecure_channel(self.thread.address)
        self.keda = es_grpc.ExternalScalerStub(self.channel)
        self.batching = pb_grpc.BatchingServiceStub(self.channel)
        self.admin = pb_grpc.AdminServiceStub(self.channel)
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        self.thread.stop()

    @property
    def address(self) -> str:
        return self.thread.address

    def tick(self, dt_s: float = 5.0) -> None:
        self.core.tick(self.clock.advance(dt_s))


def _service(*models: dict[str, Any], rates: dict[str, float | None] | None = None) -> Service:
    clock = FakeClock()
    source = FakeSource(dict(rates or {}))
    cfg = make_config(*(models or (model_entry(),)), **POLICY)
    log = quiet_logger()
    core = ServiceCore(cfg, source, MemoryStore(), clock=clock, logger=log)
    return Service(core, clock, source, log)


@pytest.fixture
def svc() -> Iterator[Service]:
    with _service(
        model_entry("demo", replicas={"min_replicas": 0, "max_replicas": 20}),
        model_entry("meta-llama/Llama-3.1-8B", namespace="llm"),
        rates={"demo": 20.0, "meta-llama/Llama-3.1-8B": 5.0},
    ) as s:
        yield s


def _code(exc_info: pytest.ExceptionInfo[grpc.RpcError]) -> grpc.StatusCode:
    return exc_info.value.code()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- KEDA conformance
class KedaConformanceClient:
    """What KEDA does with an external scaler, written from the contract
    (docs/ARCHITECTURE.md, Actuation and KEDA's external scaler / HPA v2 semantics):

    - GetMetricSpec once per ScaledObject: one MetricSpec; target = targetSizeFloat as a
      milli-quantity when > 0, else targetSize; metric type AverageValue.
    - each poll: GetMetrics(metricName) then IsActive; a value is metricValueFloat as a
      milli-quantity when > 0, else metricValue; NaN/Inf/negatives become 0.
    - the HPA (AverageValue): ratio = total / (target * current); within tolerance 0.1
      keep `current`, else desired = ceil(total / target).
    """

    TOLERANCE = 0.1

    def __init__(self, stub: es_grpc.ExternalScalerStub, metadata: dict[str, str]) -> None:
        self.stub = stub
        self.ref = es.ScaledObjectRef(name="so-demo", namespace="default", scalerMetadata=metadata)
        self.spec: es.MetricSpec | None = None

    def metric_spec(self) -> es.MetricSpec:
        resp = self.stub.GetMetricSpec(self.ref, timeout=5)
        assert len(resp.metricSpecs) == 1, "one metric per ScaledObject"
        self.spec = resp.metricSpecs[0]
        return self.spec

    def target_milli(self) -> int:
        assert self.spec is not None
        if self.spec.targetSizeFloat > 0:
            return int(self.spec.targetSizeFloat * 1000)
        return self.spec.targetSize * 1000

    @staticmethod
    def _value_milli(v: es.MetricValue) -> int:
        f = v.metricValueFloat
        if math.isfinite(f) and f > 0:
            return int(f * 1000)
        return max(0, v.metricValue) * 1000

    def poll(self) -> tuple[int, bool]:
        """(metric total in milli-units, active) as one KEDA poll sees them."""
        assert self.spec is not None
        resp = self.stub.GetMetrics(
            es.GetMetricsRequest(scaledObjectRef=self.ref, metricName=self.spec.metricName),
            timeout=5,
        )
        total = sum(self._value_milli(v) for v in resp.metricValues)
        active = self.stub.IsActive(self.ref, timeout=5).result
        return total, active

    def hpa_desired(self, total_milli: int, current: int) -> int:
        target = self.target_milli()
        if current > 0:
            ratio = total_milli / (target * current)
            if abs(1.0 - ratio) <= self.TOLERANCE:
                return current
        return math.ceil(total_milli / target)


def test_keda_drives_the_hpa_to_the_decided_replicas(svc: Service) -> None:
    keda = KedaConformanceClient(svc.keda, {"model": "demo", "scalerAddress": "gov:50051"})
    spec = keda.metric_spec()
    assert spec.targetSizeFloat == 1.0 and spec.targetSize == 1
    assert spec.metricName == "governor-demo"
    seen = set()
    # Steps big enough to move the decision on the calibrated (faster) default profile:
    # 2, 7 and 16 replicas (a second step of 60 req/s no longer left 2).
    for rate in (20.0, 130.0, 300.0, 45.0):
        svc.source.set("demo", rate)
        svc.tick()
        decided = svc.core.loop.snapshot().models["demo"].decision
        assert decided is not None and decided.valid
        total, active = keda.poll()
        # a current size far from the decision, so the HPA tolerance cannot hide an error
        current = decided.replicas * 3 + 1
        assert keda.hpa_desired(total, current) == decided.replicas
        assert active is (decided.replicas > 0)
        seen.add(decided.replicas)
    assert len(seen) >= 3, f"the load steps should move the decision: {seen}"


def test_keda_zero_is_reported_in_both_fields_and_inactive(svc: Service) -> None:
    keda = KedaConformanceClient(svc.keda, {"model": "demo"})
    keda.metric_spec()
    svc.tick()
    svc.source.set("demo", 0.0)
    for _ in range(20):
        svc.tick()
        if svc.core.board.get("demo").replicas == 0:
            break
    assert svc.core.board.get("demo").replicas == 0
    resp = svc.keda.GetMetrics(es.GetMetricsRequest(scaledObjectRef=keda.ref), timeout=5)
    assert resp.metricValues[0].metricValue == 0
    assert resp.metricValues[0].metricValueFloat == 0.0
    assert keda.poll() == (0, False)


def _drain(stream: Any) -> tuple[queue.Queue[object], threading.Thread]:
    """A thread putting each message's `result` of a StreamIsActive call on a queue,
    then the RpcError that ends it (if one does)."""
    got: queue.Queue[object] = queue.Queue()

    def consume() -> None:
        try:
            for msg in stream:
                got.put(msg.result)
        except grpc.RpcError as exc:
            got.put(exc)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    return got, t


def test_stream_is_active_sends_the_current_value_at_open_then_changes(svc: Service) -> None:
    svc.tick()
    assert svc.core.board.get("demo").replicas
    ref = es.ScaledObjectRef(name="so", namespace="default", scalerMetadata={"model": "demo"})
    stream = svc.keda.StreamIsActive(ref, timeout=30)
    got, t = _drain(stream)
    # No tick and no change since the stream opened: the first message must still come.
    assert got.get(timeout=10) is True
    svc.source.set("demo", 0.0)
    for _ in range(20):
        svc.tick()
        if svc.core.board.get("demo").replicas == 0:
            break
    assert got.get(timeout=10) is False
    # No message for ticks that do not change activity.
    svc.tick()
    svc.tick()
    assert got.empty()
    stream.cancel()
    t.join(5)


def test_stream_is_active_ends_when_its_model_moves_to_another_namespace(svc: Service) -> None:
    """A stream opened for the model in namespace `llm` ends with NOT_FOUND once the
    operator moves the model to `staging`, as GetMetrics answers then: it pushed on, and
    a `False` would have let KEDA scale the old namespace's workload to zero."""
    name = "meta-llama/Llama-3.1-8B"
    svc.tick()
    ref = es.ScaledObjectRef(name="so", namespace="llm", scalerMetadata={"model": name})
    stream = svc.keda.StreamIsActive(ref, timeout=30)
    got, t = _drain(stream)
    assert got.get(timeout=10) is True
    target = svc.admin.GetTarget(pb.GetTargetRequest(model=name), timeout=5).target
    target.namespace = "staging"
    svc.admin.SetTarget(pb.SetTargetRequest(target=target), timeout=5)
    svc.tick()
    end = got.get(timeout=10)
    assert isinstance(end, grpc.RpcError), end
    assert end.code() == grpc.StatusCode.NOT_FOUND and "staging" in (end.details() or "")
    t.join(5)


def test_a_pause_or_resume_that_changes_nothing_keeps_the_revision(svc: Service) -> None:
    """Pausing a paused model (or resuming a running one) writes nothing: the revision
    an operator read for `target set --expected-revision` still holds."""
    svc.admin.PauseActuation(pb.PauseRequest(model="demo"), timeout=5)
    rev = svc.core.targets_revision
    svc.admin.PauseActuation(pb.PauseRequest(model="demo"), timeout=5)
    assert svc.core.targets_revision == rev
    svc.admin.ResumeActuation(pb.PauseRequest(model="demo"), timeout=5)
    resumed = svc.core.targets_revision
    assert resumed != rev
    svc.admin.ResumeActuation(pb.PauseRequest(model="demo"), timeout=5)
    assert svc.core.targets_revision == resumed


@pytest.mark.parametrize(
    ("metadata", "code", "text"),
    [
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "scalerMetadata.model"),
        ({"modelFromEnv": "demo"}, grpc.StatusCode.INVALID_ARGUMENT, "modelFromEnv is not read"),
        ({"model": ""}, grpc.StatusCode.INVALID_ARGUMENT, "scalerMetadata.model"),
        ({"model": "m" * 254}, grpc.StatusCode.INVALID_ARGUMENT, "at most 253 characters"),
        ({"model": "demo", "namespace": " "}, grpc.StatusCode.INVALID_ARGUMENT, "namespace"),
        ({"model": "  demo "}, grpc.StatusCode.OK, ""),
        ({"model": "nope"}, grpc.StatusCode.NOT_FOUND, "'nope' is not a configured model"),
        ({"model": "demo", "namespace": "prod"}, grpc.StatusCode.NOT_FOUND, "namespace"),
    ],
)
def test_keda_bad_metadata_is_refused_with_a_message(
    svc: Service, metadata: dict[str, str], code: grpc.StatusCode, text: str
) -> None:
    svc.tick()
    ref = es.ScaledObjectRef(name="so", namespace="default", scalerMetadata=metadata)
    for call in (
        lambda: svc.keda.GetMetricSpec(ref, timeout=5),
        lambda: svc.keda.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=5),
        lambda: svc.keda.IsActive(ref, timeout=5),
    ):
        if code == grpc.StatusCode.OK:  # whitespace around the name is removed
            call()
            continue
        with pytest.raises(grpc.RpcError) as ei:
            call()
        assert _code(ei) == code
        assert text in ei.value.details()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("namespace", "metadata", "refused"),
    [
        ("staging", {"model": "demo"}, True),
        ("staging", {"model": "demo", "namespace": "default"}, True),
        ("default", {"model": "demo"}, False),
        ("", {"model": "demo"}, False),  # not KEDA: no namespace sent, none checked
    ],
)
def test_keda_refuses_a_scaled_object_from_another_namespace(
    svc: Service, namespace: str, metadata: dict[str, str], refused: bool
) -> None:
    """A copy of the model's ScaledObject in namespace `staging` (KEDA sends the
    ScaledObject's namespace in every call) would scale its own workload to the
    model's count: NOT_FOUND naming both namespaces, on every call."""
    svc.tick()
    ref = es.ScaledObjectRef(name="so", namespace=namespace, scalerMetadata=metadata)
    for call in (
        lambda: svc.keda.GetMetricSpec(ref, timeout=5),
        lambda: svc.keda.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=5),
        lambda: svc.keda.IsActive(ref, timeout=5),
    ):
        if not refused:
            call()
            continue
        with pytest.raises(grpc.RpcError) as ei:
            call()
        assert _code(ei) == grpc.StatusCode.NOT_FOUND
        details = ei.value.details()  # type: ignore[attr-defined]
        assert "'default'" in details and "'staging'" in details, details


def test_keda_namespaced_model_and_metric_name(svc: Service) -> None:
    svc.tick()
    ref = es.ScaledObjectRef(
        scalerMetadata={"model": "meta-llama/Llama-3.1-8B", "namespace": "llm", "x": "y"}
    )
    spec = svc.keda.GetMetricSpec(ref, timeout=5).metricSpecs[0]
    assert spec.metricName == "governor-meta-llama-llama-3-1-8b"
    with pytest.raises(grpc.RpcError) as ei:
        svc.keda.GetMetrics(
            es.GetMetricsRequest(scaledObjectRef=ref, metricName="governor-other"), timeout=5
        )
    assert _code(ei) == grpc.StatusCode.NOT_FOUND
    ok = svc.keda.GetMetrics(
        es.GetMetricsRequest(scaledObjectRef=ref, metricName=spec.metricName), timeout=5
    )
    assert ok.metricValues[0].metricValue == svc.core.board.get("meta-llama/Llama-3.1-8B").replicas


def test_keda_before_any_decision_is_unavailable_not_zero() -> None:
    with _service(rates={}) as s:
        ref = es.ScaledObjectRef(scalerMetadata={"model": "demo"})
        assert s.keda.GetMetricSpec(ref, timeout=5).metricSpecs[0].targetSizeFloat == 1
        for call in (
            lambda: s.keda.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=5),
            lambda: s.keda.IsActive(ref, timeout=5),
        ):
            with pytest.raises(grpc.RpcError) as ei:
                call()
            assert _code(ei) == grpc.StatusCode.UNAVAILABLE
        # Missing data keeps it that way: a NoDataError tick publishes nothing.
        s.tick()
        with pytest.raises(grpc.RpcError) as ei:
            s.keda.IsActive(ref, timeout=5)
        assert _code(ei) == grpc.StatusCode.UNAVAILABLE


def test_stream_metric_spec_is_unimplemented(svc: Service) -> None:
    ref = es.ScaledObjectRef(scalerMetadata={"model": "demo"})
    with pytest.raises(grpc.RpcError) as ei:
        list(svc.keda.StreamMetricSpec(ref, timeout=5))
    assert _code(ei) == grpc.StatusCode.UNIMPLEMENTED


# ---------------------------------------------------------------------- engines
def test_batching_config_and_watch(svc: Service) -> None:
    req = pb.GetBatchingConfigRequest(model="demo", engine_id="pod-1")
    first = svc.batching.GetBatchingConfig(req, timeout=5)
    assert (first.generation, first.reason) == (0, "default")
    assert (first.max_num_seqs, first.max_num_batched_tokens) == (256, 8192)
    assert list(first.engine_args) == [
        "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
    ]  # fmt: skip
    stream = svc.batching.WatchBatchingConfig(req, timeout=30)
    it = iter(stream)
    at_open = next(it)
    assert at_open.generation == 0
    svc.tick()
    changed = next(it)
    assert changed.generation == 1
    assert changed.reason == "KNOBS_CHANGED"
    assert changed.decided_at_unix_s == pytest.approx(svc.clock.wall())
    assert (changed.max_num_seqs, changed.max_num_batched_tokens) != (256, 8192)
    stream.cancel()
    status = svc.admin.GetStatus(pb.GetStatusRequest(models=["demo"]), timeout=5)
    assert status.models[0].published.engines_seen == 1


def test_batching_unknown_model_and_bad_request(svc: Service) -> None:
    with pytest.raises(grpc.RpcError) as ei:
        svc.batching.GetBatchingConfig(pb.GetBatchingConfigRequest(model="nope"), timeout=5)
    assert _code(ei) == grpc.StatusCode.NOT_FOUND
    assert "nope" in ei.value.details()  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as ei:
        svc.batching.GetBatchingConfig(pb.GetBatchingConfigRequest(model=""), timeout=5)
    assert _code(ei) == grpc.StatusCode.INVALID_ARGUMENT


# ---------------------------------------------------------------------- operator CLI
def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_set_target_moves_engine_knobs_and_keda_metric_within_one_tick(
    svc: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    # Enough load that the tighter ITL target needs more replicas on the calibrated
    # default profile (at 20 req/s two replicas serve both targets): 4 -> 5.
    svc.source.set("demo", 60.0)
    svc.tick()
    keda = KedaConformanceClient(svc.keda, {"model": "demo"})
    keda.metric_spec()
    before_knobs = svc.batching.GetBatchingConfig(
        pb.GetBatchingConfigRequest(model="demo"), timeout=5
    )
    before_metric, _ = keda.poll()
    code, out, err = _cli(
        capsys, "target", "set", "demo", "--itl-p95-ms", "10", "--server", svc.address
    )
    assert code == 0, err
    assert "set" in out
    svc.tick()  # one tick
    after_knobs = svc.batching.GetBatchingConfig(
        pb.GetBatchingConfigRequest(model="demo"), timeout=5
    )
    after_metric, _ = keda.poll()
    assert after_knobs.generation == before_knobs.generation + 1
    assert after_knobs.max_num_seqs < before_knobs.max_num_seqs
    assert after_metric > before_metric
    got = svc.admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5)
    assert got.target.sla.itl_p95_ms == 10
    assert got.target.sla.ttft_p95_ms == 1000  # untouched fields kept


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["target", "set", "demo", "--itl-p95-ms", "-5"], "sla.itl_p95_ms"),
        (["target", "set", "demo", "--ttft-p95-ms", "0"], "sla.ttft_p95_ms"),
        (
            ["target", "set", "demo", "--min-replicas", "5", "--max-replicas", "2"],
            "min_replicas (5) must be <= max_replicas (2)",
        ),
        (["target", "set", "demo", "--batching-policy", "fast"], "batching_policy"),
        (["target", "set", "demo", "--policy", "tick_interval_s=-1"], "tick_interval_s"),
        (["target", "set", "new-model", "--itl-p95-ms", "5"], "--deployment"),
        (["target", "get", "nope"], "'nope' is not configured"),
        (["target", "delete", "nope"], "'nope' is not configured"),
        (["explain", "nope"], "'nope' is not configured"),
        (["pause", "nope"], "'nope' is not configured"),
    ],
)
def test_cli_bad_values_exit_2_and_change_nothing(
    svc: Service, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    before = svc.admin.ListTargets(pb.ListTargetsRequest(), timeout=5)
    code, _, err = _cli(capsys, *argv, "--server", svc.address)
    assert code == 2
    assert message in err
    after = svc.admin.ListTargets(pb.ListTargetsRequest(), timeout=5)
    assert after == before


def test_cli_unreachable_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "target", "list", "--server", "127.0.0.1:1", "--timeout-s", "2")
    assert code == 1
    assert "cannot reach" in err


def test_cli_target_lifecycle_status_explain_pause(
    svc: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    a = ("--server", svc.address)
    code, out, err = _cli(
        capsys, "target", "set", "small", "--deployment", "small", "--ttft-p95-ms", "800",
        "--itl-p95-ms", "40", "--max-replicas", "3", *a,
    )  # fmt: skip
    assert code == 0, err
    code, out, _ = _cli(capsys, "target", "list", *a)
    assert code == 0 and "small" in out and "demo" in out
    code, out, _ = _cli(capsys, "target", "get", "small", *a)
    assert code == 0 and "itl_p95_ms: 40" in out
    svc.source.set("small", 2.0)
    svc.source.prefix_hit_frac = 0.62
    try:
        svc.tick()
    finally:
        svc.source.prefix_hit_frac = None
    code, out, _ = _cli(capsys, "status", "small", *a)
    assert code == 0
    assert "published: replicas=" in out and "p50=120ms" in out and "p90=250ms" in out
    assert "prompts: 60% of their tokens priced as prefix-cache hits" in out
    limit = svc.core.loop.snapshot().models["small"].decision.capacity_limit
    assert limit and f"capacity={limit}-bound" in out
    code, out, _ = _cli(capsys, "explain", "small", *a)
    assert code == 0 and "raw" in out and "clamp" in out and f"({limit}-bound)" in out
    # shadow mode: decisions go on, nothing is published
    code, out, _ = _cli(capsys, "pause", "small", *a)
    assert code == 0 and "paused" in out
    published = svc.core.board.get("small")
    svc.source.set("small", 60.0)
    svc.tick()
    assert svc.core.loop.snapshot().models["small"].decision.replicas > published.replicas
    # the latency distribution stays live (an observation, not an actuation)
    assert replace(svc.core.board.get("small"), latency=None) == replace(published, latency=None)
    code, out, _ = _cli(capsys, "resume", "small", *a)
    assert code == 0 and "actuating" in out
    svc.tick()
    assert svc.core.board.get("small").replicas > published.replicas
    code, out, _ = _cli(capsys, "target", "delete", "small", *a)
    assert code == 0
    code, _, err = _cli(capsys, "target", "get", "small", *a)
    assert code == 2


# ---------------------------------------------------------------------- admin API
def test_admin_status_explain_and_optimistic_concurrency(svc: Service) -> None:
    svc.tick()
    st = svc.admin.GetStatus(pb.GetStatusRequest(), timeout=5)
    assert st.leader and st.store == "memory"
    demo = next(m for m in st.models if m.model == "demo")
    assert demo.observation.present
    assert demo.observation.ttft.p50_ms == 120 and demo.observation.ttft.p95_ms == 300
    assert demo.observation.itl.p99_ms == 35
    assert demo.decision.valid and demo.decision.stage_reasons[0].startswith("raw:")
    limit = svc.core.loop.snapshot().models["demo"].decision.capacity_limit
    assert limit and demo.decision.capacity_limit == limit
    svc.tick()
    ex = svc.admin.Explain(pb.ExplainRequest(model="demo"), timeout=5)
    assert len(ex.decisions) == 2
    assert [s.name for s in ex.decisions[-1].stages][-1] == "clamp"
    assert ex.decisions[-1].stages[0].name == "raw"
    assert "demo @" in ex.decisions[-1].text
    got = svc.admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5)
    stale = got.revision
    t = pb.ModelTarget()
    t.CopyFrom(got.target)
    t.sla.itl_p95_ms = 45
    svc.admin.SetTarget(pb.SetTargetRequest(target=t, expected_revision=stale), timeout=5)
    t.sla.itl_p95_ms = 44
    with pytest.raises(grpc.RpcError) as ei:
        svc.admin.SetTarget(pb.SetTargetRequest(target=t, expected_revision=stale), timeout=5)
    assert _code(ei) == grpc.StatusCode.ABORTED
    assert svc.core.config.model("demo").sla.itl_p95_ms == 45
    with pytest.raises(grpc.RpcError) as ei:
        svc.admin.SetTarget(pb.SetTargetRequest(), timeout=5)
    assert _code(ei) == grpc.StatusCode.INVALID_ARGUMENT


def test_admin_refuses_deleting_the_last_model() -> None:
    with _service(rates={"demo": 1.0}) as s:
        with pytest.raises(grpc.RpcError) as ei:
            s.admin.DeleteTarget(pb.DeleteTargetRequest(model="demo"), timeout=5)
        assert _code(ei) == grpc.StatusCode.FAILED_PRECONDITION
        assert [m.name for m in s.core.config.models] == ["demo"]


def test_message_size_limit(svc: Service) -> None:
    t = pb.ModelTarget(name="x" * (5 * 1024 * 1024), deployment="x")
    with pytest.raises(grpc.RpcError) as ei:
        svc.admin.SetTarget(pb.SetTargetRequest(target=t), timeout=10)
    assert _code(ei) == grpc.StatusCode.RESOURCE_EXHAUSTED


# ---------------------------------------------------------------------- health, reflection
def test_health_and_reflection(svc: Service) -> None:
    health = health_pb2_grpc.HealthStub(svc.channel)
    for name in ("", "governor.v1.BatchingService", "externalscaler.ExternalScaler"):
        resp = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    db = ProtoReflectionDescriptorDatabase(svc.channel)
    services = set(db.get_services())
    assert {
        "governor.v1.BatchingService",
        "governor.v1.AdminService",
        "externalscaler.ExternalScaler",
        "grpc.health.v1.Health",
    } <= services
    from google.protobuf.descriptor_pool import DescriptorPool

    pool = DescriptorPool(db)
    method = pool.FindServiceByName("externalscaler.ExternalScaler").FindMethodByName("GetMetrics")
    assert method.output_type.full_name == "externalscaler.GetMetricsResponse"


def test_shutdown_ends_watch_streams_with_ok() -> None:
    """Graceful stop: watch streams end (clients reconnect elsewhere), health flips."""
    s = _service(rates={"demo": 1.0})
    with s:
        stream = s.batching.WatchBatchingConfig(
            pb.GetBatchingConfigRequest(model="demo"), timeout=30
        )
        it = iter(stream)
        next(it)
        done = threading.Event()
        out: dict[str, Any] = {}

        def drain() -> None:
            try:
                out["rest"] = list(it)
                out["code"] = stream.code()
            except grpc.RpcError as exc:
                out["code"] = exc.code()  # type: ignore[attr-defined]
            done.set()

        threading.Thread(target=drain, daemon=True).start()
        s.thread.stop(grace_s=5)
        wait_until(done.is_set, 10, "the watch stream to end")
        assert out["code"] == grpc.StatusCode.OK


def test_bounded_concurrency_refuses_calls_beyond_the_limit() -> None:
    """maximum_concurrent_rpcs: a held stream uses the only slot; the next call is
    refused at once with RESOURCE_EXHAUSTED instead of queueing without bound."""
    clock = FakeClock()
    log = quiet_logger()
    core = ServiceCore(make_config(), FakeSource({"demo": 1.0}), clock=clock, logger=log)
    with ServerThread(core, logger=log, max_concurrent_rpcs=1) as s:
        channel = grpc.insecure_channel(s.address)
        stub = pb_grpc.BatchingServiceStub(channel)
        req = pb.GetBatchingConfigRequest(model="demo")
        stream = stub.WatchBatchingConfig(req, timeout=30)
        next(iter(stream))
        with pytest.raises(grpc.RpcError) as ei:
            stub.GetBatchingConfig(req, timeout=5)
        assert _code(ei) == grpc.StatusCode.RESOURCE_EXHAUSTED
        stream.cancel()
        wait_until(lambda: _try(lambda: stub.GetBatchingConfig(req, timeout=5)), 10, "a free slot")
        channel.close()


def _try(fn: Any) -> bool:
    try:
        fn()
    except grpc.RpcError:
        return False
    return True
