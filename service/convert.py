"""Protobuf views of the service's data: targets, observations, decisions.

Field names are the config keys; `None` fields of a config are left unset.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import json_format

from actuators.engines import quantiles_to_pb
from actuators.publisher import latency_quantiles
from controller.config import ModelConfig
from controller.types import DECISION_NUMBERS, Decision
from estimators.types import NoDataError, Observation, SourceError
from governor_api import governor_v1_pb2

pb = governor_v1_pb2


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_strip_none(v) for v in value]
    return value


def target_to_pb(model: ModelConfig) -> governor_v1_pb2.ModelTarget:
    """A ModelConfig as the API's ModelTarget (field names are the config keys).

    `None` fields are left unset, except inside `policy`: a Struct carries null, and a
    per-model override to null is a value (e.g. `falling_release_after_s: null`, never
    release), which a read-modify-write (`governor target set`) must keep."""
    data = model.model_dump(mode="json")
    policy = data.pop("policy")
    data = _strip_none(data)
    if policy:
        data["policy"] = policy
    return json_format.ParseDict(data, pb.ModelTarget())


def target_from_pb(target: governor_v1_pb2.ModelTarget) -> dict[str, Any]:
    """The set fields of a ModelTarget as a config mapping (unset -> config default)."""
    return json_format.MessageToDict(target, preserving_proto_field_name=True)


def message_to_json(message: Any) -> str:
    """Every JSON view of an API message (`governor ... -o json`): field names as in the
    .proto, and fields without presence shown at their zero value, so an idle model's
    `arrival_rate_rps: 0` reads as zero, not as a missing field. Fields with presence
    (`optional`) appear only when set: absent still means "no data"."""
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=2,
    )


def observation_to_pb(
    obs: Observation | NoDataError | SourceError | None,
) -> governor_v1_pb2.ObservationStatus:
    """Status view of an observation. Latency quantiles as `latency_quantiles` reads
    them: the source's distributions, else the point fields and `extra` keys."""
    if obs is None:
        return pb.ObservationStatus(present=False, no_data="no tick yet")
    if not isinstance(obs, Observation):
        return pb.ObservationStatus(present=False, no_data=str(obs))
    out = pb.ObservationStatus(
        present=True,
        observed_at_s=obs.observed_at_s,
        staleness_s=obs.staleness_s,
        arrival_rate_rps=obs.arrival_rate_rps,
        ttft=quantiles_to_pb(latency_quantiles(obs, "ttft")),
        itl=quantiles_to_pb(latency_quantiles(obs, "itl")),
        e2e=quantiles_to_pb(latency_quantiles(obs, "e2e")),
        queue_time=quantiles_to_pb(latency_quantiles(obs, "queue_time")),
    )
    for name in (
        "arrival_rate_short_rps",
        "prompt_tokens_p95",
        "output_tokens_p95",
        "running",
        "waiting",
        "kv_usage_frac",
        "ttft_attainment_frac",
        "itl_attainment_frac",
    ):
        v = getattr(obs, name)
        if v is not None and math.isfinite(v):
            setattr(out, name, float(v))
    if obs.ready_replicas is not None:
        out.ready_replicas = int(obs.ready_replicas)
    return out


def decision_to_pb(d: Decision) -> governor_v1_pb2.DecisionSummary:
    out = pb.DecisionSummary(
        valid=d.valid,
        replicas=d.replicas,
        max_num_seqs=d.knobs.max_num_seqs,
        max_num_batched_tokens=d.knobs.max_num_batched_tokens,
        knob_reason=d.knob_reason.value,
        stage_reasons=[f"{s.name}:{s.reason.value}" for s in d.stages],
        at_s=d.at_s,
        panic=d.panic,
        detail=d.detail,
        capacity_limit=d.capacity_limit or "",
    )
    for name in DECISION_NUMBERS:
        v = getattr(d, name)
        if v is not None and math.isfinite(v):
            setattr(out, name, float(v))
    return out


def trace_to_pb(d: Decision) -> governor_v1_pb2.DecisionTrace:
    return pb.DecisionTrace(
        summary=decision_to_pb(d),
        stages=[
            pb.StageTrace(
                name=s.name, before=s.before, after=s.after, reason=s.reason.value, detail=s.detail
            )
            for s in d.stages
        ],
        text=d.explain(),
    )
