"""The controller's own Prometheus metrics (prometheus-client), on an injectable registry.

Names are prefixed `governor_`. Per-model series carry the `model` label.

`record` runs once per model per tick (6 stage reasons, the knob step's reason and 12
gauges per model), so the per-model series are not prometheus-client children:
`Gauge.labels`/`set` and `Counter.inc` each take a lock and check the metric on every
call. `record` keeps each model's gauge values and reason counts in plain lists and
dicts, and a collector of its own (`_PerModelCollector`) exports them when the registry
is scraped, as the children did: the same names, help, types, labels and values (a
gauge never set reads 0 once its model has a series; a reason counter has its `_created`
time). Measured at 1,000 models (the decisions of bench_tick's ticks, load average 0.9),
before the knob step's reason was counted: `record` 15.5-16.3 ms per tick with the
children kept and gauges set only on change, 5.1-5.7 ms so. The values are
written only by the ticking thread; a scrape reads a snapshot taken in one C call.
`forget` drops a model's gauge series (its reason counters stay, as a Counter's children
did); a model that comes back starts its gauges afresh.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from controller.capacity import LIMITS
from controller.types import Decision

REASONS_NAME = "governor_stage_reasons"
REASONS_HELP = 'Reason codes returned by each stage (stage="knobs": the knob step\'s)'
REASON_LABELS = ["model", "stage", "reason"]
KNOBS_STAGE = "knobs"
"""The `stage` label of the knob step's reason (Decision.knob_reason: KNOBS_SLO,
KNOBS_UNCHANGED, KNOBS_SLA_INFEASIBLE, ...), counted with the replica stages' so that an
alert or a dashboard reads both from one counter."""
LIMIT_NAME = "governor_capacity_limit"
LIMIT_HELP = (
    "1 for the SLA target that bounds the last valid decision's per-replica capacity "
    "(target ITL, TTFT or saturation), 0 for the others"
)
# Every target of controller.capacity.LIMITS has a series, so a change of target is a
# change of value, not a series that appears (a stale one would linger).


class _ModelSeries:
    """One model's gauge values in `MODEL_GAUGES` order (None: never set, not exported:
    a model whose decisions were all held has no desired-replicas series, not a 0) and
    its reason counters' cells, by (stage, reason)."""

    __slots__ = ("last", "limit", "reasons")

    def __init__(self) -> None:
        self.last: list[float | None] = [None] * len(MODEL_GAUGES)
        self.limit: str | None = None
        """The last valid decision's capacity limit (None: none yet, no series)."""
        self.reasons: dict[tuple[str, str], list[float]] = {}
        """(stage, reason) -> [count, created Unix s], the cell `GovernorMetrics` keeps."""


# The per-model gauges: (attribute, metric name, help). Each has the one label `model`.
MODEL_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("desired_replicas", "governor_desired_replicas", "Replicas the last valid decision asked for"),
    ("max_num_seqs", "governor_knob_max_num_seqs", "Published max_num_seqs"),
    (
        "max_num_batched_tokens",
        "governor_knob_max_num_batched_tokens",
        "Published max_num_batched_tokens",
    ),
    ("demand", "governor_demand_rps", "Demand used by the last decision, req/s"),
    (
        "capacity",
        "governor_capacity_per_replica_rps",
        "Per-replica capacity at the SLA, req/s",
    ),
    (
        "plant_speed",
        "governor_plant_speed_factor",
        "Learned step time of the engines x the profile's (> 1: slower than profiled)",
    ),
    (
        "plant_seq_ratio",
        "governor_plant_seq_ratio",
        "Learned per-sequence step cost of the engines x the profile's, on top of the speed",
    ),
    (
        "plant_cold_start_s",
        "governor_plant_cold_start_seconds",
        "Time from asking for replicas to seeing them all ready the decider plans with "
        "(learned, else configured), s",
    ),
    (
        "plant_overhead_ms",
        "governor_plant_overhead_milliseconds",
        "Per-request time before the engine core (HTTP, rendering, tokenizing) the TTFT "
        "bound prices (learned, else the profile's), ms",
    ),
    (
        "capacity_correction",
        "governor_capacity_correction",
        "Feedback factor on per-replica capacity from the observed SLA"
        " (0.4 to min(2, 1/target utilization))",
    ),
    (
        "knob_correction",
        "governor_knob_correction",
        "Feedback factor on the ITL step budget the slo knobs are sized for, from tokens "
        "streaming too slowly at the sequence cap (0.25-1)",
    ),
    (
        "prefix_hit_frac",
        "governor_prefix_cache_hit_priced_ratio",
        "Share of prompt tokens the capacity model prices as prefix-cache hits, not "
        "prefilled (0-0.95; believed from the engines' prefix-cache counters)",
    ),
    (
        "staleness",
        "governor_observation_staleness_seconds",
        "Age of the newest sample behind the observation",
    ),
    ("stale", "governor_model_stale", "1 while the model has no usable data (decisions held)"),
    ("panic", "governor_panic", "1 while the model is in panic mode"),
    (
        "paused",
        "governor_model_paused",
        "1 while the model is paused (shadow mode: decisions are made, not actuated); "
        "the actuation-gap alert leaves such models out",
    ),
)

