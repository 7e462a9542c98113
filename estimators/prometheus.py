"""`PrometheusSource`: the `MetricSource` that reads vLLM signals from Prometheus.

This module owns running the queries of `estimators.promql` against a Prometheus HTTP
API (through `prometheus_api_client.PrometheusConnect`, injectable) and turning the
answers into typed per-model outcomes:

- every query of a tick is evaluated at ONE evaluation time (`time=now_s`), so the
  signals of an observation describe the same instant;
- the number of queries per tick is constant in the number of models
  (`len(list(source.queries.items()))`, eight), recorded in `queries_last_tick`;
- the backend unreadable (HTTP error, timeout, connection refused, non-JSON, a result
  that is not an instant vector of numbers) -> `SourceError` carrying the query;
- a model without a finite arrival rate -> `NoDataError(model, "arrival_rate")`; a model
  whose engine scrape targets (seen within the lookback) are all down (no successful
  scrape within two scrape intervals: one missed scrape is not a dead target) or gone
  from service discovery -> `NoDataError(model, "targets_up")`;
  a model without a current sample, or whose newest sample is older than
  `max_staleness_s` (when set) -> `NoDataError(model, "staleness")`: a dead fleet is
  never read as an idle one (its rates decay to zero over a window while nothing is
  scraped). Other models are observed;
- an optional signal missing, NaN or infinite -> `None`, never 0.

Quantiles are PromQL's own `histogram_quantile`; the exact attainment is
`bucket(le=SLA) / bucket(+Inf)` from the buckets at the SLA thresholds in use (the
source rebuilds that one query when the set of thresholds changes). Both read the bucket
rates the chart's recording rules record, on the ticks whose demand answer carries the
rules' marker (`recording_rules`), and aggregate the raw buckets otherwise.

Units: `now_s`, `window_s`, `timeout_s`, `staleness_s` in seconds (unix seconds for
times); latency quantiles and means are reported in milliseconds; rates per second.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final, Protocol

import orjson

from estimators.histogram import fraction_le
from estimators.promql import (
    DEFAULT_MODEL_LABEL,
    DEFAULT_SEED_WINDOW_S,
    DEFAULT_WINDOW_S,
    DIST_QUANTILES,
    RULES_SIGNAL,
    SIGNAL_LABEL,
    QueryBuilder,
    Signal,
    TickQueries,
    build_queries,
    quantile_signal,
)
from estimators.types import (
    LatencyQuantiles,
    ModelQuery,
    NoDataError,
    Observation,
    ObservationResult,
    SourceError,
    finite_or_none,
)

DEFAULT_TIMEOUT_S: Final = 3.0
DEFAULT_SCRAPE_INTERVAL_S: Final = 15.0
"""How often Prometheus scrapes the engines when nothing says (its common setting), s."""
DEMAND_SIGNAL: Final = "arrival_rate"
"""The signal named in the `NoDataError` of a model without demand data."""
TARGETS_SIGNAL: Final = "targets_up"
"""The signal named in the `NoDataError` of a model whose engine targets are all down."""
STALENESS_SIGNAL: Final = "staleness"
"""The signal named in the `NoDataError` of a model without a current sample."""

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
    @property
    def scrape_interval_s(self) -> float: ...


class QueryClient(Protocol):
    """The part of `PrometheusConnect` the source uses.

    `custom_query` returns the `data.result` list of the query API's JSON answer. When
    its signature has a `timeout` parameter the source passes its HTTP timeout per call.
    """

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


def http_query_client(url: str, timeout_s: float, disable_ssl: bool, retries: int) -> QueryClient:
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
    params = inspect.signature(PrometheusConnect.__init__).parameters
    if "timeout" in params:
        kwargs["timeout"] = timeout_s  # prometheus-api-client >= 0.6
    if "session" in params:
        kwargs["session"] = _orjson_session(verify=not disable_ssl)
    client: QueryClient = PrometheusConnect(**kwargs)
    return client


def _orjson_session(verify: bool) -> Any:
    """A `requests.Session` whose responses decode their JSON body with orjson.

    PrometheusConnect decodes every answer with `response.json()` (the standard json
    module): at 1,000 models a tick's eight answers are ~5 MB, and orjson decodes them
    in ~60 % of the time (benchmarks/bench_tick.py), into the same plain lists, dicts,
    strings and numbers. A body that is not JSON raises `orjson.JSONDecodeError`, a
    `ValueError` like the json module's (the source reports it as a SourceError).
    `verify`: check TLS certificates (PrometheusConnect's own session: not disable_ssl).
    """
    import requests

    session = requests.Session()
    session.verify = verify
    plain = session.request

    def request(*args: Any, **kwargs: Any) -> Any:
        response = plain(*args, **kwargs)
        body = response.content
        response.json = lambda **_kw: orjson.loads(body)
        return response

    session.request = request  # type: ignore[method-assign]
    return session


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
    one takes at most eight queries' time. `client`: injected query client (tests, custom
    auth); it then owns its session settings, and gets the timeout per call when its
    `custom_query` takes one. `retries`: HTTP retries of the default client (no backoff).
    `accept_escaped`: also read `vllm_...` spellings of the `vllm:...` names (promql).
    `short_window_s`: also report `arrival_rate_short_rps` over this (panic) window.
    `seed_window_s`: the window of `arrival_rate_5m_rps` (default 300 s; None: not read).
    `max_staleness_s`: a model whose newest sample is older reads as no data (`governor
    run` passes `policy.max_staleness_s`; None: only a model without any current sample
    is, and the age is left to the caller). `targets_lookback_s`: how long an engine
    target that went down or left discovery still belongs to its model, so that every
    target gone reads as no data (default: the longest window, 5 minutes).
    `recording_rules`: when Prometheus has the chart's recording rules for this window,
    model label and name policy loaded (their marker rides in the demand answer, checked
    on every tick at no extra query), the quantile and SLA-edge queries read the recorded
    bucket rates instead of aggregating the raw buckets afresh for each of 17 quantiles;
    without them, the raw queries (estimators.promql module doc). False: never.
    `scrape_interval_s`: how often Prometheus scrapes the engines (default: the
    settings' `scrape_interval_s`, else 15 s); gauges and targets' `up` are read over two
    of these, so one missed scrape is not a dead target (two in a row are).
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
        seed_window_s: float | None = DEFAULT_SEED_WINDOW_S,
        max_staleness_s: float | None = None,
        targets_lookback_s: float | None = None,
        recording_rules: bool = True,
        scrape_interval_s: float | None = None,
    ) -> None:
        if isinstance(settings_or_url, str):
            url, disable_ssl = settings_or_url, False
            label = model_label or DEFAULT_MODEL_LABEL
            timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
            scrape = scrape_interval_s or DEFAULT_SCRAPE_INTERVAL_S
        else:
            s = settings_or_url
            url, disable_ssl = s.url, s.disable_ssl
            label = model_label or s.model_label
            timeout = s.timeout_s if timeout_s is None else timeout_s
            scrape = scrape_interval_s or s.scrape_interval_s
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if max_staleness_s is not None and not max_staleness_s > 0:  # also refuses NaN
            raise ValueError(f"max_staleness_s must be > 0 seconds, got {max_staleness_s}")
        self.url: str = url.rstrip("/")
        self.window_s: float = float(window_s)
        self.timeout_s: float = float(timeout)
        self.model_label: str = label
        self.max_staleness_s: float | None = max_staleness_s
        self.scrape_interval_s: float = float(scrape)  # engines' scrape, s; lookback: two
        self.recording_rules: bool = recording_rules
        """Read the recorded bucket rates when fitting rules are loaded (see the class doc)."""
        self.rules_in_use: bool = False
        """Whether the latest tick read the recording rules' series."""
        self._builders: dict[bool, QueryBuilder] = {}
        self._by_mode: dict[bool, TickQueries] = {}
        for recorded in (False, True):
            self._builders[recorded] = QueryBuilder(
                label,
                self.window_s,
                accept_escaped,
                short_window_s,
                seed_window_s,
                targets_lookback_s,
                recorded,
                2.0 * scrape,
            )
            self._by_mode[recorded] = build_queries(
                label,
                self.window_s,
                accept_escaped=accept_escaped,
                short_window_s=short_window_s,
                seed_window_s=seed_window_s,
                targets_lookback_s=targets_lookback_s,
                recorded=recorded,
                rules_marker=recording_rules,
                gauge_lookback_s=2.0 * scrape,
            )
        self._edges: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
        self.queries: TickQueries = self._by_mode[False]
        """The queries of the latest tick (`sla_buckets` follows the models' SLAs; the
        quantile and SLA-edge queries follow `rules_in_use`)."""
        self._client: QueryClient = client or http_query_client(
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
        (the caller parses it: `_parse_tagged` or `_parse_edge_buckets`).

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

    def _follow_slas(self, models: Sequence[ModelQuery]) -> None:
        """Rebuild the SLA-edge query when the set of SLA thresholds changed: TTFT
        thresholds for the TTFT buckets, ITL thresholds for the ITL and TPOT buckets."""
        ttft = tuple(sorted({m.ttft_sla_s for m in models if m.ttft_sla_s is not None}))
        itl = tuple(sorted({m.itl_sla_s for m in models if m.itl_sla_s is not None}))
        if (ttft, itl) != self._edges:
            self._edges = (ttft, itl)
            edges = {"ttft": ttft, "itl": itl, "tpot": itl}
            for recorded, builder in self._builders.items():
                self._by_mode[recorded] = replace(
                    self._by_mode[recorded], sla_buckets=builder.edge_buckets(edges)
                )
            self.queries = self._by_mode[self.rules_in_use]

    def _follow_rules(self, demand: SignalTable) -> None:
        """Read the recorded series from the next query on when the demand answer carries
        the rules' marker, the raw buckets when it does not (rules removed, or never
        loaded): decided on every tick, so a tick never reads series that are gone."""
        present = self.recording_rules and RULES_SIGNAL in demand
        if present != self.rules_in_use:
            self.rules_in_use = present
            self.queries = self._by_mode[present]

    # --- MetricSource -------------------------------------------------------------------

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        """Observe `models` as of `now_s` (unix seconds; every query is evaluated there).

        Returns one entry per requested model: an `Observation`, or a `NoDataError` when
        its demand signal is missing or not finite, its engine targets are all down, or
        its data is stale (module docstring). Raises `SourceError` when any query cannot
        be read (the tick then has no trustworthy data at all). Series of models not in
        `models` are ignored.
        """
        if not math.isfinite(now_s):
            raise ValueError(f"now_s must be finite, got {now_s}")
        self.queries_last_tick = 0
        wanted = {m.name: m for m in models}
        if not wanted:
            return {}
        self._follow_slas(models)
        label = self.model_label
        tagged: dict[str, SignalTable] = {}
        edges: dict[str, dict[str, Buckets]] = {}
        # Each answer is parsed as soon as it arrives (and dropped): a malformed one stops
        # the tick before the next query, and only one decoded answer is alive at a time.
        for name in [name for name, _query in self.queries.items()]:  # demand first
            query = getattr(self.queries, name)  # after demand: as `_follow_rules` says
            raw = self._query(query, now_s)
            if name == "sla_buckets":
                edges = _parse_edge_buckets(raw, query, label)
            elif name.endswith("_quantiles"):  # distinct tags: one table for all four
                tagged.setdefault("quantiles", {}).update(_parse_tagged(raw, query, label))
            else:
                tagged[name] = _parse_tagged(raw, query, label)
                if name == "demand":
                    self._follow_rules(tagged[name])
            del raw
        t = _Tables(tagged, edges)
        out: dict[str, ObservationResult] = {}
        for name, mq in wanted.items():
            out[name] = self._outcome(mq, now_s, t)
        return out

    def _outcome(self, mq: ModelQuery, now_s: float, t: _Tables) -> ObservationResult:
        """One model's Observation, or the NoDataError that says why there is none."""
        name = mq.name
        raw_arrival = t.arrival.get(name)
        arrival = finite_or_none(raw_arrival)
        if arrival is None:
            detail = "absent from the answer" if raw_arrival is None else f"{raw_arrival}"
            return NoDataError(name, DEMAND_SIGNAL, detail)
        up = t.targets_up.get(name)
        known = t.targets_known.get(name)
        seen = t.targets_seen.get(name)
        if seen is None:
            seen = known
        if seen and not up:  # up 0, or no `up` series left: down or gone, every one
            detail = f"every engine scrape target is down or gone (0 of {seen} up)"
            return NoDataError(name, TARGETS_SIGNAL, detail)
        gauge_ts = t.gauge_ts.get(name)
        counter_ts = t.counter_ts.get(name)
        stamps = [ts for ts in (gauge_ts, counter_ts) if ts is not None]
        if not stamps:
            detail = "no current sample: every engine series is stale (targets down or gone)"
            return NoDataError(name, STALENESS_SIGNAL, detail)
        staleness_s = max(0.0, now_s - max(stamps))
        if self.max_staleness_s is not None and staleness_s > self.max_staleness_s:
            detail = f"newest sample {staleness_s:.1f} s old (limit {self.max_staleness_s:g} s)"
            return NoDataError(name, STALENESS_SIGNAL, detail)
        return _observation(mq, now_s, max(0.0, arrival), staleness_s, t, up, known)


Column = dict[str, float]
"""model -> value of one signal, finite values only (see `_Tables`)."""


def _attainment(by_model: Mapping[str, Buckets], name: str, sla_s: float | None) -> float | None:
    buckets = by_model.get(name)
    if sla_s is None or not buckets:
        return None
    return finite_or_none(fraction_le(sla_s, buckets))


def _observation(
    mq: ModelQuery,
    now_s: float,
    arrival_rps: float,
    staleness_s: float,
    t: _Tables,
    up: int | None,
    known: int | None,
) -> Observation:
    """One model's Observation from the tick's cleaned columns: every lookup a plain
    dict get (this runs once per model per tick; the cleaning ran once per column)."""
    name = mq.name
    ttft, itl, e2e = t.ttft_dist.get(name), t.itl_dist.get(name), t.e2e_dist.get(name)
    completions = t.completions.get(name)
    return Observation(
        model=name,
        observed_at_s=now_s,
        arrival_rate_rps=arrival_rps,
        arrival_rate_short_rps=t.arrival_short.get(name),
        staleness_s=staleness_s,
        prompt_tokens_mean=t.prompt_mean.get(name),
        prompt_tokens_p95=t.prompt_p95.get(name),
        output_tokens_mean=t.output_mean.get(name),
        output_tokens_p95=t.output_p95.get(name),
        itl_p95_ms=None if itl is None else itl.p95_ms,
        ttft_p95_ms=None if ttft is None else ttft.p95_ms,
        e2e_p99_ms=None if e2e is None else e2e.p99_ms,
        queue_time_p95_ms=t.queue_p95_ms.get(name),
        ttft_attainment_frac=_attainment(t.ttft_edges, name, mq.ttft_sla_s),
        itl_attainment_frac=_attainment(t.itl_edges, name, mq.itl_sla_s),
        running=t.running.get(name),
        waiting=t.waiting.get(name),
        kv_usage_frac=t.kv_usage.get(name),
        prefix_cache_hit_frac=t.prefix_hit.get(name),
        preemption_rate_per_s=t.preemptions.get(name),
        ready_replicas=t.ready.get(name),
        arrival_rate_5m_rps=t.arrival_seed.get(name),
        decode_time_p95_ms=t.decode_p95_ms.get(name),
        decode_time_mean_ms=t.decode_mean_ms.get(name),
        prefill_time_mean_ms=t.prefill_mean_ms.get(name),
        tpot_p95_ms=t.tpot_p95_ms.get(name),
        tpot_attainment_frac=_attainment(t.tpot_edges, name, mq.itl_sla_s),
        itl_mean_ms=t.itl_mean_ms.get(name),
        ttft_mean_ms=t.ttft_mean_ms.get(name),
        step_tokens_mean=t.step_tokens_mean.get(name),
        ttft_dist=ttft,
        itl_dist=itl,
        e2e_dist=e2e,
        targets_up=up,
        targets_down=None if known is None or up is None else max(0, known - up),
        extra={} if completions is None else {"completions_rps": completions},
    )


# --- answer parsing ---------------------------------------------------------------------


SignalTable = dict[str, dict[str, float]]
"""signal -> model -> value, from one tagged (multi-signal) answer."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_NUMBER = (str, int, float)
_LE_CACHE: dict[str, float | None] = {}
_LE_CACHE_MAX = 4096  # distinct `le` strings are few (tens); bound it anyway


def _finite(table: SignalTable, signal: str, scale: float = 1.0) -> Column:
    """The finite values of one signal (`v - v` is NaN for NaN and +-Inf), times `scale`."""
    col = table.get(signal)
    if not col:
        return {}
    if scale == 1.0:
        return {m: v for m, v in col.items() if v - v == 0.0}
    return {m: v * scale for m, v in col.items() if v - v == 0.0}


def _counts(table: SignalTable, signal: str) -> dict[str, int]:
    return {m: round(v) for m, v in _finite(table, signal).items()}


def _non_negative(table: SignalTable, signal: str) -> Column:
    return {m: (v if v > 0.0 else 0.0) for m, v in _finite(table, signal).items()}


def _dists(q: SignalTable, hist: str) -> dict[str, LatencyQuantiles]:
    """model -> p50/p90/p95/p99 of histogram `hist` in ms, for models with any of them."""
    c50, c90, c95, c99 = (_finite(q, quantile_signal(hist, p), 1000.0) for p in DIST_QUANTILES)
    models = c50.keys() | c90.keys() | c95.keys() | c99.keys()
    return {m: LatencyQuantiles(c50.get(m), c90.get(m), c95.get(m), c99.get(m)) for m in models}


class _Tables:
    """Every answer of one tick as cleaned columns (model -> value per signal): non-finite
    values dropped (no data, never 0), latencies converted to ms, counts rounded. Built
    once per tick, so `_observation` only does plain dict gets per model.

    Signal names are plain strings here: a dict lookup by a `StrEnum` member hashes
    through `Enum.__hash__` (a Python call), three times slower than by its value.
    """

    def __init__(self, tagged: Mapping[str, SignalTable], edges: dict[str, dict[str, Buckets]]):
        demand = tagged.get("demand", {})
        state = tagged.get("state", {})
        rates = tagged.get("rates", {})
        q = tagged.get("quantiles", {})
        self.arrival = demand.get(Signal.ARRIVAL_RPS.value, _EMPTY)  # raw: NaN is reported
        self.arrival_short = _non_negative(demand, Signal.ARRIVAL_SHORT_RPS.value)
        self.arrival_seed = _non_negative(demand, Signal.ARRIVAL_SEED_RPS.value)
        self.completions = _finite(demand, Signal.COMPLETIONS_RPS.value)
        self.running = _finite(state, Signal.RUNNING.value)
        self.waiting = _finite(state, Signal.WAITING.value)
        self.kv_usage = _finite(state, Signal.KV_USAGE_FRAC.value)
        self.ready = _counts(state, Signal.READY_REPLICAS.value)
        self.gauge_ts = _finite(state, Signal.GAUGE_SAMPLE_TS.value)
        self.counter_ts = _finite(state, Signal.COUNTER_SAMPLE_TS.value)
        self.targets_up = _counts(state, Signal.TARGETS_UP.value)
        self.targets_known = _counts(state, Signal.TARGETS_KNOWN.value)
        self.targets_seen = _counts(state, Signal.TARGETS_SEEN.value)
        self.prefix_hit = _finite(rates, Signal.PREFIX_CACHE_HIT_FRAC.value)
        self.preemptions = _finite(rates, Signal.PREEMPTION_RATE_PER_S.value)
        self.prompt_mean = _finite(rates, Signal.PROMPT_TOKENS_MEAN.value)
        self.output_mean = _finite(rates, Signal.OUTPUT_TOKENS_MEAN.value)
        self.ttft_mean_ms = _finite(rates, Signal.TTFT_MEAN_S.value, 1000.0)
        self.itl_mean_ms = _finite(rates, Signal.ITL_MEAN_S.value, 1000.0)
        self.decode_mean_ms = _finite(rates, Signal.DECODE_TIME_MEAN_S.value, 1000.0)
        self.prefill_mean_ms = _finite(rates, Signal.PREFILL_TIME_MEAN_S.value, 1000.0)
        self.step_tokens_mean = _finite(rates, Signal.STEP_TOKENS_MEAN.value)
        self.ttft_dist = _dists(q, "ttft")
        self.itl_dist = _dists(q, "itl")
        self.e2e_dist = _dists(q, "e2e")
        self.queue_p95_ms = _finite(q, quantile_signal("queue", 0.95), 1000.0)
        self.decode_p95_ms = _finite(q, quantile_signal("decode", 0.95), 1000.0)
        self.tpot_p95_ms = _finite(q, quantile_signal("tpot", 0.95), 1000.0)
        self.prompt_p95 = _finite(q, quantile_signal("prompt_tokens", 0.95))
        self.output_p95 = _finite(q, quantile_signal("output_tokens", 0.95))
        self.ttft_edges = edges.get("ttft", _EMPTY)
        self.itl_edges = edges.get("itl", _EMPTY)
        self.tpot_edges = edges.get("tpot", _EMPTY)


def _not_a_vector(raw: Any, query: str) -> SourceError:
    return SourceError(
        f"malformed answer: expected an instant vector (list), got {type(raw).__name__}",
        query=query,
    )


def _malformed(item: Any, exc: Exception, query: str) -> SourceError:
    return SourceError(
        f"malformed sample {str(item)[:200]!r}: {type(exc).__name__}: {exc}", query=query
    )


# The two parsers below validate every sample the same way. A sample is malformed
# (SourceError naming the query) unless it is {"metric": {labels}, "value": [timestamp,
# number or string]} and the value parses as a float; "NaN", "+Inf" and "-Inf" come back
# as such (the caller decides what non-finite means).


def _parse_tagged(raw: Any, query: str, model_label: str) -> SignalTable:
    """Validate a query API `data.result` as an instant vector and index a tagged
    (multi-signal) answer: signal -> model -> value. Series without both labels are
    skipped."""
    return _index(raw, query, model_label, by_le=False)  # type: ignore[return-value]


def _index(raw: Any, query: str, model_label: str, by_le: bool) -> dict[str, dict[str, Any]]:
    """The one pass over an answer both parsers share: signal -> model -> value, or with
    `by_le` signal -> model -> {bucket bound: summed value} (series without a numeric
    `le` skipped). The validation (comment above) is inlined: this runs once per series
    (about 40 per model per tick)."""
    if not isinstance(raw, list):
        raise _not_a_vector(raw, query)
    table: dict[str, dict[str, Any]] = {}
    for item in raw:
        try:
            metric = item["metric"]
            _ts, value = item["value"]
            if (metric.__class__ is not dict or value.__class__ is not str) and (
                not isinstance(metric, dict) or not isinstance(value, _NUMBER)
            ):
                raise TypeError("metric must be an object and value a number")
            value = float(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(item, exc, query) from exc
        model = metric.get(model_label)
        signal = metric.get(SIGNAL_LABEL)
        if model is None or signal is None:
            continue
        if model.__class__ is not str:
            model = str(model)
        if signal.__class__ is not str:
            signal = str(signal)
        if by_le:
            le = metric.get("le")
            if le is None:
                continue
            bound = _LE_CACHE.get(le, _LE_CACHE) if le.__class__ is str else _LE_CACHE
            if bound is _LE_CACHE:
                bound = _le_bound(str(le))
            if bound is None:
                continue
        column = table.get(signal)
        if column is None:
            column = table[signal] = {}
        if not by_le:
            column[model] = value
            continue
        by_bound = column.get(model)
        if by_bound is None:
            by_bound = column[model] = {}
        by_bound[bound] = by_bound.get(bound, 0.0) + value
    return table


def _le_bound(le: str) -> float | None:
    """The `le` label as a float bound; None when it does not parse or is NaN (memoized:
    the distinct `le` strings of a fleet are few)."""
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


def _parse_edge_buckets(raw: Any, query: str, model_label: str) -> dict[str, dict[str, Buckets]]:
    """Validate a tagged bucket-rate answer (as `_parse_tagged`) and index it: histogram
    tag -> model -> cumulative buckets (bound, rate) sorted by bound, PromQL-style cleaned.

    Buckets with the same bound are summed; counts are made monotonic (running maximum,
    as PromQL does against float noise in rates). A model with any non-finite bucket of
    a histogram gets no buckets of it at all (no data, not a wrong attainment). Series
    without the model label, the tag or a numeric `le` are skipped.
    """
    acc: dict[str, dict[str, dict[float, float]]] = _index(raw, query, model_label, by_le=True)
    out: dict[str, dict[str, Buckets]] = {}
    for hist, by_model in acc.items():
        column = out[hist] = {}
        for model, by_bound in by_model.items():
            buckets: Buckets = []
            running_max = 0.0
            for bound in sorted(by_bound):
                count = by_bound[bound]
                if count - count != 0.0:  # NaN or +-Inf
                    break
                if count > running_max:
                    running_max = count
                buckets.append((bound, running_max))
            else:
                column[model] = buckets
    return out
