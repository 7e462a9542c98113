"""PromQL templates for the vLLM signals.

This module owns the query text and nothing else: which metrics are read, how they are
aggregated and which alternative metric names are accepted. `PrometheusSource`
(estimators/prometheus.py) owns running the queries and interpreting the answers.

Every query covers ALL models at once, grouped `by (<model label>)`, so the number of
queries per tick is constant in the number of models: `queries_of` returns eight
(demand, state, counter rates and means, four of quantiles, SLA-edge buckets).

Prometheus does the heavy lifting, so an answer carries a few numbers per model rather
than every bucket of every histogram (issue 13 item 6: 124 series per model became about
45): quantiles come from PromQL's own `histogram_quantile` over
`sum by (<model label>, le)` of the bucket rates; for the exact attainment only the
buckets at the SLA thresholds (and `+Inf`, the count) are fetched, selected by an `le`
regex built from the thresholds in use (`le_regex`).

Alternative names are joined with `or` *per series, before aggregation*: PromQL matches
`or` operands on all labels except the metric name, so each engine contributes its
current-name series when it has one and an alternative otherwise. A fleet halfway
through a vLLM upgrade is read correctly and the query count does not double. Worked
example: `sum by (model_name, le) (rate(vllm:inter_token_latency_seconds_bucket[60s])
or rate(vllm:time_per_output_token_seconds_bucket[60s]))`. The alternatives are the
deprecated names and, unless `accept_escaped=False`, the same names with `:` escaped to
`_` (`vllm_...`): prometheus_client 0.26 writes sample names that way in its OpenMetrics
exposition, which a Prometheus 2.x scrape negotiates by default.

Recording rules (`QueryBuilder.recording_rules`, shipped in the chart's PrometheusRule):
Prometheus evaluates each `histogram_quantile` over a fresh bucket-rate aggregation (17
per tick, ~2.5x the evaluation time of plain bucket queries); the rules record each
histogram's `sum by (<model label>, le)` bucket rates once per evaluation interval as
`governor:<hist>_bucket:rate<window>`, and with `recorded` the quantile and SLA-edge
queries read those series instead (same values, up to one evaluation interval older).
The rules also record a marker (`RULES_MARKER`, labelled with the window, model label,
name policy and `RULES_VERSION`); the demand query carries it (`rules_marker`), so the
source knows on every tick, at no extra query, whether fitting rules are loaded. The
marker says a rule group is loaded, not that each rule evaluates: a rule whose
expression starts failing keeps its last samples readable for Prometheus's 5-minute
lookback. With `recorded_max_age_s` a recorded series is read only while its newest
sample is that fresh (`timestamp()`), so such a rule's histogram reads as no data
after the bound rather than as values minutes old; the other rules' series still read.

Namespaces (`namespace_label`, default `namespace`): every per-model aggregation is
grouped by the model label and the namespace label, `sum by (model_name, namespace)`,
so a model of the same name served in another namespace (staging, another team's
fleet) is a series of its own, not summed into this one's; the source keeps the series
of each model's own namespace (`estimators.answers.ScopeKeys`). Series without the
label (a scrape config that does not add it, a docker-compose setup) group under an
empty namespace and are read where no series of the model's namespace exists; an
ingress query grouped by the model alone is read either way. Example:
`sum by (model_name, namespace) (rate(vllm:request_success_total[60s]))` answers
{model_name="m", namespace="prod"} 20 and {model_name="m", namespace="staging"} 150;
model m of namespace prod reads 20.

Each pod once (`ENGINE_SERIES_LABELS`): a pod that two scrape configs select (a
ServiceMonitor and a PodMonitor, two jobs) has every series twice, under two `job`
labels and whatever else each config adds (`service`, `endpoint`). So every engine
series is first reduced to one per pod (`instance`) and vLLM's own labels with `max by`
(the copies are equal), then summed: `sum by (model_name, namespace) (max by
(model_name, namespace, instance, engine, le, finished_reason, reason)
(rate(vllm:request_success_total[60s])))`; targets and ready replicas are counted per
`instance`. A pod scraped by jobs A and B at 10 req/s reads 10, not 20.

Ingress (`ingress_rate_query`, optional): the request rate at whatever sits in front of
the engines (a gateway, router or ingress), an expression the operator writes for their
own gateway, grouped by the model label, with `{window}` where the rate window goes. It
rides in the demand query, tagged `ingress_rps`. Two things only it can see: demand for
a model scaled to zero (no engine is left to report any) and requests a server has not
yet handed to its engine. Example (the Gateway API Inference Extension's endpoint
picker): `sum by (model_name) (rate(inference_model_request_total[{window}]))`.

Several signals share one query: each part is tagged with the label `SIGNAL_LABEL`
(`label_replace(v, "governor_signal", "running", "", "")`) and the parts are joined
with `or`; the distinct tag keeps every part in the answer.

Units: windows are seconds (rendered as a PromQL duration, 60 -> `60s`, 2.5 -> `2500ms`);
quantiles and means of latency histograms are in seconds, of token histograms in tokens;
rates per second; the SLA-edge query returns per-second rates of cumulative counts per
(model, `le`, histogram tag).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum

DEFAULT_MODEL_LABEL = "model_name"
DEFAULT_NAMESPACE_LABEL = "namespace"
"""The label Prometheus's Kubernetes service discovery (a ServiceMonitor, a PodMonitor,
the common `kubernetes_sd_configs` relabelling) puts the scraped pod's namespace in."""
DEFAULT_WINDOW_S = 60.0
DEFAULT_SEED_WINDOW_S = 300.0
"""The seed policy's arrival window (5 minutes), seconds."""
DEFAULT_SCRAPE_INTERVAL_S = 15.0
"""How often Prometheus scrapes the engines when nothing says (its common setting), s."""
SIGNAL_LABEL = "governor_signal"
"""Label that tells the parts of a multi-signal query apart."""
RULES_MARKER = "governor:recording_rules"
"""The series the chart's recording rules also record (value 1, labels `RULES_LABELS`):
its presence tells the source that the recorded bucket rates exist."""
RULES_VERSION = "2"
"""Bumped when the recorded series change meaning (a source reads only its own version)."""
RULES_SIGNAL = "recording_rules"
"""The tag of the marker in the demand answer (`QueryBuilder.rules_marker`)."""
RULES_MARKER_MODEL = "__governor__"
"""The model label value the marker carries in the demand answer (no model has it)."""

