"""GovernorMetrics.record: per-model gauges follow the decisions (set only on change,
which must not show), invalid decisions leave the last valid values, forget drops them."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import CollectorRegistry

from controller.metrics import MODEL_GAUGES, GovernorMetrics
from controller.types import Decision, Knobs, Reason, Stage

GOOD = Decision(
    model="m",
    at_s=0.0,
    valid=True,
    replicas=3,
    knobs=Knobs(64, 4096),
    stages=(Stage("raw", 2, 3, Reason.CAPACITY),),
    knob_reason=Reason.KNOBS_UNCHANGED,
    demand_rps=12.5,
    capacity_rps_per_replica=5.0,
    plant_speed=1.1,
    plant_seq_ratio=2.0,
    plant_cold_start_s=75.0,
    plant_overhead_ms=140.0,
    capacity_correction=0.9,
    knob_correction=0.8,
    prefix_hit_frac=0.55,
)


def _values(m: GovernorMetrics, model: str = "m") -> dict[str, float | None]:
    return {
        name: m.registry.get_sample_value(name, {"model": model}) for _a, name, _h in MODEL_GAUGES
    }


def test_gauges_follow_each_decision() -> None:
    m = GovernorMetrics(CollectorRegistry())
    m.record(GOOD, 1.5)
    assert _values(m) == {
        "governor_desired_replicas": 3,
        "governor_knob_max_num_seqs": 64,
        "governor_knob_max_num_batched_tokens": 4096,
        "governor_demand_rps": 12.5,
        "governor_capacity_per_replica_rps": 5.0,
        "governor_plant_speed_factor": 1.1,
        "governor_plant_seq_ratio": 2.0,
        "governor_plant_cold_start_seconds": 75.0,
        "governor_plant_overhead_milliseconds": 140.0,
        "governor_capacity_correction": 0.9,
        "governor_knob_correction": 0.8,
        "governor_prefix_cache_hit_priced_ratio": 0.55,
        "governor_observation_staleness_seconds": 1.5,
        "governor_model_stale": 0,
        "governor_panic": 0,
        "governor_model_paused": 0,
    }
    m.record(GOOD, 1.5)  # unchanged: still the same values
    assert _values(m)["governor_desired_replicas"] == 3
    m.record(replace(GOOD, replicas=5, panic=True, knobs=Knobs(32, 2048)), 2.0, paused=True)
    v = _values(m)
    assert v["governor_desired_replicas"] == 5 and v["governor_panic"] == 1
    assert v["governor_knob_max_num_seqs"] == 32 and v["governor_model_paused"] == 1
    assert v["governor_observation_staleness_seconds"] == 2.0
    held = replace(GOOD, valid=False, replicas=99, demand_rps=None, panic=False)
    m.record(held, None)  # no valid decision: stale, the last valid values stay
    v = _values(m)
    assert v["governor_model_stale"] == 1 and v["governor_desired_replicas"] == 5
    assert v["governor_panic"] == 1 and v["governor_observation_staleness_seconds"] == 2.0
    m.record(replace(GOOD, replicas=5), 2.0)
    assert _values(m)["governor_model_stale"] == 0
    assert (
        m.registry.get_sample_value(
            "governor_stage_reasons_total", {"model": "m", "stage": "raw", "reason": "CAPACITY"}
        )
        == 5
    )


def test_the_knob_steps_reason_is_counted_as_the_stage_knobs() -> None:
    """Each decision's knob reason under stage="knobs" (what GovernorSLAOutOfReach reads
    KNOBS_SLA_INFEASIBLE from), one count per decision, held ones included."""
    m = GovernorMetrics(CollectorRegistry())
    m.record(GOOD, 1.0)
    m.record(replace(GOOD, knob_reason=Reason.KNOBS_SLA_INFEASIBLE), 1.0)
    m.record(replace(GOOD, knob_reason=Reason.KNOBS_SLA_INFEASIBLE), 1.0)
    m.record(replace(GOOD, valid=False, knob_reason=Reason.KNOBS_NO_DATA), None)

    def count(stage: str, reason: Reason) -> float | None:
        labels = {"model": "m", "stage": stage, "reason": reason.value}
        return m.registry.get_sample_value("governor_stage_reasons_total", labels)

    assert count("knobs", Reason.KNOBS_UNCHANGED) == 1
    assert count("knobs", Reason.KNOBS_SLA_INFEASIBLE) == 2
    assert count("knobs", Reason.KNOBS_NO_DATA) == 1
    assert count("raw", Reason.CAPACITY) == 4


def test_forget_drops_the_series_and_a_returning_model_is_set_again() -> None:
    m = GovernorMetrics(CollectorRegistry())
    m.record(GOOD, 1.0)
    m.forget("m")
    assert set(_values(m).values()) == {None}
    m.record(GOOD, 1.0)  # the same values as before it was forgotten: exported again
    assert _values(m)["governor_desired_replicas"] == 3
    assert _values(m)["governor_observation_staleness_seconds"] == 1.0


def test_exported_as_prometheus_client_children_were() -> None:
    """The collector's exposition: a gauge never set has no series (a model whose first
    decision was held exports no desired replicas, never a 0 a dashboard would read as
    "scaled to zero"), the reason counter has `_total` and `_created`, and the names
    are claimed in the registry (a second metric of the same name is refused)."""
    import time

    import pytest
    from prometheus_client import Gauge, generate_latest

    m = GovernorMetrics(CollectorRegistry())
    m.record(replace(GOOD, valid=False, demand_rps=None), None)  # first decision held
    v = _values(m)
    assert v["governor_desired_replicas"] is None and v["governor_model_stale"] == 1
    assert v["governor_capacity_per_replica_rps"] is None
    labels = {"model": "m", "stage": "raw", "reason": "CAPACITY"}
    created = m.registry.get_sample_value("governor_stage_reasons_created", labels)
    assert created is not None and abs(created - time.time()) < 60
    text = generate_latest(m.registry).decode()
    assert "# TYPE governor_stage_reasons_total counter" in text
    assert "# TYPE governor_desired_replicas gauge" in text
    with pytest.raises(ValueError, match="Duplicated"):
        Gauge("governor_desired_replicas", "again", ["model"], registry=m.registry)


def test_capacity_limit_marks_the_bounding_target() -> None:
    """One series per target: 1 for the last valid decision's limit, 0 for the others;
    a decision without one (idle) or an invalid one leaves it; no series before any."""
    m = GovernorMetrics(CollectorRegistry())

    def limits() -> dict[str, float | None]:
        return {
            t: m.registry.get_sample_value("governor_capacity_limit", {"model": "m", "target": t})
            for t in ("ITL", "TTFT", "saturation")
        }

    m.record(GOOD, 1.0)
    assert set(limits().values()) == {None}
    m.record(replace(GOOD, capacity_limit="ITL"), 1.0)
    assert limits() == {"ITL": 1.0, "TTFT": 0.0, "saturation": 0.0}
    m.record(replace(GOOD, capacity_limit="TTFT"), 1.0)
    assert limits() == {"ITL": 0.0, "TTFT": 1.0, "saturation": 0.0}
    m.record(replace(GOOD, capacity_limit=None, capacity_rps_per_replica=None), 1.0)
    m.record(replace(GOOD, valid=False, capacity_limit="ITL"), 1.0)
    assert limits()["TTFT"] == 1.0
    m.forget("m")
    assert set(limits().values()) == {None}
