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
from collections.abc import Mapping, Sequence
from types import MappingProxyType
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

    def _query(self, query: str, eval_time_s: float) -> Any:
        """Run one instant query at `eval_time_s`; return the client's answer, unchecked
        (the caller parses it: `_parse_tagged` or `_parse_buckets`).

        Raises SourceError when the client fails.
        """
        params = {"time": f"{eval_time_s:.3f}", "timeout": f"{self.timeout_s:g}"}
        self.queries_last_tick += 1
        self.queries_total += 1
        kwargs: dict[str, Any] = {"timeout": self.timeout_s} if self._per_call_timeout else {}
        try:
            return self._client.custom_query(query, params=params, **kwargs)
        except Exception as exc:  # any failure of the client means "cannot read the source"
            raise SourceError(f"query failed: {type(exc).__name__}: {exc}", query=query) from exc

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
        label = self.model_label
        tagged: dict[str, SignalTable] = {}
        hist: dict[str, dict[str, Buckets]] = {}
        # Each answer is parsed as soon as it arrives (and dropped): a malformed one stops
        # the tick before the next query, and only one decoded answer is alive at a time.
        for name, query in self.queries.items():
            raw = self._query(query, now_s)
            if name.endswith("_buckets"):
                hist[name] = _parse_buckets(raw, query, label)
            else:
                tagged[name] = _parse_tagged(raw, query, label)
            del raw
        t = _Tables(
            demand=tagged["demand"],
            state=tagged["state"],
            rates=tagged["rates"],
            means=tagged["token_means"],
            hist=hist,
        )
        out: dict[str, ObservationResult] = {}
        for name, mq in wanted.items():
            raw_arrival = t.arrival.get(name)
            arrival = finite_or_none(raw_arrival)
            if arrival is None:
                detail = "absent from the answer" if raw_arrival is None else f"{raw_arrival}"
                out[name] = NoDataError(name, DEMAND_SIGNAL, detail)
                continue
            out[name] = self._observation(mq, now_s, max(0.0, arrival), t)
        return out

    def _observation(
        self, mq: ModelQuery, now_s: float, arrival_rps: float, t: _Tables
    ) -> Observation:
        name = mq.name

        def quantile(buckets: Buckets | None, q: float, scale: float = 1.0) -> float | None:
            value = finite_or_none(histogram_quantile(q, buckets or []))
            return None if value is None else value * scale

        def attainment(buckets: Buckets | None, sla_s: float | None) -> float | None:
            if sla_s is None or not buckets:
                return None
            return finite_or_none(fraction_le(sla_s, buckets))

        gauge_ts = finite_or_none(t.gauge_ts.get(name))
        counter_ts = finite_or_none(t.counter_ts.get(name))
        newest = max(
            -math.inf if gauge_ts is None else gauge_ts,
            -math.inf if counter_ts is None else counter_ts,
        )
        # The demand answer needs counter samples inside the window, so the window is a
        # safe upper bound on their age when no timestamp came back.
        staleness_s = max(0.0, now_s - newest) if newest != -math.inf else self.window_s
        ready = finite_or_none(t.ready.get(name))
        extra: dict[str, float] = {}
        completions = finite_or_none(t.completions.get(name))
        if completions is not None:
            extra["completions_rps"] = completions
        ttft = t.ttft.get(name)
        itl = t.itl.get(name)
        return Observation(
            model=name,
            observed_at_s=now_s,
            arrival_rate_rps=arrival_rps,
            arrival_rate_short_rps=_non_negative(finite_or_none(t.arrival_short.get(name))),
            staleness_s=staleness_s,
            prompt_tokens_mean=finite_or_none(t.prompt_mean.get(name)),
            prompt_tokens_p95=quantile(t.prompt.get(name), 0.95),
            output_tokens_mean=finite_or_none(t.output_mean.get(name)),
            output_tokens_p95=quantile(t.output.get(name), 0.95),
            itl_p95_ms=quantile(itl, 0.95, 1000.0),
            ttft_p95_ms=quantile(ttft, 0.95, 1000.0),
            e2e_p99_ms=quantile(t.e2e.get(name), 0.99, 1000.0),
            queue_time_p95_ms=quantile(t.queue.get(name), 0.95, 1000.0),
            ttft_attainment_frac=attainment(ttft, mq.ttft_sla_s),
            itl_attainment_frac=attainment(itl, mq.itl_sla_s),
            running=finite_or_none(t.running.get(name)),
            waiting=finite_or_none(t.waiting.get(name)),
            kv_usage_frac=finite_or_none(t.kv_usage.get(name)),
            prefix_cache_hit_frac=finite_or_none(t.prefix_hit.get(name)),
            preemption_rate_per_s=finite_or_none(t.preemptions.get(name)),
            ready_replicas=None if ready is None else round(ready),
            extra=extra,
        )


