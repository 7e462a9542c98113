"""Typed observations and the `MetricSource` protocol.

An `Observation` is what one model's serving fleet looked like over the query window,
as seen by a metric source at `observed_at_s`. Every optional field is `None` when the
source had no data for it: missing data is never represented as 0. A model whose
demand signal (arrival rate) is missing gets a `NoDataError` instead of an Observation;
a source that cannot be read at all (HTTP error, timeout, garbage) raises `SourceError`.

Units are in the field names: `_s` seconds, `_ms` milliseconds, `_rps` requests per
second, `_tokens` tokens, `_frac` a fraction in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable


class NoDataError(Exception):
    """A model had no usable data for a required signal (empty vector, NaN, +/-Inf).

    Carries the model and the signal so logs and status can say exactly what is missing.
    """

    def __init__(self, model: str, signal: str, detail: str = "") -> None:
        self.model = model
        self.signal = signal
        self.detail = detail
        msg = f"no data for model {model!r}: signal {signal!r}"
        super().__init__(f"{msg} ({detail})" if detail else msg)


class SourceError(Exception):
    """The metric source could not be read (HTTP error, timeout, malformed answer)."""

    def __init__(self, message: str, *, query: str | None = None) -> None:
        self.query = query
        super().__init__(f"{message} [query: {query}]" if query else message)


@dataclass(frozen=True, slots=True)
class ModelQuery:
    """What a source needs to know about one model to observe it.

    `ttft_sla_s` / `itl_sla_s` are the SLA thresholds in seconds; where one sits on a
    histogram bucket edge the source also reports the exact attainment from buckets.
    `namespace`: the Kubernetes namespace its engines run in.
    """

    name: str
    ttft_sla_s: float | None = None
    itl_sla_s: float | None = None
    namespace: str | None = None
    """The namespace its engines run in: series of the model's name in another namespace
    are not its own (estimators.promql, "Namespaces"); None: any namespace is."""


@dataclass(frozen=True, slots=True)
class LatencyQuantiles:
    """A latency distribution, milliseconds; a quantile is None when it has no data."""

    p50_ms: float | None = None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """One model's signals over the query window. `None` means "no data", never zero."""

    model: str
    observed_at_s: float
    """Source time of the evaluation (seconds, the source's clock)."""
    arrival_rate_rps: float
    """Requests arriving per second over the query window (required: the demand signal)."""
    arrival_rate_short_rps: float | None = None
    """Requests arriving per second over the short (panic) window, when known."""
    staleness_s: float = 0.0
    """Age of the newest sample behind this observation, seconds. A source returns
    `NoDataError(model, "staleness")` instead of an Observation when it has no current
    sample at all or this age exceeds its limit (`PrometheusSource(max_staleness_s=)`,
    `policy.max_staleness_s` in `governor run`): rates over a window keep decaying after
    the last scrape, so old data is never passed on as a low demand."""
    prompt_tokens_mean: float | None = None
    prompt_tokens_p95: float | None = None
    output_tokens_mean: float | None = None
    output_tokens_p95: float | None = None
    itl_p95_ms: float | None = None
    ttft_p95_ms: float | None = None
    e2e_p99_ms: float | None = None
    queue_time_p95_ms: float | None = None
    ttft_attainment_frac: float | None = None
    """Fraction of requests with TTFT <= SLA, exact from buckets (SLA on a bucket edge)."""
    itl_attainment_frac: float | None = None
    """Fraction of inter-token gaps <= SLA, exact from buckets (SLA on a bucket edge)."""
    running: float | None = None
    """Requests running, summed over the engines reporting (None: no engine reports)."""
    waiting: float | None = None
    """Requests waiting, summed over the engines reporting (None: no engine reports)."""
    kv_usage_frac: float | None = None
    prefix_cache_hit_frac: float | None = None
    preemption_rate_per_s: float | None = None
    gpu_busy_frac: float | None = None
    ready_replicas: int | None = None
    # --- signals added for the seed policy, latency distributions and online calibration.
    # Every one is None when the source has no data for it (never 0).
    arrival_rate_5m_rps: float | None = None
    """Requests arriving per second over a 5-minute window (the seed policy's window)."""
    decode_time_p95_ms: float | None = None
    """p95 of per-request decode time (`vllm:request_decode_time_seconds`), ms."""
    decode_time_mean_ms: float | None = None
    """Mean per-request decode time (histogram sum / count), ms."""
    prefill_time_mean_ms: float | None = None
    """Mean per-request prefill time (`vllm:request_prefill_time_seconds`), ms."""
    queue_time_mean_ms: float | None = None
    """Mean per-request queue time (`vllm:request_queue_time_seconds`: queued in the
    engine core to first scheduled), ms."""
    e2e_mean_ms: float | None = None
    """Mean end-to-end latency (`vllm:e2e_request_latency_seconds`: arrival at the
    frontend to the last token), ms."""
    tpot_p95_ms: float | None = None
    """p95 of per-request time per output token (`vllm:request_time_per_output_token_seconds`)."""
    tpot_attainment_frac: float | None = None
    """Fraction of requests whose TPOT <= the ITL SLA, exact from buckets."""
    itl_mean_ms: float | None = None
    """Mean inter-token latency over the window (histogram sum / count), ms."""
    ttft_mean_ms: float | None = None
    """Mean time to first token over the window (histogram sum / count), ms."""
    step_tokens_mean: float | None = None
    """Mean tokens scheduled per engine step (`vllm:iteration_tokens_total`)."""
    ttft_dist: LatencyQuantiles | None = None
    """p50/p90/p95/p99 of TTFT over the window (None: no quantile had data)."""
    itl_dist: LatencyQuantiles | None = None
    """p50/p90/p95/p99 of the inter-token latency over the window."""
    e2e_dist: LatencyQuantiles | None = None
    """p50/p90/p95/p99 of the end-to-end request latency over the window."""
    targets_up: int | None = None
    """Engine scrape targets of this model with `up == 1` (None: unknown to the source).
    0 in an Observation from `PrometheusSource` only when it has an ingress rate and no
    engine up (a fleet scaled to zero, or a dead one: the decider tells them apart by
    the replicas it asked for); without an ingress rate, every target down or gone is
    `NoDataError(model, "targets_up")` (a dead fleet is not an idle fleet)."""
    targets_down: int | None = None
    """Engine scrape targets of this model that are down (`up == 0`) while still in
    service discovery. A target that left discovery (a deleted pod, a scale-in) is not
    counted; when every target of the model is down or gone the source returns
    `NoDataError(model, "targets_up")` instead. While this is > 0 the rates and gauges
    cover only the live engines (`running`/`waiting` of a dead engine are absent, not 0):
    a decider must not read the lower demand as a reason to scale down."""
    ingress_rate_rps: float | None = None
    """Requests per second at the gateway, router or ingress in front of the engines
    (`prometheus.ingress_rate_query`; None: not configured or no series for this model).
    `arrival_rate_rps` is at least this: it sees requests no engine has yet."""
    extra: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Guard the invariant at construction: a non-finite required value is a bug upstream.
        if not math.isfinite(self.arrival_rate_rps) or self.arrival_rate_rps < 0:
            raise ValueError(
                f"arrival_rate_rps must be finite and >= 0, got {self.arrival_rate_rps}"
            )
        # An optional number that is NaN, infinite or negative is missing data: it is set
        # to None here, once, so no reader (the decider, status, logs) ever sees it as a
        # number and none has to clean it again. Example: waiting=NaN -> None (no backlog
        # known), running=-1 -> None, ready_replicas=-3 -> None. Booleans and values that
        # are not numbers are left alone. Cost: ~1 us per Observation (a plain loop; a
        # float takes one chained comparison, `0 <= NaN` being False).
        for name in OPTIONAL_NUMBERS:
            v = getattr(self, name)
            if v is None:
                continue
            if v.__class__ is float:
                if 0.0 <= v < _INF:
                    continue
            elif isinstance(v, bool) or not isinstance(v, int | float) or 0 <= v < _INF:
                continue
            object.__setattr__(self, name, None)
        # A share past 1 or a length under one token is no reading either: a prefix-hit
        # share of 3 (hits over queries of another window) priced every prompt at the
        # cap of hits and sized 6 replicas where 16 serve; a prompt mean of 0 (a sum
        # rate of 0 beside a count rate) read 88 req/s a replica. Past 1 by float noise
        # (1 + 1e-6 at most) reads 1.
        for name in FRACTIONS:
            v = getattr(self, name)
            if v is not None and v > 1.0:
                object.__setattr__(self, name, 1.0 if v <= 1.0 + FRACTION_NOISE else None)
        for name in TOKEN_LENGTHS:
            v = getattr(self, name)
            if v is not None and v < 1.0:
                object.__setattr__(self, name, None)


