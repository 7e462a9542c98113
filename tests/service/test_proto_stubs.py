"""The committed gRPC stubs match the `.proto` sources, and the contracts are intact."""

from __future__ import annotations

import re
from pathlib import Path

from governor_api import _generate, externalscaler_pb2, governor_v1_pb2

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_are_not_stale() -> None:
    stale = _generate.stale_files()
    assert stale == [], f"stale gRPC stubs, run `make proto`: {stale}"


def test_stale_check_detects_a_changed_proto(tmp_path: Path) -> None:
    """Changing a source must make the check fail (the check can fail at all)."""
    proto_root = tmp_path / "proto"
    for src in _generate.SOURCES:
        (proto_root / src).parent.mkdir(parents=True, exist_ok=True)
        (proto_root / src).write_text((ROOT / "proto" / src).read_text())
    gov = proto_root / "governor/v1/governor.proto"
    gov.write_text(gov.read_text().replace("string engine_id = 2;", "string engine = 2;"))
    # the descriptor comparison catches it whatever grpcio-tools version is installed
    assert "governor_v1_pb2.py" in _generate.stale_files(proto_root=proto_root)
    # and an unchanged copy of the sources is not stale
    gov.write_text((ROOT / "proto/governor/v1/governor.proto").read_text())
    assert _generate.stale_files(proto_root=proto_root) == []


def _fields(message: type) -> dict[str, tuple[int, int]]:
    d = message.DESCRIPTOR
    return {f.name: (f.number, f.type) for f in d.fields}


def test_keda_contract_field_names_and_numbers() -> None:
    """As docs/ARCHITECTURE.md, Actuation (KEDA's externalscaler.proto) states them."""
    fd = externalscaler_pb2.DESCRIPTOR
    assert fd.package == "externalscaler"
    svc = fd.services_by_name["ExternalScaler"]
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in svc.methods}
    assert methods["IsActive"] == ("ScaledObjectRef", "IsActiveResponse")
    assert methods["StreamIsActive"] == ("ScaledObjectRef", "IsActiveResponse")
    assert methods["GetMetricSpec"] == ("ScaledObjectRef", "GetMetricSpecResponse")
    assert methods["GetMetrics"] == ("GetMetricsRequest", "GetMetricsResponse")
    f = _fields
    assert [(k, v[0]) for k, v in f(externalscaler_pb2.ScaledObjectRef).items()] == [
        ("name", 1),
        ("namespace", 2),
        ("scalerMetadata", 3),
    ]
    assert f(externalscaler_pb2.IsActiveResponse)["result"][0] == 1
    assert f(externalscaler_pb2.GetMetricSpecResponse)["metricSpecs"][0] == 1
    assert {k: v[0] for k, v in f(externalscaler_pb2.MetricSpec).items()} == {
        "metricName": 1,
        "targetSize": 2,
        "targetSizeFloat": 3,
    }
    assert {k: v[0] for k, v in f(externalscaler_pb2.GetMetricsRequest).items()} == {
        "scaledObjectRef": 1,
        "metricName": 2,
    }
    assert f(externalscaler_pb2.GetMetricsResponse)["metricValues"][0] == 1
    assert {k: v[0] for k, v in f(externalscaler_pb2.MetricValue).items()} == {
        "metricName": 1,
        "metricValue": 2,
        "metricValueFloat": 3,
    }


def test_governor_services_exist() -> None:
    fd = governor_v1_pb2.DESCRIPTOR
    assert fd.package == "governor.v1"
    batching = {m.name for m in fd.services_by_name["BatchingService"].methods}
    assert batching == {"GetBatchingConfig", "WatchBatchingConfig", "GetLatencyDistribution"}
    admin = {m.name for m in fd.services_by_name["AdminService"].methods}
    assert {"SetTarget", "GetTarget", "ListTargets", "DeleteTarget", "GetStatus"} <= admin
    assert {"Explain", "PauseActuation", "ResumeActuation"} <= admin


def test_target_messages_mirror_the_config_keys() -> None:
    """ModelTarget field names are ModelConfig keys, so conversion is mechanical."""
    from controller.config import SLA, KnobBounds, ModelConfig, ReplicaBounds
    from controller.rules import Condition, RuleAction, ScaleOutRule

    pairs = [
        (governor_v1_pb2.ModelTarget, ModelConfig),
        (governor_v1_pb2.Sla, SLA),
        (governor_v1_pb2.ReplicaBounds, ReplicaBounds),
        (governor_v1_pb2.KnobBounds, KnobBounds),
        (governor_v1_pb2.ScaleOutRule, ScaleOutRule),
        (governor_v1_pb2.RuleCondition, Condition),
        (governor_v1_pb2.RuleAction, RuleAction),
    ]
    for message, model in pairs:
        assert set(_fields(message)) == set(model.model_fields), message.DESCRIPTOR.name


def test_proto_is_not_an_importable_package() -> None:
    assert not (ROOT / "proto" / "__init__.py").exists()
    assert not any(re.search(r"_pb2", p.name) for p in (ROOT / "proto").rglob("*.py"))
