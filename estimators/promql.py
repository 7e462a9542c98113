"""PromQL templates for the vLLM signals (ARCHITECTURE.md section 4).

This module owns the query text and nothing else: which metrics are read, how they are
aggregated and which alternative metric names are accepted. `PrometheusSource`
(estimators/prometheus.py) owns running the queries and interpreting the answers.

Every query covers ALL models at once, grouped `by (<model label>)`, so the number of
queries per tick is constant in the number of models: `build_queries` returns ten
(six histogram bucket rates, token means, demand, state gauges, counter rates).

Alternative names are joined with `or` *per series, before aggregation*: PromQL matches
`or` operands on all labels except the metric name, so each engine contributes its
current-name series when it has one and an alternative otherwise. A fleet halfway
through a vLLM upgrade is read correctly and the query count does not double. Worked
example: `sum by (model_name, le) (rate(vllm:inter_token_latency_seconds_bucket[60s])
or rate(vllm:time_per_output_token_seconds_bucket[60s]))`. The alternatives are the
deprecated names and, unless `accept_escaped=False`, the same names with `:` escaped to
`_` (`vllm_...`): prometheus_client 0.26 writes sample names that way in its OpenMetrics
exposition, which a Prometheus 2.x scrape negotiates by default.

Several scalar signals share one query: each part is tagged with the label
`SIGNAL_LABEL` (`label_replace(v, "governor_signal", "running", "", "")`) and the parts
are joined with `or`; the distinct tag keeps every part in the answer.

Units: windows are seconds (rendered as a PromQL duration, 60 -> `60s`, 2.5 -> `2500ms`);
bucket queries return per-second rates of cumulative counts per (model, `le`), with
`le` in the histogram's own unit (seconds or tokens).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum

DEFAULT_MODEL_LABEL = "model_name"
DEFAULT_WINDOW_S = 60.0
SIGNAL_LABEL = "governor_signal"
"""Label that tells the parts of a multi-signal query apart."""

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# Histogram base names, current name first, then deprecated ones (ARCHITECTURE.md s. 4).
TTFT_METRICS: tuple[str, ...] = ("vllm:time_to_first_token_seconds",)
ITL_METRICS: tuple[str, ...] = (
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",  # before vLLM 0.11
)
E2E_METRICS: tuple[str, ...] = ("vllm:e2e_request_latency_seconds",)
QUEUE_METRICS: tuple[str, ...] = ("vllm:request_queue_time_seconds",)
PROMPT_TOKENS_METRICS: tuple[str, ...] = ("vllm:request_prompt_tokens",)
OUTPUT_TOKENS_METRICS: tuple[str, ...] = ("vllm:request_generation_tokens",)

# Gauges and counters (counters with the `_total` suffix Prometheus shows).
RUNNING_METRICS: tuple[str, ...] = ("vllm:num_requests_running",)
WAITING_METRICS: tuple[str, ...] = ("vllm:num_requests_waiting",)
KV_USAGE_METRICS: tuple[str, ...] = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",  # before vLLM 0.9
)
SUCCESS_METRICS: tuple[str, ...] = ("vllm:request_success_total",)
PREEMPTIONS_METRICS: tuple[str, ...] = ("vllm:num_preemptions_total",)
PREFIX_HITS_METRICS: tuple[str, ...] = (
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total",  # before vLLM 0.10
)
PREFIX_QUERIES_METRICS: tuple[str, ...] = (
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total",  # before vLLM 0.10
)


class Signal(StrEnum):
    """Values of `SIGNAL_LABEL` in the multi-signal queries (units in the names)."""

    ARRIVAL_RPS = "arrival_rps"
    ARRIVAL_SHORT_RPS = "arrival_short_rps"
    COMPLETIONS_RPS = "completions_rps"
    PROMPT_TOKENS_MEAN = "prompt_tokens_mean"
    OUTPUT_TOKENS_MEAN = "output_tokens_mean"
    RUNNING = "running"
    WAITING = "waiting"
    KV_USAGE_FRAC = "kv_usage_frac"
    READY_REPLICAS = "ready_replicas"
    GAUGE_SAMPLE_TS = "gauge_sample_ts"
    COUNTER_SAMPLE_TS = "counter_sample_ts"
    PREFIX_CACHE_HIT_FRAC = "prefix_cache_hit_frac"
    PREEMPTION_RATE_PER_S = "preemption_rate_per_s"


def promql_duration(seconds: float) -> str:
    """Render a window in seconds as a PromQL duration: 60 -> `60s`, 2.5 -> `2500ms`.

    Raises ValueError unless `seconds` is finite and at least 1 ms.
    """
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ValueError(f"window must be a finite number of seconds >= 0.001, got {seconds}")
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def check_label_name(label: str) -> str:
    """Return `label` when it is a valid Prometheus label name, else raise ValueError."""
    if not _LABEL_NAME.match(label) or label in (SIGNAL_LABEL, "le"):
        raise ValueError(f"invalid model label name {label!r}")
    return label


def _tag(expr: str, signal: Signal) -> str:
    """Tag every series of `expr` with `SIGNAL_LABEL="<signal>"`."""
    return f'label_replace({expr}, "{SIGNAL_LABEL}", "{signal.value}", "", "")'


@dataclass(frozen=True, slots=True)
class QueryBuilder:
    """Renders the templates for one model label, window (seconds) and name policy."""

    model_label: str = DEFAULT_MODEL_LABEL
    window_s: float = DEFAULT_WINDOW_S
    accept_escaped: bool = True
    """Also accept `vllm_...` for every `vllm:...` name (see the module docstring)."""
    short_window_s: float | None = None
    """Also report the arrival rate over this shorter (panic) window, seconds."""

    def __post_init__(self) -> None:
        check_label_name(self.model_label)
        promql_duration(self.window_s)
        if self.short_window_s is not None:
            promql_duration(self.short_window_s)

    @property
    def window(self) -> str:
        """The window as a PromQL duration."""
        return promql_duration(self.window_s)

    def names(self, metrics: Sequence[str], suffix: str = "") -> list[str]:
        """Every accepted spelling of `metrics` + `suffix`, preferred first."""
        out = [m + suffix for m in metrics]
        if self.accept_escaped:
            out += [n.replace(":", "_") for n in out if ":" in n]
        return out

    def either(self, metrics: Sequence[str], fmt: str = "{name}", suffix: str = "") -> str:
        """`fmt` applied to every accepted name, joined with `or` (per-series fallback)."""
        return " or ".join(fmt.format(name=n, w=self.window) for n in self.names(metrics, suffix))

    def sum_rate(self, metrics: Sequence[str], suffix: str = "") -> str:
        """Per-model sum over engines of a counter's per-second rate."""
        inner = self.either(metrics, "rate({name}[{w}])", suffix)
        return f"sum by ({self.model_label}) ({inner})"

    def buckets(self, metrics: Sequence[str]) -> str:
        """Per-second rate of a histogram's cumulative buckets per model and `le`.

        One answer serves both the quantile (interpolated like PromQL's
        `histogram_quantile`) and the exact attainment `bucket(le=SLA) / count`.
        """
        inner = self.either(metrics, "rate({name}[{w}])", "_bucket")
        return f"sum by ({self.model_label}, le) ({inner})"

    def token_means(self) -> str:
        """Mean prompt and output length (tokens per request) over the window, both at once.

        `rate(_sum) / rate(_count)`; no requests in the window gives NaN (0/0): no data.
        """
        parts = []
        for metrics, signal in (
            (PROMPT_TOKENS_METRICS, Signal.PROMPT_TOKENS_MEAN),
            (OUTPUT_TOKENS_METRICS, Signal.OUTPUT_TOKENS_MEAN),
        ):
            mean = f"{self.sum_rate(metrics, '_sum')} / {self.sum_rate(metrics, '_count')}"
            parts.append(_tag(mean, signal))
        return " or ".join(parts)

    def demand(self) -> str:
        """Arrival rate and completion rate, requests per second.

        arrival = max(0, completions + d(waiting + running)/dt): the requests that
        finished plus the growth of those still in the engines (a shrinking queue means
        arrivals below completions). Example: 30 completions/s while the queue grows by
        2/s -> 32 req/s. `deriv` is linear, so the sum of per-engine slopes is the slope
        of the sum, and an engine appearing or vanishing does not read as a jump in
        demand. Where the gauges are missing the completion rate alone stands in (`or`).
        """
        out = f"{_tag(self._arrival(self), Signal.ARRIVAL_RPS)} or " + _tag(
            self.sum_rate(SUCCESS_METRICS), Signal.COMPLETIONS_RPS
        )
        if self.short_window_s is not None:
            # The same expression over the panic window, in the same query (no extra
            # round trip): a flash crowd shows here seconds before the long window.
            short = replace(self, window_s=self.short_window_s, short_window_s=None)
            out += f" or {_tag(self._arrival(short), Signal.ARRIVAL_SHORT_RPS)}"
        return out

    @staticmethod
    def _arrival(b: QueryBuilder) -> str:
        m = b.model_label
        completions = b.sum_rate(SUCCESS_METRICS)
        growth = " + ".join(
            f"sum by ({m}) ({b.either(g, 'deriv({name}[{w}])')})"
            for g in (WAITING_METRICS, RUNNING_METRICS)
        )
        return f"(clamp_min({completions} + {growth}, 0) or {completions})"

    def state(self) -> str:
        """Instant gauges per model: running and waiting (sums over engines, requests),
        KV usage (mean over engines, fraction, 1 = full), ready replicas (engines
        reporting), and the newest gauge and counter sample times (unix seconds).
        """
        m = self.model_label
        parts = [
            _tag(f"sum by ({m}) ({self.either(RUNNING_METRICS)})", Signal.RUNNING),
            _tag(f"sum by ({m}) ({self.either(WAITING_METRICS)})", Signal.WAITING),
            _tag(f"avg by ({m}) ({self.either(KV_USAGE_METRICS)})", Signal.KV_USAGE_FRAC),
            _tag(f"count by ({m}) ({self.either(RUNNING_METRICS)})", Signal.READY_REPLICAS),
            _tag(
                f"max by ({m}) ({self.either(RUNNING_METRICS, 'timestamp({name})')})",
                Signal.GAUGE_SAMPLE_TS,
            ),
            _tag(
                f"max by ({m}) ({self.either(SUCCESS_METRICS, 'timestamp({name})')})",
                Signal.COUNTER_SAMPLE_TS,
            ),
        ]
        return " or ".join(parts)

    def rates(self) -> str:
        """Counter rates: prefix-cache hit fraction (hit tokens / queried tokens, NaN when
        nothing was queried) and preemptions per second (sums over engines).
        """
        hit = f"{self.sum_rate(PREFIX_HITS_METRICS)} / {self.sum_rate(PREFIX_QUERIES_METRICS)}"
        preempt = self.sum_rate(PREEMPTIONS_METRICS)
        return (
            f"{_tag(hit, Signal.PREFIX_CACHE_HIT_FRAC)} or "
            f"{_tag(preempt, Signal.PREEMPTION_RATE_PER_S)}"
        )


