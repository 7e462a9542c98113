"""Admin calls that fail answer a status naming the problem, never an opaque UNKNOWN, and
change nothing: a store that cannot write, NaN in the policy Struct, a delete racing an
outside edit of the stored targets, any other failure, and a mutation carrying a field
this server does not know. Real gRPC on loopback, a file store; ticks driven by the
test on a fake clock (no sleeps)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.admin import unknown_field
from service.core import ServiceCore
from service.store import FileStore, StoreError
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread


@dataclass
class Served:
    core: ServiceCore
    admin: pb_grpc.AdminServiceStub
    path: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    path = tmp_path / "state.json"
    core = ServiceCore(
        make_config(model_entry("a"), model_entry("b")),
        FakeSource({"a": 5.0, "b": 5.0}),
        FileStore(path),
        clock=FakeClock(),
        logger=quiet_logger(),
    )
    with (
        ServerThread(core, logger=quiet_logger()) as server,
        grpc.insecure_channel(server.address) as channel,
    ):
        yield Served(core, pb_grpc.AdminServiceStub(channel), path)


def _refused(call: object, request: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as ei:
        call(request, timeout=10)  # type: ignore[operator]
    return ei.value


def _new_target(name: str = "c") -> pb.ModelTarget:
    return pb.ModelTarget(name=name, deployment=name, sla=pb.Sla(ttft_p95_ms=500, itl_p95_ms=50))


def _disk_full(*args: object, **kw: object) -> None:
    raise OSError(28, "No space left on device")


def test_a_store_that_cannot_write_answers_unavailable_and_changes_nothing(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = served.path.read_bytes()
    monkeypatch.setattr("service.store.os.replace", _disk_full)
    err = _refused(served.admin.SetTarget, pb.SetTargetRequest(target=_new_target()))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "No space left on device" in err.details()
    err = _refused(served.admin.PauseActuation, pb.PauseRequest(model="a"))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert served.path.read_bytes() == before
    assert [m.name for m in served.core.config.models] == ["a", "b"]
    assert served.core.loop.paused() == set()


def test_a_state_save_that_cannot_write_is_counted_and_the_tick_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    store = FileStore(tmp_path / "state.json")
    core = ServiceCore(
        make_config(), FakeSource({"demo": 5.0}), store, clock=clock, logger=quiet_logger()
    )
    core.seed_targets()  # the start-up's write, with room on the disk
    monkeypatch.setattr("service.store.os.replace", _disk_full)
    with pytest.raises(StoreError, match=r"state\.json: cannot write: No space left on device"):
        store.save_targets(core.targets, None)
    core.tick(clock.advance(5))
    assert core.counters.state_save_failures == 1
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_policy_number_is_invalid_argument_naming_policy(
    served: Served, bad: float
) -> None:
    target = _new_target()
    target.policy.update({"tick_interval_s": bad})
    err = _refused(served.admin.SetTarget, pb.SetTargetRequest(target=target))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("target.policy: numbers must be finite")
    assert [m.name for m in served.core.config.models] == ["a", "b"]


def test_delete_racing_an_outside_edit_is_failed_precondition(served: Served) -> None:
    """Another writer (an operator editing the file, kubectl the ConfigMap) removed b
    before this instance read the change; deleting a would leave no model."""
    before = served.path.read_text()
    data = json.loads(before)
    data["targets"]["models"] = [m for m in data["targets"]["models"] if m["name"] == "a"]
    data["targets"]["revision"] += 1
    served.path.write_text(json.dumps(data))
    edited = served.path.read_text()
    err = _refused(served.admin.DeleteTarget, pb.DeleteTargetRequest(model="a"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "model 'a' is the last one in the stored targets" in err.details()
    assert served.path.read_text() == edited
    assert [m.name for m in served.core.config.models] == ["a", "b"]


def test_any_other_failure_is_internal_naming_the_exception(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explain(name: str, last: int = 0) -> tuple[()]:
        raise KeyError("lost")

    monkeypatch.setattr(served.core, "explain", explain)
    err = _refused(served.admin.Explain, pb.ExplainRequest(model="a"))
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "KeyError" in err.details()


# ---------------------------------------------------------------------- unknown fields
def _with_unknown(msg: Message, number: int) -> None:
    """Add field `number` (a varint, 7) that the proto does not define to `msg`, as a
    newer client's request would carry it."""
    msg.MergeFromString(bytes([number << 3 | 0, 7]))


def test_unknown_field_is_found_at_any_depth() -> None:
    req = pb.SetTargetRequest(target=_new_target())
    req.target.policy.update({"window_s": 30})
    req.target.scale_out_rules.add(name="r").conditions.add(signal="waiting")
    assert unknown_field(req, "SetTargetRequest") is None
    _with_unknown(req.target.scale_out_rules[0].conditions[0], 9)
    assert unknown_field(req, "SetTargetRequest") == (
        "SetTargetRequest.target.scale_out_rules[0].conditions[0] (governor.v1.RuleCondition): "
        "unknown field number 9"
    )
    req.target.scale_out_rules[0].conditions[0].DiscardUnknownFields()
    _with_unknown(req.target.policy.fields["window_s"], 12)
    assert unknown_field(req, "SetTargetRequest") == (
        "SetTargetRequest.target.policy.fields['window_s'] (google.protobuf.Value): "
        "unknown field number 12"
    )


def test_set_target_with_an_unknown_field_is_refused_naming_it(served: Served) -> None:
    before = served.path.read_bytes()
    for place, number, text in (
        ("sla", 9, "SetTargetRequest.target.sla (governor.v1.Sla): unknown field number 9"),
        (
            "target",
            13,
            "SetTargetRequest.target (governor.v1.ModelTarget): unknown field number 13",
        ),
    ):
        req = pb.SetTargetRequest(target=_new_target())
        _with_unknown(req.target.sla if place == "sla" else req.target, number)
        err = _refused(served.admin.SetTarget, req)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith(text)
    assert served.path.read_bytes() == before
    assert [m.name for m in served.core.config.models] == ["a", "b"]


def test_every_mutation_refuses_an_unknown_field(served: Served) -> None:
    before = served.path.read_bytes()
    calls = (
        (served.admin.DeleteTarget, pb.DeleteTargetRequest(model="b"), "DeleteTargetRequest"),
        (served.admin.PauseActuation, pb.PauseRequest(model="a"), "PauseRequest"),
        (served.admin.ResumeActuation, pb.PauseRequest(model="a"), "PauseRequest"),
    )
    for call, req, name in calls:
        _with_unknown(req, 15)
        err = _refused(call, req)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith(f"{name} (governor.v1.{name}): unknown field number 15")
    assert served.path.read_bytes() == before
    assert [m.name for m in served.core.config.models] == ["a", "b"]
    assert served.core.loop.paused() == set()
