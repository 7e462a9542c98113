"""`PrometheusSource`: the `MetricSource` that reads vLLM signals from Prometheus.

This module owns running the queries of `estimators.promql` against a Prometheus HTTP
API (through `prometheus_api_client.PrometheusConnect`, injectable) and turning the
answers into typed per-model outcomes:

- every query of a tick is evaluated at ONE evaluation time (`time=now_s`), so the
  signals of an observation describe the same instant;
- the number of queries per tick is constant in the number of models
  (`len(build_queries().items())`, ten), recorded in `queries_last_tick`;
- the backend unreadable (HTTP error, timeout, connection refused, non-JSON, a result
  that is not an instant vector of numbers) -> `SourceError` carrying the query;
- a model absent from the demand answer, or with a NaN/+-Inf arrival rate ->
  `NoDataError(model, "arrival_rate")` for that model only; other models are observed;
- an optional signal missing, NaN or infinite -> `None`, never 0.

Quantiles come from the bucket rates with `estimators.histogram.histogram_quantile`
(PromQL's interpolation), and the exact attainment `bucket(le=SLA) / count` from the
same answer when the SLA sits on a bucket edge.

Units: `now_s`, `window_s`, `timeout_s`, `staleness_s` in seconds (unix seconds for
times); latency quantiles are reported in milliseconds; rates per second.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from estimators.histogram import fraction_le, histogram_quantile
from estimators.promql import (
    DEFAULT_MODEL_LABEL,
    DEFAULT_WINDOW_S,
    SIGNAL_LABEL,
    Signal,
    TickQueries,
    build_queries,
)
from estimators.types import (
    ModelQuery,
    NoDataError,
    Observation,
    ObservationResult,
    SourceError,
    finite_or_none,
)

DEFAULT_TIMEOUT_S: Final = 3.0
DEMAND_SIGNAL: Final = "arrival_rate"
"""The signal named in the `NoDataError` of a model without demand data."""

Buckets = list[tuple[float, float]]
"""Cumulative (upper bound, per-second rate) pairs sorted by bound."""


class PrometheusSettingsLike(Protocol):
    """What the source reads from `controller.config.PrometheusSettings`.

    A protocol, not an import: estimators/ imports nothing else of ours.
    """

    @property
    def url(self) -> str: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def disable_ssl(self) -> bool: ...
    @property
    def model_label(self) -> str: ...


class QueryClient(Protocol):
    """The part of `PrometheusConnect` the source uses.

    `custom_query` returns the `data.result` list of the query API's JSON answer. When
    its signature has a `timeout` parameter the source passes its HTTP timeout per call.
    """

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


def _default_client(url: str, timeout_s: float, disable_ssl: bool, retries: int) -> QueryClient:
    """A `PrometheusConnect` with an HTTP timeout and no backoff-retries by default.

    PrometheusConnect's own default retries a failed request 3 times with exponential
    backoff (sleeps of 0, 2 and 4 s with urllib3 2.x) on connection errors, read
    timeouts and 408/429/5xx: one dead server would stall a 5 s tick for over 6 s, a
    slow one for 4 timeouts plus that. The control loop retries on the next tick instead.
    """
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    # read=False: a read timeout is re-raised as such (requests.ReadTimeout) rather than
    # wrapped in MaxRetryError -> requests.ConnectionError, and a slow server is never
    # asked twice in one tick.
    retry = Retry(total=retries, connect=retries, read=False, status=0, backoff_factor=0.0)
    kwargs: dict[str, Any] = {"url": url, "disable_ssl": disable_ssl, "retry": retry}
    if "timeout" in inspect.signature(PrometheusConnect.__init__).parameters:
        kwargs["timeout"] = timeout_s  # prometheus-api-client >= 0.6
    client: QueryClient = PrometheusConnect(**kwargs)
    return client


def _takes_timeout(client: QueryClient) -> bool:
    """True when `client.custom_query` accepts a `timeout` keyword (per-call timeout)."""
    try:
        params = inspect.signature(client.custom_query).parameters
    except (TypeError, ValueError):
        return False
    return "timeout" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


class PrometheusSource:
    """Reads every model's vLLM signals from Prometheus in a constant number of queries.

    `settings_or_url`: a `PrometheusSettings` (url, timeout_s, disable_ssl, model_label)
    or a base URL. `window_s`: the rate/quantile window, seconds. `timeout_s`: HTTP
    timeout per request and the server-side evaluation timeout, seconds (default: the
    settings' value, else 3 s); like requests' timeouts it bounds connecting and each
    wait for bytes. A failing observe stops at the first failing query; a succeeding
    one takes at most ten queries' time. `client`: injected query client (tests, custom
    auth); it then owns its session settings, and gets the timeout per call when its
    `custom_query` takes one. `retries`: HTTP retries of the default client (no backoff).
    `accept_escaped`: also read `vllm_...` spellings of the `vllm:...` names (promql).
    `short_window_s`: also report `arrival_rate_short_rps` over this (panic) window.
    """

    def __init__(
        self,
        settings_or_url: PrometheusSettingsLike | str,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        client: QueryClient | None = None,
        timeout_s: float | None = None,
        model_label: str | None = None,
        retries: int = 0,
        accept_escaped: bool = True,
        short_window_s: float | None = None,
    ) -> None:
        if isinstance(settings_or_url, str):
            url, disable_ssl = settings_or_url, False
            label = model_label or DEFAULT_MODEL_LABEL
            timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        else:
            s = settings_or_url
            url, disable_ssl = s.url, s.disable_ssl
            label = model_label or s.model_label
            timeout = s.timeout_s if timeout_s is None else timeout_s
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url: str = url.rstrip("/")
        self.window_s: float = float(window_s)
        self.timeout_s: float = float(timeout)
        self.model_label: str = label
        self.queries: TickQueries = build_queries(
            label, self.window_s, accept_escaped=accept_escaped, short_window_s=short_window_s
        )
        self._client: QueryClient = client or _default_client(
            self.url, self.timeout_s, disable_ssl, retries
        )
        self._per_call_timeout = _takes_timeout(self._client)
        self.queries_last_tick: int = 0
        """Queries sent by the latest `observe` call (counted even when it failed)."""
        self.queries_total: int = 0
        """Queries sent since construction."""

    # --- querying ---------------------------------------------------------------------

    def _query(self, query: str, eval_time_s: float) -> list[tuple[dict[str, str], float]]:
        """Run one instant query at `eval_time_s`; return (labels, value) pairs.

        Raises SourceError for anything that is not an instant vector of numbers.
        """
        params = {"time": f"{eval_time_s:.3f}", "timeout": f"{self.timeout_s:g}"}
        self.queries_last_tick += 1
        self.queries_total += 1
        kwargs: dict[str, Any] = {"timeout": self.timeout_s} if self._per_call_timeout else {}
        try:
            raw = self._client.custom_query(query, params=params, **kwargs)
        except Exception as exc:  # any failure of the client means "cannot read the source"
            raise SourceError(f"query failed: {type(exc).__name__}: {exc}", query=query) from exc
        return _parse_vector(raw, query)

    # --- MetricSource -------------------------------------------------------------------

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        """Observe `models` as of `now_s` (unix seconds; every query is evaluated there).

        Returns one entry per requested model: an `Observation`, or a `NoDataError` when
        its demand signal is missing or not finite. Raises `SourceError` when any query
        cannot be read (the tick then has no trustworthy data at all). Series of models
        not in `models` are ignored.
        """
        if not math.isfinite(now_s):
            raise ValueError(f"now_s must be finite, got {now_s}")
        self.queries_last_tick = 0
        wanted = {m.name: m for m in models}
        if not wanted:
            return {}
        answers = {name: self._query(q, now_s) for name, q in self.queries.items()}

        label = self.model_label
        demand = _by_signal(answers["demand"], label)
        state = _by_signal(answers["state"], label)
        rates = _by_signal(answers["rates"], label)
        means = _by_signal(answers["token_means"], label)
        hist = {
            name: _buckets_by_model(answers[name], label)
            for name, _ in self.queries.items()
            if name.endswith("_buckets")
        }

        out: dict[str, ObservationResult] = {}
        for name, mq in wanted.items():
            raw_arrival = demand[Signal.ARRIVAL_RPS].get(name)
            arrival = finite_or_none(raw_arrival)
            if arrival is None:
                detail = "absent from the answer" if raw_arrival is None else f"{raw_arrival}"
                out[name] = NoDataError(name, DEMAND_SIGNAL, detail)
                continue
            out[name] = self._observation(
                mq, now_s, max(0.0, arrival), demand, state, rates, means, hist
            )
        return out

    def _observation(
        self,
        mq: ModelQuery,
        now_s: float,
        arrival_rps: float,
        demand: Mapping[str, Mapping[str, float]],
        state: Mapping[str, Mapping[str, float]],
        rates: Mapping[str, Mapping[str, float]],
        means: Mapping[str, Mapping[str, float]],
        hist: Mapping[str, Mapping[str, Buckets]],
    ) -> Observation:
        name = mq.name

        def sig(table: Mapping[str, Mapping[str, float]], signal: Signal) -> float | None:
            return finite_or_none(table[signal].get(name))

        def quantile(hist_name: str, q: float, scale: float = 1.0) -> float | None:
            value = histogram_quantile(q, hist[hist_name].get(name, []))
            value = finite_or_none(value)
            return None if value is None else value * scale

        def attainment(hist_name: str, sla_s: float | None) -> float | None:
            buckets = hist[hist_name].get(name)
            if sla_s is None or not buckets:
                return None
            return finite_or_none(fraction_le(sla_s, buckets))

        sample_ts = [
            t
            for t in (sig(state, Signal.GAUGE_SAMPLE_TS), sig(state, Signal.COUNTER_SAMPLE_TS))
            if t is not None
        ]
        # The demand answer needs counter samples inside the window, so the window is a
        # safe upper bound on their age when no timestamp came back.
        staleness_s = max(0.0, now_s - max(sample_ts)) if sample_ts else self.window_s
        ready = sig(state, Signal.READY_REPLICAS)
        extra: dict[str, float] = {}
        completions = sig(demand, Signal.COMPLETIONS_RPS)
        if completions is not None:
            extra["completions_rps"] = completions
        return Observation(
            model=name,
            observed_at_s=now_s,
            arrival_rate_rps=arrival_rps,
            arrival_rate_short_rps=_non_negative(sig(demand, Signal.ARRIVAL_SHORT_RPS)),
            staleness_s=staleness_s,
            prompt_tokens_mean=sig(means, Signal.PROMPT_TOKENS_MEAN),
            prompt_tokens_p95=quantile("prompt_tokens_buckets", 0.95),
            output_tokens_mean=sig(means, Signal.OUTPUT_TOKENS_MEAN),
            output_tokens_p95=quantile("output_tokens_buckets", 0.95),
            itl_p95_ms=quantile("itl_buckets", 0.95, 1000.0),
            ttft_p95_ms=quantile("ttft_buckets", 0.95, 1000.0),
            e2e_p99_ms=quantile("e2e_buckets", 0.99, 1000.0),
            queue_time_p95_ms=quantile("queue_buckets", 0.95, 1000.0),
            ttft_attainment_frac=attainment("ttft_buckets", mq.ttft_sla_s),
            itl_attainment_frac=attainment("itl_buckets", mq.itl_sla_s),
            running=sig(state, Signal.RUNNING),
            waiting=sig(state, Signal.WAITING),
            kv_usage_frac=sig(state, Signal.KV_USAGE_FRAC),
            prefix_cache_hit_frac=sig(rates, Signal.PREFIX_CACHE_HIT_FRAC),
            preemption_rate_per_s=sig(rates, Signal.PREEMPTION_RATE_PER_S),
            ready_replicas=None if ready is None else round(ready),
            extra=extra,
        )


def _non_negative(value: float | None) -> float | None:
    return None if value is None else max(0.0, value)


# --- answer parsing ---------------------------------------------------------------------


def _parse_vector(raw: Any, query: str) -> list[tuple[dict[str, str], float]]:
    """Validate a query API `data.result` as an instant vector; (labels, value) pairs.

    Values are parsed as floats, so "NaN", "+Inf" and "-Inf" come back as such (the
    caller decides what non-finite means); anything else malformed is a SourceError.
    """
    if not isinstance(raw, list):
        raise SourceError(
            f"malformed answer: expected an instant vector (list), got {type(raw).__name__}",
            query=query,
        )
    out: list[tuple[dict[str, str], float]] = []
    for item in raw:
        try:
            metric = item["metric"]
            _ts, value = item["value"]
            if not isinstance(metric, dict) or not isinstance(value, str | int | float):
                raise TypeError("metric must be an object and value a number")
            out.append(({str(k): str(v) for k, v in metric.items()}, float(value)))
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceError(
                f"malformed sample {str(item)[:200]!r}: {type(exc).__name__}: {exc}",
                query=query,
            ) from exc
    return out


def _by_signal(
    samples: list[tuple[dict[str, str], float]], model_label: str
) -> defaultdict[str, dict[str, float]]:
    """signal -> model -> value for a multi-signal (tagged) answer."""
    table: defaultdict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in samples:
        model, signal = labels.get(model_label), labels.get(SIGNAL_LABEL)
        if model is not None and signal is not None:
            table[signal][model] = value
    return table


def _buckets_by_model(
    samples: list[tuple[dict[str, str], float]], model_label: str
) -> dict[str, Buckets]:
    """model -> cumulative buckets (bound, rate) sorted by bound, PromQL-style cleaned.

    Buckets with the same bound are summed; counts are made monotonic (running maximum,
    as PromQL does against float noise in rates). A model with any non-finite bucket
    gets no buckets at all (no data, not a wrong quantile).
    """
    raw: defaultdict[str, defaultdict[float, float]] = defaultdict(lambda: defaultdict(float))
    for labels, value in samples:
        model, le = labels.get(model_label), labels.get("le")
        if model is None or le is None:
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        if math.isnan(bound):
            continue
        raw[model][bound] += value
    out: dict[str, Buckets] = {}
    for model, by_bound in raw.items():
        if not all(math.isfinite(v) for v in by_bound.values()):
            continue
        buckets: Buckets = []
        running_max = 0.0
        for bound in sorted(by_bound):
            running_max = max(running_max, by_bound[bound])
            buckets.append((bound, running_max))
        out[model] = buckets
    return out