@dataclass(frozen=True, slots=True)
class TickQueries:
    """The full set of queries one tick runs, by name. Count: `len(list(q.items()))`."""

    demand: str
    state: str
    rates: str
    token_means: str
    ttft_buckets: str
    itl_buckets: str
    e2e_buckets: str
    queue_buckets: str
    prompt_tokens_buckets: str
    output_tokens_buckets: str

    def items(self) -> Iterator[tuple[str, str]]:
        """(name, query) pairs in a fixed order, demand first."""
        for f in fields(self):
            yield f.name, getattr(self, f.name)


def build_queries(
    model_label: str = DEFAULT_MODEL_LABEL,
    window_s: float = DEFAULT_WINDOW_S,
    *,
    accept_escaped: bool = True,
    short_window_s: float | None = None,
) -> TickQueries:
    """All queries for one tick, grouped by `model_label`, rates over `window_s` seconds
    (and the arrival rate also over `short_window_s`, when given)."""
    b = QueryBuilder(model_label, window_s, accept_escaped, short_window_s)
    return TickQueries(
        demand=b.demand(),
        state=b.state(),
        rates=b.rates(),
        token_means=b.token_means(),
        ttft_buckets=b.buckets(TTFT_METRICS),
        itl_buckets=b.buckets(ITL_METRICS),
        e2e_buckets=b.buckets(E2E_METRICS),
        queue_buckets=b.buckets(QUEUE_METRICS),
        prompt_tokens_buckets=b.buckets(PROMPT_TOKENS_METRICS),
        output_tokens_buckets=b.buckets(OUTPUT_TOKENS_METRICS),
    )