ENGINE_SERIES_LABELS = "instance, engine, le, finished_reason, reason"
"""What tells one engine series from another besides the model and namespace: the pod
(`instance`, the scraped address) and vLLM's own labels (engine rank, bucket bound,
finished reason, rejection reason). The labels a scrape config adds (`job`, `service`,
`endpoint`, `pod`) are not among them: a pod scraped twice is one pod (module doc)."""

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# Histogram base names (vLLM V1, labels model_name and engine), current name first, then
# deprecated ones.
TTFT_METRICS: tuple[str, ...] = ("vllm:time_to_first_token_seconds",)
ITL_METRICS: tuple[str, ...] = (
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",  # before vLLM 0.11
)
TPOT_METRICS: tuple[str, ...] = ("vllm:request_time_per_output_token_seconds",)
"""Per-request mean time per output token (one observation per finished request)."""
E2E_METRICS: tuple[str, ...] = ("vllm:e2e_request_latency_seconds",)
QUEUE_METRICS: tuple[str, ...] = ("vllm:request_queue_time_seconds",)
DECODE_METRICS: tuple[str, ...] = ("vllm:request_decode_time_seconds",)
PREFILL_METRICS: tuple[str, ...] = ("vllm:request_prefill_time_seconds",)
PROMPT_TOKENS_METRICS: tuple[str, ...] = ("vllm:request_prompt_tokens",)
OUTPUT_TOKENS_METRICS: tuple[str, ...] = ("vllm:request_generation_tokens",)
STEP_TOKENS_METRICS: tuple[str, ...] = ("vllm:iteration_tokens_total",)
"""Tokens scheduled per engine step: a histogram whose base name ends in `_total`."""

# Gauges and counters (counters with the `_total` suffix Prometheus shows).
RUNNING_METRICS: tuple[str, ...] = ("vllm:num_requests_running",)
WAITING_METRICS: tuple[str, ...] = ("vllm:num_requests_waiting",)
KV_USAGE_METRICS: tuple[str, ...] = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",  # before vLLM 0.9
)
SUCCESS_METRICS: tuple[str, ...] = ("vllm:request_success_total",)
PREEMPTIONS_METRICS: tuple[str, ...] = ("vllm:num_preemptions_total",)
ADMISSION_REJECTIONS_METRICS: tuple[str, ...] = ("vllm:admission_rejections_total",)
"""Requests the front end refused at a queue limit (`--max-num-queued-reqs`,
`--max-num-queued-tokens`), labels model_name and reason: offered load that never
reached an engine's queue (vLLM 0.32 has it; absent in older versions)."""
PREFIX_HITS_METRICS: tuple[str, ...] = (
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total",  # before vLLM 0.10
)
PREFIX_QUERIES_METRICS: tuple[str, ...] = (
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total",  # before vLLM 0.10
)