def _non_negative(value: float | None) -> float | None:
    return None if value is None else max(0.0, value)


# --- answer parsing ---------------------------------------------------------------------


SignalTable = dict[str, dict[str, float]]
"""signal -> model -> value, from one tagged (multi-signal) answer."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_NUMBER = (str, int, float)
_LE_CACHE: dict[str, float | None] = {}
_LE_CACHE_MAX = 4096  # distinct `le` strings are few (tens); bound it anyway


class _Tables:
    """Every answer of one tick, indexed once per tick for per-model lookups.

    Signal names are plain strings here: a dict lookup by a `StrEnum` member hashes
    through `Enum.__hash__` (a Python call), three times slower than by its value.
    """

    __slots__ = (
        "arrival",
        "arrival_short",
        "completions",
        "counter_ts",
        "e2e",
        "gauge_ts",
        "itl",
        "kv_usage",
        "output",
        "output_mean",
        "preemptions",
        "prefix_hit",
        "prompt",
        "prompt_mean",
        "queue",
        "ready",
        "running",
        "ttft",
        "waiting",
    )

    def __init__(
        self,
        *,
        demand: SignalTable,
        state: SignalTable,
        rates: SignalTable,
        means: SignalTable,
        hist: Mapping[str, Mapping[str, Buckets]],
    ) -> None:
        def col(table: SignalTable, signal: Signal) -> Mapping[str, float]:
            return table.get(signal.value, _EMPTY)

        self.arrival = col(demand, Signal.ARRIVAL_RPS)
        self.arrival_short = col(demand, Signal.ARRIVAL_SHORT_RPS)
        self.completions = col(demand, Signal.COMPLETIONS_RPS)
        self.running = col(state, Signal.RUNNING)
        self.waiting = col(state, Signal.WAITING)
        self.kv_usage = col(state, Signal.KV_USAGE_FRAC)
        self.ready = col(state, Signal.READY_REPLICAS)
        self.gauge_ts = col(state, Signal.GAUGE_SAMPLE_TS)
        self.counter_ts = col(state, Signal.COUNTER_SAMPLE_TS)
        self.prefix_hit = col(rates, Signal.PREFIX_CACHE_HIT_FRAC)
        self.preemptions = col(rates, Signal.PREEMPTION_RATE_PER_S)
        self.prompt_mean = col(means, Signal.PROMPT_TOKENS_MEAN)
        self.output_mean = col(means, Signal.OUTPUT_TOKENS_MEAN)
        self.ttft = hist.get("ttft_buckets", _EMPTY)
        self.itl = hist.get("itl_buckets", _EMPTY)
        self.e2e = hist.get("e2e_buckets", _EMPTY)
        self.queue = hist.get("queue_buckets", _EMPTY)
        self.prompt = hist.get("prompt_tokens_buckets", _EMPTY)
        self.output = hist.get("output_tokens_buckets", _EMPTY)


def _not_a_vector(raw: Any, query: str) -> SourceError:
    return SourceError(
        f"malformed answer: expected an instant vector (list), got {type(raw).__name__}",
        query=query,
    )


def _malformed(item: Any, exc: Exception, query: str) -> SourceError:
    return SourceError(
        f"malformed sample {str(item)[:200]!r}: {type(exc).__name__}: {exc}", query=query
    )


def _label(metric: dict[Any, Any], name: str) -> str | None:
    value = metric.get(name)
    return value if value is None or value.__class__ is str else str(value)


# The two parsers below validate every sample the same way, inline (they run once per
# series: 124 series per model per tick). A sample is malformed (SourceError naming the
# query) unless it is {"metric": {labels}, "value": [timestamp, number or string]} and
# the value parses as a float; "NaN", "+Inf" and "-Inf" come back as such (the caller
# decides what non-finite means).


def _sample(item: Any, query: str) -> tuple[dict[str, str], float]:
    """One instant-vector sample as (labels, value); SourceError naming the query when
    it is malformed."""
    try:
        metric = item["metric"]
        _ts, value = item["value"]
        if not isinstance(metric, dict) or not isinstance(value, _NUMBER):
            raise TypeError("metric must be an object and value a number")
        return metric, float(value)
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(item, exc, query) from exc


def _parse_tagged(raw: Any, query: str, model_label: str) -> SignalTable:
    """Validate a query API `data.result` as an instant vector and index a tagged
    (multi-signal) answer: signal -> model -> value. Series without both labels are
    skipped."""
    if not isinstance(raw, list):
        raise _not_a_vector(raw, query)
    table: SignalTable = {}
    for item in raw:
        metric, value = _sample(item, query)
        model, signal = _label(metric, model_label), _label(metric, SIGNAL_LABEL)
        if model is not None and signal is not None:
            column = table.get(signal)
            if column is None:
                column = table[signal] = {}
            column[model] = value
    return table


def _le_bound(le: str) -> float | None:
    """The `le` label as a float bound; None when it does not parse or is NaN.
    Memoized: a tick parses ~20 distinct `le` strings 100,000 times at 1,000 models."""
    bound = _LE_CACHE.get(le, _LE_CACHE)
    if bound is not _LE_CACHE:
        return bound  # type: ignore[return-value]
    try:
        parsed: float | None = float(le)
    except ValueError:
        parsed = None
    if parsed is not None and math.isnan(parsed):
        parsed = None
    if len(_LE_CACHE) < _LE_CACHE_MAX:
        _LE_CACHE[le] = parsed
    return parsed


def _parse_buckets(raw: Any, query: str, model_label: str) -> dict[str, Buckets]:
    """Validate a bucket-rate answer (as `_parse_tagged`) and index it: model ->
    cumulative buckets (bound, rate) sorted by bound, PromQL-style cleaned.

    Buckets with the same bound are summed; counts are made monotonic (running maximum,
    as PromQL does against float noise in rates). A model with any non-finite bucket
    gets no buckets at all (no data, not a wrong quantile).
    """
    if not isinstance(raw, list):
        raise _not_a_vector(raw, query)
    by_model: dict[str, dict[float, float]] = {}
    cached = _LE_CACHE.get
    for item in raw:
        metric, value = _sample(item, query)
        model = metric.get(model_label)
        le = metric.get("le")
        if model is None or le is None:
            continue
        if model.__class__ is not str:
            model = str(model)
        if le.__class__ is not str:
            le = str(le)
        bound = cached(le, _LE_CACHE)
        if bound is _LE_CACHE:
            bound = _le_bound(le)
        if bound is None:
            continue
        by_bound = by_model.get(model)
        if by_bound is None:
            by_bound = by_model[model] = {}
        by_bound[bound] = by_bound.get(bound, 0.0) + value
    out: dict[str, Buckets] = {}
    isfinite = math.isfinite
    for model, by_bound in by_model.items():
        buckets: Buckets = []
        running_max = 0.0
        for bound in sorted(by_bound):
            count = by_bound[bound]
            if not isfinite(count):
                break
            if count > running_max:
                running_max = count
            buckets.append((bound, running_max))
        else:
            out[model] = buckets
    return out