_INF = math.inf
OPTIONAL_NUMBERS: tuple[str, ...] = tuple(
    f.name for f in fields(Observation) if f.type in ("float | None", "int | None")
)
"""The optional numeric fields of `Observation` that construction cleans (NaN, +-Inf and
negative values become None); `arrival_rate_rps` is required and validated instead,
`observed_at_s` and `staleness_s` are times the source sets."""
FRACTIONS: tuple[str, ...] = tuple(n for n in OPTIONAL_NUMBERS if n.endswith("_frac"))
"""The shares among them (0-1): past 1 + FRACTION_NOISE, construction sets them to None."""
FRACTION_NOISE = 1e-6
"""How far past 1 a share may read by float noise in its rates (then it reads 1)."""
TOKEN_LENGTHS = (
    "prompt_tokens_mean",
    "prompt_tokens_p95",
    "output_tokens_mean",
    "output_tokens_p95",
)
"""Request lengths (tokens): a request has at least one of each, so under 1 is None."""


ObservationResult = Observation | NoDataError
"""Per-model outcome of one observation pass."""


def sees_demand_at_zero(source: object) -> bool:
    """Whether `source` still reports a model's demand when it has no engine at all (its
    `sees_demand_at_zero` attribute; True for a source without one). False for
    `PrometheusSource` without an ingress rate: every signal it reads comes from the
    engines, so a model scaled to zero would read as no data for good."""
    return bool(getattr(source, "sees_demand_at_zero", True))