class Signal(StrEnum):
    """Values of `SIGNAL_LABEL` in the multi-signal queries (units in the names).

    Quantile tags are not members: they are `quantile_signal(hist, q)`, e.g. `ttft_p95`.
    """

    ARRIVAL_RPS = "arrival_rps"
    ARRIVAL_SHORT_RPS = "arrival_short_rps"
    ARRIVAL_SEED_RPS = "arrival_seed_rps"
    INGRESS_RPS = "ingress_rps"
    COMPLETIONS_RPS = "completions_rps"
    PROMPT_TOKENS_MEAN = "prompt_tokens_mean"
    OUTPUT_TOKENS_MEAN = "output_tokens_mean"
    TTFT_MEAN_S = "ttft_mean_s"
    ITL_MEAN_S = "itl_mean_s"
    DECODE_TIME_MEAN_S = "decode_time_mean_s"
    PREFILL_TIME_MEAN_S = "prefill_time_mean_s"
    QUEUE_TIME_MEAN_S = "queue_time_mean_s"
    E2E_MEAN_S = "e2e_mean_s"
    STEP_TOKENS_MEAN = "step_tokens_mean"
    RUNNING = "running"
    WAITING = "waiting"
    KV_USAGE_FRAC = "kv_usage_frac"
    READY_REPLICAS = "ready_replicas"
    GAUGE_SAMPLE_TS = "gauge_sample_ts"
    COUNTER_SAMPLE_TS = "counter_sample_ts"
    TARGETS_UP = "targets_up"
    TARGETS_KNOWN = "targets_known"
    TARGETS_SEEN = "targets_seen"
    PREFIX_CACHE_HIT_FRAC = "prefix_cache_hit_frac"
    PREEMPTION_RATE_PER_S = "preemption_rate_per_s"


# Histograms whose quantiles one tick reads: (tag, names, quantiles). A distribution
# (p50/p90/p95/p99) for TTFT, ITL and e2e; p95 for the rest.
DIST_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
QUANTILES: tuple[tuple[str, tuple[str, ...], tuple[float, ...]], ...] = (
    ("ttft", TTFT_METRICS, DIST_QUANTILES),
    ("itl", ITL_METRICS, DIST_QUANTILES),
    ("e2e", E2E_METRICS, DIST_QUANTILES),
    ("queue", QUEUE_METRICS, (0.95,)),
    ("decode", DECODE_METRICS, (0.95,)),
    ("tpot", TPOT_METRICS, (0.95,)),
    ("prompt_tokens", PROMPT_TOKENS_METRICS, (0.95,)),
    ("output_tokens", OUTPUT_TOKENS_METRICS, (0.95,)),
)
# Means `rate(_sum) / rate(_count)`: (tag, histogram names).
MEANS: tuple[tuple[Signal, tuple[str, ...]], ...] = (
    (Signal.PROMPT_TOKENS_MEAN, PROMPT_TOKENS_METRICS),
    (Signal.OUTPUT_TOKENS_MEAN, OUTPUT_TOKENS_METRICS),
    (Signal.TTFT_MEAN_S, TTFT_METRICS),
    (Signal.ITL_MEAN_S, ITL_METRICS),
    (Signal.DECODE_TIME_MEAN_S, DECODE_METRICS),
    (Signal.PREFILL_TIME_MEAN_S, PREFILL_METRICS),
    (Signal.QUEUE_TIME_MEAN_S, QUEUE_METRICS),
    (Signal.E2E_MEAN_S, E2E_METRICS),
    (Signal.STEP_TOKENS_MEAN, STEP_TOKENS_METRICS),
)
# Histograms read at the SLA thresholds for exact attainment: (tag, names).
EDGE_HISTOGRAMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ttft", TTFT_METRICS),
    ("itl", ITL_METRICS),
    ("tpot", TPOT_METRICS),
)


_HIST_OF: dict[tuple[str, ...], str] = {tuple(metrics): hist for hist, metrics, _qs in QUANTILES}
"""Histogram names -> their tag (every histogram read by buckets is one of QUANTILES)."""


def quantile_signal(hist: str, q: float) -> str:
    """The tag of the q-quantile of histogram `hist`: ("ttft", 0.95) -> `ttft_p95`."""
    return f"{hist}_p{round(q * 100):d}"


