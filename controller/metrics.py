"""The controller's own Prometheus metrics (prometheus-client), on an injectable registry.

Names are prefixed `governor_`. Per-model series carry the `model` label.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller.types import Decision


class GovernorMetrics:
    """All metrics of one controller instance. Tests pass a fresh registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.desired_replicas = Gauge(
            "governor_desired_replicas",
            "Replicas the last valid decision asked for",
            ["model"],
            registry=r,
        )
        self.max_num_seqs = Gauge(
            "governor_knob_max_num_seqs", "Published max_num_seqs", ["model"], registry=r
        )
        self.max_num_batched_tokens = Gauge(
            "governor_knob_max_num_batched_tokens",
            "Published max_num_batched_tokens",
            ["model"],
            registry=r,
        )
        self.demand = Gauge(
            "governor_demand_rps", "Demand used by the last decision, req/s", ["model"], registry=r
        )
        self.capacity = Gauge(
            "governor_capacity_per_replica_rps",
            "Per-replica capacity at the SLA, req/s",
            ["model"],
            registry=r,
        )
        self.staleness = Gauge(
            "governor_observation_staleness_seconds",
            "Age of the newest sample behind the observation",
            ["model"],
            registry=r,
        )
        self.stale = Gauge(
            "governor_model_stale",
            "1 while the model has no usable data (decisions held)",
            ["model"],
            registry=r,
        )
        self.panic = Gauge(
            "governor_panic", "1 while the model is in panic mode", ["model"], registry=r
        )
        self.reasons = Counter(
            "governor_stage_reasons",
            "Reason codes returned by each stage",
            ["model", "stage", "reason"],
            registry=r,
        )
        self.source_errors = Counter(
            "governor_source_errors", "Metric source failures by kind", ["kind"], registry=r
        )
        self.actuation_errors = Counter(
            "governor_actuation_errors", "Actuator failures", ["actuator"], registry=r
        )
        self.tick_duration = Histogram(
            "governor_tick_duration_seconds",
            "Wall time of one control tick (observe + decide + actuate)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.last_tick = Gauge(
            "governor_last_tick_timestamp_seconds",
            "Unix time of the last completed tick",
            registry=r,
        )
        self.ticks = Counter("governor_ticks", "Control ticks run", registry=r)

    def record(self, d: Decision, staleness_s: float | None) -> None:
        """Update the per-model series from one decision."""
        m = d.model
        for s in d.stages:
            self.reasons.labels(m, s.name, s.reason.value).inc()
        self.stale.labels(m).set(0 if d.valid and d.demand_rps is not None else 1)
        if staleness_s is not None:
            self.staleness.labels(m).set(staleness_s)
        if not d.valid:
            return
        self.desired_replicas.labels(m).set(d.replicas)
        self.max_num_seqs.labels(m).set(d.knobs.max_num_seqs)
        self.max_num_batched_tokens.labels(m).set(d.knobs.max_num_batched_tokens)
        self.panic.labels(m).set(1 if d.panic else 0)
        if d.demand_rps is not None:
            self.demand.labels(m).set(d.demand_rps)
        if d.capacity_rps_per_replica is not None:
            self.capacity.labels(m).set(d.capacity_rps_per_replica)

    def forget(self, model: str) -> None:
        """Drop a removed model's per-model gauge series."""
        for g in (
            self.desired_replicas,
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.demand,
            self.capacity,
            self.staleness,
            self.stale,
            self.panic,
        ):
            with contextlib.suppress(KeyError):
                g.remove(model)