@runtime_checkable
class MetricSource(Protocol):
    """Reads every model's signals in one pass.

    The number of backend queries per call must not grow with the number of models.
    Raises `SourceError` when the backend cannot be read at all; returns a `NoDataError`
    for each model whose demand signal is missing. A source that cannot see the demand
    of a model without engines says so with `sees_demand_at_zero = False`.
    """

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        """Observe `models` as of `now_s` (seconds, the caller's clock)."""
        ...


def finite_or_none(value: float | None) -> float | None:
    """Return `value` when it is a finite float, else None (NaN/Inf are not data)."""
    if value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def latency_quantiles(obs: Observation, signal: str) -> LatencyQuantiles:
    """p50/p90/p95/p99 of `signal` (ttft, itl, e2e or queue_time) in `obs`, ms.

    The source's distribution (`<signal>_dist`) first; a quantile it lacks falls back to
    the Observation's point field (`<signal>_p95_ms`, `e2e_p99_ms`), then to
    `extra["<signal>_<q>_ms"]`. Non-finite values are dropped (None = no data)."""
    dist = getattr(obs, f"{signal}_dist", None)
    if dist is not None and dist.__class__ is LatencyQuantiles:
        a, b, c, d = dist.p50_ms, dist.p90_ms, dist.p95_ms, dist.p99_ms
        if (
            a.__class__ is float
            and b.__class__ is float
            and c.__class__ is float
            and d.__class__ is float
            and a - a == 0.0  # finite (NaN and +-Inf give NaN)
            and b - b == 0.0
            and c - c == 0.0
            and d - d == 0.0
        ):
            return dist  # every quantile known and finite: nothing to fall back to or clean
    extra = obs.extra or {}
    values: dict[str, float | None] = {}
    for q in ("p50", "p90", "p95", "p99"):
        v = getattr(dist, f"{q}_ms", None) if dist is not None else None
        if v is None:
            v = getattr(obs, f"{signal}_{q}_ms", None)
        if v is None:
            v = extra.get(f"{signal}_{q}_ms")
        values[f"{q}_ms"] = finite_or_none(v)
    return LatencyQuantiles(**values)