def recorded_bucket_name(hist: str, window: str) -> str:
    """The series the chart's recording rule records for histogram tag `hist` over the
    PromQL duration `window`: ("ttft", "60s") -> `governor:ttft_bucket:rate60s`."""
    return f"governor:{hist}_bucket:rate{window}"


def promql_duration(seconds: float) -> str:
    """Render a window in seconds as a PromQL duration: 60 -> `60s`, 2.5 -> `2500ms`.

    Raises ValueError unless `seconds` is finite and at least 1 ms.
    """
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ValueError(f"window must be a finite number of seconds >= 0.001, got {seconds}")
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def check_label_name(label: str, what: str = "model label") -> str:
    """Return `label` when it is a valid Prometheus label name that the queries do not
    use themselves, else raise ValueError naming `what` it is."""
    if not _LABEL_NAME.match(label) or label in (SIGNAL_LABEL, "le"):
        raise ValueError(f"invalid {what} name {label!r}")
    return label


def le_spellings(bound: float) -> list[str]:
    """The ways an exporter writes bucket bound `bound` in the `le` label.

    Python's prometheus_client writes `0.05`, `1.0`, `2560.0`; Go's client `1`, `2560`;
    either may use an exponent (`1e-05`). Example: 1.0 -> ["1.0", "1"].
    """
    out = [repr(float(bound)), f"{bound:g}"]
    if float(bound).is_integer():
        out += [f"{int(bound)}", f"{int(bound)}.0"]
    return list(dict.fromkeys(out))


def le_regex(bounds: Iterable[float]) -> str:
    """An RE2 alternation matching the `le` label of each bound and of `+Inf`.

    Bounds that are not finite and > 0 are skipped (no SLA threshold is). Example:
    (0.05, 1.0) -> `0\\.05|1\\.0|1|\\+Inf` (each spelling of each bound, then `+Inf`).
    """
    parts: list[str] = []
    for b in sorted(set(bounds)):
        if math.isfinite(b) and b > 0:
            parts += [re.escape(s) for s in le_spellings(b)]
    parts.append(re.escape("+Inf"))
    return "|".join(dict.fromkeys(parts))


def check_labels(model_label: str, namespace_label: str | None) -> None:
    """ValueError unless both labels pass `check_label_name` and differ (namespace None: none)."""
    check_label_name(model_label)
    if namespace_label is not None:
        check_label_name(namespace_label, "namespace label")
        if namespace_label == model_label:
            both = f"namespace_label and model_label are both {model_label!r}"
            raise ValueError(f"{both}: they must name different labels")


WINDOW_PLACEHOLDER = "{window}"
"""Where the rate window goes in `ingress_rate_query` (a plain substitution: PromQL's own
braces, label matchers, are left alone)."""


def check_ingress_query(query: str) -> str:
    """`query` when it can be an ingress rate expression (module doc), else ValueError
    naming what is wrong. Prometheus checks the PromQL itself on the first tick."""
    q = query.strip()
    if not q:
        raise ValueError("ingress_rate_query is empty")
    if WINDOW_PLACEHOLDER not in q:
        raise ValueError(
            f"ingress_rate_query must contain {WINDOW_PLACEHOLDER} where the rate window "
            f"goes, e.g. sum by (model_name) (rate(my_gateway_requests_total[{{window}}]))"
        )
    return q


def _tag(expr: str, signal: str) -> str:
    """Tag every series of `expr` with `SIGNAL_LABEL="<signal>"`."""
    return f'label_replace({expr}, "{SIGNAL_LABEL}", "{signal}", "", "")'