_STALENESS, _STALE, _PANIC, _PAUSED = (
    [a for a, _n, _h in MODEL_GAUGES].index(a) for a in ("staleness", "stale", "panic", "paused")
)
"""Indexes in `MODEL_GAUGES` of the gauges `record` sets on every decision, valid or not
(the first eleven follow the last valid decision)."""


class _PerModelCollector:
    """Exports `GovernorMetrics`' per-model gauges and reason counters (module doc)."""

    def __init__(self, metrics: GovernorMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        """The families' names (the registry checks them against the others')."""
        gauges: list[Metric] = [
            GaugeMetricFamily(n, h, labels=["model"]) for _a, n, h in MODEL_GAUGES
        ]
        return [
            *gauges,
            GaugeMetricFamily(LIMIT_NAME, LIMIT_HELP, labels=["model", "target"]),
            CounterMetricFamily(REASONS_NAME, REASONS_HELP, labels=REASON_LABELS),
        ]

    def collect(self) -> Iterator[Metric]:
        """The per-model families, from a snapshot of the values (one C call each)."""
        series = list(self.metrics._series.items())
        for i, (_attr, name, doc) in enumerate(MODEL_GAUGES):
            family = GaugeMetricFamily(name, doc, labels=["model"])
            for model, s in series:
                v = s.last[i]
                if v is not None:  # never set: no series, not a 0 read as a value
                    family.add_metric([model], float(v))
            yield family
        limits = GaugeMetricFamily(LIMIT_NAME, LIMIT_HELP, labels=["model", "target"])
        for model, s in series:
            if s.limit is not None:
                for target in LIMITS:
                    limits.add_metric([model, target], 1.0 if target == s.limit else 0.0)
        yield limits
        reasons = CounterMetricFamily(REASONS_NAME, REASONS_HELP, labels=REASON_LABELS)
        for (model, stage, reason), (count, created) in list(self.metrics._reasons.items()):
            reasons.add_metric([model, stage, reason], count, created=created)
        yield reasons


class GovernorMetrics:
    """All metrics of one controller instance. Tests pass a fresh registry.

    The per-model gauges (`MODEL_GAUGES`) and the stage reason counters are exported by
    `_PerModelCollector` from the values `record` keeps; the rest are built in
    `_fleet_metrics`.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._series: dict[str, _ModelSeries] = {}
        self._reasons: dict[tuple[str, str, str], list[float]] = {}
        """(model, stage, reason) -> [count, created Unix s]; kept by `forget`."""
        self.registry.register(_PerModelCollector(self))  # type: ignore[arg-type]
        self._fleet_metrics(self.registry)

    def _fleet_metrics(self, r: CollectorRegistry) -> None:
        """The metrics that are not per-model gauges: reasons, errors, tick timing."""
        self.source_errors = Counter(
            "governor_source_errors", "Metric source failures by kind", ["kind"], registry=r
        )
        self.actuation_errors = Counter(
            "governor_actuation_errors",
            "Actuator failures: `exception` when an actuator raised, else the actuator's "
            "own reason (e.g. Kubernetes: hpa_conflict, not_found, forbidden, conflict, "
            "retries_exhausted, rejected, malformed_answer)",
            ["actuator", "reason"],
            registry=r,
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

    def record(self, d: Decision, staleness_s: float | None, paused: bool = False) -> None:
        """Update the per-model series from one decision (`paused`: not actuated)."""
        m = d.model
        series = self._series.get(m)
        if series is None:
            series = self._series[m] = _ModelSeries()
        reasons = series.reasons
        # `_value_`, not the member: hashing a StrEnum member is a Python-level call.
        keys = [(s.name, s.reason._value_) for s in d.stages]
        keys.append((KNOBS_STAGE, d.knob_reason._value_))
        for key in keys:
            cell = reasons.get(key)
            if cell is None:
                cell = reasons[key] = self._reasons.setdefault((m, *key), [0.0, time.time()])
            cell[0] += 1.0
        last = series.last
        if staleness_s is not None:
            last[_STALENESS] = staleness_s
        last[_STALE] = 0 if d.valid and d.demand_rps is not None else 1
        last[_PAUSED] = 1 if paused else 0
        if not d.valid:  # the last valid decision's values stay
            return
        knobs = d.knobs
        values = (  # MODEL_GAUGES order up to `prefix_hit_frac`; None: leave it
            d.replicas,
            knobs.max_num_seqs,
            knobs.max_num_batched_tokens,
            d.demand_rps,
            d.capacity_rps_per_replica,
            d.plant_speed,
            d.plant_seq_ratio,
            d.plant_cold_start_s,
            d.plant_overhead_ms,
            d.capacity_correction,
            d.knob_correction,
            d.prefix_hit_frac,
        )
        for i, v in enumerate(values):
            if v is not None:
                last[i] = v
        if d.capacity_limit is not None:
            series.limit = d.capacity_limit
        last[_PANIC] = 1 if d.panic else 0

    def forget(self, model: str) -> None:
        """Drop a removed model's per-model gauge series (its reason counters stay)."""
        self._series.pop(model, None)