@dataclass(frozen=True, slots=True)
class QueryBuilder:
    """Renders the templates for one model label, window (seconds) and name policy."""

    model_label: str = DEFAULT_MODEL_LABEL
    window_s: float = DEFAULT_WINDOW_S
    accept_escaped: bool = True
    """Also accept `vllm_...` for every `vllm:...` name (see the module docstring)."""
    short_window_s: float | None = None
    """Also report the arrival rate over this shorter (panic) window, seconds."""
    seed_window_s: float | None = DEFAULT_SEED_WINDOW_S
    """Also report the arrival rate over this longer (seed policy) window, seconds."""
    targets_lookback_s: float | None = None
    """How long an engine target that went down or left discovery still belongs to its
    model (`engine_targets`), seconds; default the longest window."""
    recorded: bool = False
    """Read the bucket rates from the recording rules' series (`recording_rules`)
    instead of computing them from the raw buckets."""
    gauge_lookback_s: float | None = None
    """How long a gauge sample and a target's `up == 1` still count, seconds (two scrape
    intervals): a single missed scrape (`up` 0 for one sample, the target's series
    marked stale) is then not a dead target; two in a row are. None: instant values."""
    ingress_rate_query: str | None = None
    """The request rate in front of the engines, per model (module doc); None: not read."""
    namespace_label: str | None = DEFAULT_NAMESPACE_LABEL
    """Group by this label too, so a model is read from its own namespace only (module
    doc, "Namespaces"); None: by the model label alone."""
    recorded_max_age_s: float | None = None
    """`recorded`: read a recorded series only while its newest sample is at most this
    old, seconds (`PrometheusSource`: three rule evaluation intervals); None: as old as
    Prometheus's lookback (5 minutes). A rule that stops evaluating (its expression
    fails, its group is gone while the marker of another stays) leaves its last samples
    readable for the lookback: read as no data after this bound, never as old values."""
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    """How often Prometheus scrapes the engines, s: the step of `demand`'s subquery."""

    def __post_init__(self) -> None:
        check_labels(self.model_label, self.namespace_label)
        for w in (
            self.window_s,
            self.short_window_s,
            self.seed_window_s,
            self.targets_lookback_s,
            self.gauge_lookback_s,
            self.scrape_interval_s,
        ):
            if w is not None:
                promql_duration(w)
        if self.ingress_rate_query is not None:
            check_ingress_query(self.ingress_rate_query)
        if self.recorded_max_age_s is not None and not (
            math.isfinite(self.recorded_max_age_s) and self.recorded_max_age_s > 0
        ):
            raise ValueError(
                f"recorded_max_age_s must be > 0 seconds, got {self.recorded_max_age_s}"
            )

    @property
    def by(self) -> str:
        """The labels every per-model answer is grouped by: the model label, then the
        namespace label when set (`model_name, namespace`)."""
        ns = self.namespace_label
        return self.model_label if ns is None else f"{self.model_label}, {ns}"

    @property
    def window(self) -> str:
        """The window as a PromQL duration."""
        return promql_duration(self.window_s)

    @property
    def lookback(self) -> str:
        """The targets' lookback as a PromQL duration."""
        if self.targets_lookback_s is not None:
            return promql_duration(self.targets_lookback_s)
        return promql_duration(max(self.window_s, self.seed_window_s or 0.0))

    def names(self, metrics: Sequence[str], suffix: str = "") -> list[str]:
        """Every accepted spelling of `metrics` + `suffix`, preferred first."""
        out = [m + suffix for m in metrics]
        if self.accept_escaped:
            out += [n.replace(":", "_") for n in out if ":" in n]
        return out

    def either(self, metrics: Sequence[str], fmt: str = "{name}", suffix: str = "") -> str:
        """`fmt` applied to every accepted name, joined with `or` (per-series fallback)."""
        return " or ".join(
            fmt.format(name=n, w=self.window, lb=self.lookback) for n in self.names(metrics, suffix)
        )

    def once(self, expr: str) -> str:
        """`expr` with each engine series of each pod once (`ENGINE_SERIES_LABELS`): the
        copies a pod scraped by several jobs leaves are equal, `max` keeps one."""
        return f"max by ({self.by}, {ENGINE_SERIES_LABELS}) ({expr})"

    def sum_rate(self, metrics: Sequence[str], suffix: str = "") -> str:
        """Per-model sum over engines of a counter's per-second rate."""
        inner = self.either(metrics, "rate({name}[{w}])", suffix)
        return f"sum by ({self.by}) ({self.once(inner)})"

    def buckets(self, metrics: Sequence[str], le: str | None = None) -> str:
        """Per-second rate of a histogram's cumulative buckets per model and `le`; with
        `le` (an RE2 regex, see `le_regex`) only the matching buckets. `recorded`: summed
        from the recording rule's series (already one per model and `le`; the sum keeps
        the answer's labels the same where a rule evaluator adds labels of its own),
        only its series fresher than `recorded_max_age_s`: `sum by (model_name,
        namespace, le) (s and (timestamp(s) > time() - 45))`."""
        if self.recorded:
            name = recorded_bucket_name(_HIST_OF[tuple(metrics)], self.window)
            sel = name if le is None else f"{name}{{le=~`{le}`}}"
            if self.recorded_max_age_s is not None:
                sel = f"{sel} and (timestamp({sel}) > time() - {self.recorded_max_age_s:g})"
            return f"sum by ({self.by}, le) ({sel})"
        sel = "" if le is None else f"{{{{le=~`{le}`}}}}"
        inner = self.either(metrics, "rate({name}" + sel + "[{w}])", "_bucket")
        return f"sum by ({self.by}, le) ({self.once(inner)})"

    def quantiles(self, hists: Sequence[str] | None = None) -> str:
        """The quantiles of `QUANTILES` (of the histograms tagged `hists`, default all),
        computed by PromQL's `histogram_quantile` over the per-model bucket rates; tagged
        `quantile_signal(hist, q)`. Seconds for latency histograms, tokens for token ones;
        NaN (no requests in the window) is no data."""
        parts = []
        for hist, metrics, qs in QUANTILES:
            if hists is not None and hist not in hists:
                continue
            grouped = self.buckets(metrics)
            parts += [_tag(f"histogram_quantile({q:g}, {grouped})", quantile_signal(hist, q))
                      for q in qs]  # fmt: skip
        return " or ".join(parts)

    def edge_buckets(self, edges: dict[str, Iterable[float]]) -> str:
        """Bucket rates at the SLA thresholds only: for each histogram tag of
        `EDGE_HISTOGRAMS`, the buckets whose bound is one of `edges[tag]` (seconds), and
        the `+Inf` bucket (the count), tagged with the histogram's tag. The exact
        attainment of a threshold on a bucket edge is `bucket(le=SLA) / bucket(+Inf)`."""
        return " or ".join(
            _tag(self.buckets(metrics, le_regex(edges.get(hist, ()))), hist)
            for hist, metrics in EDGE_HISTOGRAMS
        )

    def rules_labels(self) -> dict[str, str]:
        """The labels of `RULES_MARKER` for rules that fit this builder: the window, the
        model and namespace labels, the name policy and `RULES_VERSION`. Without a
        namespace label its value is "", which a selector matches to a series without
        the label (rules that group by the model label alone)."""
        return {
            "window": self.window,
            "model_label": self.model_label,
            "namespace_label": self.namespace_label or "",
            "accept_escaped": "true" if self.accept_escaped else "false",
            "version": RULES_VERSION,
        }

    def recording_rules(self) -> list[dict[str, object]]:
        """The recording rules this builder's `recorded` queries read, as Prometheus rule
        dicts (`record`, `expr`, `labels`): one per histogram of `QUANTILES`, its bucket
        rates `sum by (<model label>, le)` (exactly `buckets(metrics)` unrecorded), and the
        marker (`RULES_MARKER`, `vector(1)` with `rules_labels`). The chart renders the
        same rules (tests/helm check that they are equal)."""
        raw = replace(self, recorded=False)
        rules: list[dict[str, object]] = [
            {"record": recorded_bucket_name(hist, self.window), "expr": raw.buckets(metrics)}
            for hist, metrics, _qs in QUANTILES
        ]
        labels = {k: v for k, v in self.rules_labels().items() if v}  # "" is no label
        rules.append({"record": RULES_MARKER, "expr": "vector(1)", "labels": labels})
        return rules

    def rules_marker(self) -> str:
        """The marker of fitting recording rules, tagged `RULES_SIGNAL` and with the model
        label `RULES_MARKER_MODEL`, so it rides in a tagged answer: one series when the
        rules are loaded, none otherwise."""
        sel = ",".join(f'{k}="{v}"' for k, v in self.rules_labels().items())
        marker = f'label_replace({RULES_MARKER}{{{sel}}}, "{self.model_label}", '
        marker += f'"{RULES_MARKER_MODEL}", "", "")'
        return _tag(marker, RULES_SIGNAL)

    def means_and_rates(self) -> str:
        """Means `rate(_sum) / rate(_count)` of `MEANS` (no requests in the window gives
        NaN: no data), the prefix-cache hit fraction (hit tokens / queried tokens) and
        preemptions per second (sums over engines)."""
        parts = [
            _tag(f"{self.sum_rate(m, '_sum')} / {self.sum_rate(m, '_count')}", signal.value)
            for signal, m in MEANS
        ]
        hit = f"{self.sum_rate(PREFIX_HITS_METRICS)} / {self.sum_rate(PREFIX_QUERIES_METRICS)}"
        parts.append(_tag(hit, Signal.PREFIX_CACHE_HIT_FRAC.value))
        parts.append(_tag(self.sum_rate(PREEMPTIONS_METRICS), Signal.PREEMPTION_RATE_PER_S.value))
        return " or ".join(parts)

    def demand(self) -> str:
        """Arrival rate and completion rate, requests per second.

        arrival = max(0, completions + d(waiting + running)/dt + rejections): the
        requests that finished plus the growth of those still in the engines (a
        shrinking queue means arrivals below completions) plus those the front end
        refused at its queue limit (`ADMISSION_REJECTIONS_METRICS`; without that counter
        the term is left out). Example: 30 completions/s while the queue grows by 2/s
        -> 32 req/s; with the queue held at its limit and 60 refused per second -> 90.
        The growth is the slope of the fleet's sum (`deriv` of a subquery, a point a
        scrape), not the sum of each engine's: a replica added inside the window would
        count its fill from the others' queues as arrivals (simulator/metrics.py). Where
        the gauges are missing the completion rate alone stands in (`or`).
        The same expression over the short (panic) and the seed windows rides in the
        same query when they are set, and so does the ingress rate (`ingress_rps`).
        """
        out = f"{_tag(self._arrival(self), Signal.ARRIVAL_RPS.value)} or " + _tag(
            self.sum_rate(SUCCESS_METRICS), Signal.COMPLETIONS_RPS.value
        )
        for window, signal in (
            (self.short_window_s, Signal.ARRIVAL_SHORT_RPS),
            (self.seed_window_s, Signal.ARRIVAL_SEED_RPS),
        ):
            if window is not None:
                other = replace(self, window_s=window, short_window_s=None, seed_window_s=None)
                out += f" or {_tag(self._arrival(other), signal.value)}"
        if self.ingress_rate_query is not None:
            expr = self.ingress_rate_query.strip().replace(WINDOW_PLACEHOLDER, self.window)
            out += f" or {_tag(f'({expr})', Signal.INGRESS_RPS.value)}"
        return out

    @staticmethod
    def _arrival(b: QueryBuilder) -> str:
        m = b.by
        completions = b.sum_rate(SUCCESS_METRICS)
        step = promql_duration(b.scrape_interval_s)
        growth = " + ".join(
            f"deriv((sum by ({m}) ({b.once(b._gauge(g))}))[{b.window}:{step}])"
            for g in (WAITING_METRICS, RUNNING_METRICS)
        )
        served = f"{completions} + {growth}"
        rejected = b.sum_rate(ADMISSION_REJECTIONS_METRICS)
        return f"(clamp_min({served} + {rejected}, 0) or clamp_min({served}, 0) or {completions})"

    def engine_targets(self) -> str:
        """The scrape targets (`instance`: pods, whichever jobs scrape them) of each
        model's engines: those that exported `vllm:num_requests_running` within the
        lookback, valued 1, labels (model, instance). `last_over_time` skips the
        staleness markers a failed scrape writes, so a target that went down or left
        service discovery stays here for the lookback."""
        m = self.by
        engines = self.either(RUNNING_METRICS, "last_over_time({name}[{lb}])")
        return f"group by ({m}, instance) ({engines})"

    def _gauge(self, metrics: Sequence[str]) -> str:
        """A gauge's latest value per series: instant, or with `gauge_lookback_s` the
        last sample within it (`last_over_time` skips the staleness markers a failed
        scrape writes)."""
        if self.gauge_lookback_s is None:
            return self.either(metrics)
        gl = promql_duration(self.gauge_lookback_s)
        return self.either(metrics, "last_over_time({name}[" + gl + "])")

    def _sample_ts(self, metrics: Sequence[str]) -> str:
        """The time of each series' newest sample (unix seconds): `timestamp()` of the
        instant value, or with `gauge_lookback_s`, where a missed scrape marked it
        stale, the newest step of a subquery over the lookback (4 steps)."""
        if self.gauge_lookback_s is None:
            return self.either(metrics, "timestamp({name})")
        gl = promql_duration(self.gauge_lookback_s)
        step = promql_duration(self.gauge_lookback_s / 4)
        lookback = "max_over_time(timestamp({name})[" + gl + ":" + step + "])"
        return f"{self.either(metrics, 'timestamp({name})')} or {self.either(metrics, lookback)}"

    def _up(self) -> str:
        """Each scrape target's health, 1 or 0: `up`, or with `gauge_lookback_s`
        whether any scrape within it succeeded."""
        if self.gauge_lookback_s is None:
            return "up"
        return f"max_over_time(up[{promql_duration(self.gauge_lookback_s)}])"

    def state(self) -> str:
        """Gauges per model: running and waiting (sums over engines, requests), KV usage
        (mean over engines, fraction, 1 = full; each pod once, module doc), ready
        replicas (pods, `instance`, whose engines report; not engines: a pod at vLLM's
        `--data-parallel-size N` exports N series, `engine="0"`... from one endpoint), the
        newest gauge and counter sample times (unix seconds), and the engine scrape
        targets: up (`up == 1`), known (in service discovery now: an `up` series exists)
        and seen (within the lookback, see `engine_targets`). Seen but not known is gone
        (a deleted pod); known but not up is down. With `gauge_lookback_s` (two scrape
        intervals) gauges and `up` are read over it: one missed scrape keeps the
        target's last values and its health; a target down for two scrapes is down.
        `up` is taken per instance, the highest of its series: a pod scraped by two jobs,
        or a pod IP reused by a new pod within the lookback, has two `up` series of one
        instance, which matched one to one would fail this query for every model.
        """
        m = self.by
        engines = self.engine_targets()
        up = f"max by (instance) ({self._up()})"
        health = f"({engines} * on (instance) group_left () {up})"
        running = self._gauge(RUNNING_METRICS)
        pods = f"group by ({m}, instance) ({running})"
        waiting, kv = (self.once(self._gauge(g)) for g in (WAITING_METRICS, KV_USAGE_METRICS))
        parts = [
            _tag(f"sum by ({m}) ({self.once(running)})", Signal.RUNNING),
            _tag(f"sum by ({m}) ({waiting})", Signal.WAITING),
            _tag(f"avg by ({m}) ({kv})", Signal.KV_USAGE_FRAC),
            _tag(f"count by ({m}) ({pods})", Signal.READY_REPLICAS),
            _tag(f"max by ({m}) ({self._sample_ts(RUNNING_METRICS)})", Signal.GAUGE_SAMPLE_TS),
            _tag(f"max by ({m}) ({self._sample_ts(SUCCESS_METRICS)})", Signal.COUNTER_SAMPLE_TS),
            _tag(f"sum by ({m}) {health}", Signal.TARGETS_UP),
            _tag(f"count by ({m}) {health}", Signal.TARGETS_KNOWN),
            _tag(f"count by ({m}) ({engines})", Signal.TARGETS_SEEN),
        ]
        return " or ".join(parts)


# The quantile queries, by name: Prometheus evaluates each `histogram_quantile` over a
# fresh bucket-rate aggregation, so one query for all 17 would be the tick's heaviest by
# far; four keep each within a few aggregations (and its evaluation timeout).
QUANTILE_QUERIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ttft_quantiles", ("ttft",)),
    ("itl_quantiles", ("itl",)),
    ("e2e_quantiles", ("e2e",)),
    ("other_quantiles", ("queue", "decode", "tpot", "prompt_tokens", "output_tokens")),
)


@dataclass(frozen=True, slots=True)
class TickQueries:
    """The full set of queries one tick runs, by name. Count: `len(list(q.items()))`."""

    demand: str
    state: str
    rates: str
    ttft_quantiles: str
    itl_quantiles: str
    e2e_quantiles: str
    other_quantiles: str
    sla_buckets: str

    def items(self) -> Iterator[tuple[str, str]]:
        """(name, query) pairs in a fixed order, demand first."""
        for f in fields(self):
            yield f.name, getattr(self, f.name)

    @property
    def quantiles(self) -> str:
        """The text of every quantile query (for reading, not for sending)."""
        return " or ".join(getattr(self, name) for name, _ in QUANTILE_QUERIES)


def queries_of(
    b: QueryBuilder, edges: dict[str, Iterable[float]] | None = None, *, rules_marker: bool = False
) -> TickQueries:
    """All queries for one tick as `b` renders them, the SLA-edge buckets at `edges`
    (histogram tag of `EDGE_HISTOGRAMS` -> thresholds, s); `rules_marker`: the demand
    query also carries `QueryBuilder.rules_marker`."""
    return TickQueries(
        demand=b.demand() + (f" or {b.rules_marker()}" if rules_marker else ""),
        state=b.state(),
        rates=b.means_and_rates(),
        ttft_quantiles=b.quantiles(("ttft",)),
        itl_quantiles=b.quantiles(("itl",)),
        e2e_quantiles=b.quantiles(("e2e",)),
        other_quantiles=b.quantiles(("queue", "decode", "tpot", "prompt_tokens", "output_tokens")),
        sla_buckets=b.edge_buckets(edges or {}),
    )
