"""`PrometheusSource`: the `MetricSource` that reads vLLM signals from Prometheus.

This module owns running the queries of `estimators.promql` against a Prometheus HTTP
API (through `prometheus_api_client.PrometheusConnect`, injectable; each answer's HTTP
body decoded by `estimators.decode` when the client hands it over) and turning the
answers into typed per-model outcomes:

- every query of a tick is evaluated at ONE evaluation time (`time=now_s`), so the
  signals of an observation describe the same instant; `server_time_s` asks Prometheus
  its own now (`time()` with no `time`), which `governor run` evaluates at (the host's
  clock may be off: service.promclock);
- the number of queries per tick is constant in the number of models
  (`len(list(source.queries.items()))`, eight), recorded in `queries_last_tick`;
- the backend unreadable (HTTP error, timeout, connection refused, non-JSON, a result
  that is not an instant vector, a malformed sample that names no model) ->
  `SourceError` carrying the query; so is an answer whose `warnings` say it misses
  data (`estimators.decode.partial_warnings`: Thanos's partial response, a failed
  remote read), whose sums would miss part of the fleet;
- a model with a malformed sample (estimators.answers), or a second series of a signal
  the outcome is decided on (`DECISIVE`: demand, targets, sample times) ->
  `NoDataError(model, <signal>, <what was wrong>)`, checked first; a duplicated optional
  signal reads as absent. Other models are observed as usual;
- a model whose engine scrape targets (seen within the lookback) are all down (no
  successful scrape within two scrape intervals: one missed scrape is not a dead target)
  or gone from service discovery -> `NoDataError(model, "targets_up")` (checked first, so
  the cause stays the same for the whole lookback while the rate window empties); a
  model without a finite arrival rate -> `NoDataError(model, "arrival_rate")`;
  a model without a current sample, or whose newest sample is older than
  `max_staleness_s` (when set) -> `NoDataError(model, "staleness")`: a dead fleet is
  never read as an idle one (its rates decay to zero over a window while nothing is
  scraped). Other models are observed;
- an optional signal missing, NaN or infinite -> `None`, never 0.

Quantiles are PromQL's own `histogram_quantile`; the exact attainment is
`bucket(le=SLA) / bucket(+Inf)` from the buckets at the SLA thresholds in use (the
source rebuilds that one query when the set of thresholds changes). Both read the bucket
rates the chart's recording rules record, on the ticks whose demand answer carries the
rules' marker (`recording_rules`), and aggregate the raw buckets otherwise. A recorded
series is read only while its newest sample is at most `RULES_MAX_AGE_INTERVALS` scrape
intervals old: a rule that stopped evaluating while the marker is still recorded reads
as no data (None) for its histogram, never as its last values.

Units: `now_s`, `window_s`, `timeout_s`, `staleness_s` in seconds (unix seconds for
times); latency quantiles and means are reported in milliseconds; rates per second.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol

import orjson

from estimators.answers import (
    ARRIVAL,
    COUNTER_TS,
    DUPLICATED,
    EMPTY,
    GAUGE_TS,
    INGRESS,
    TARGETS_KNOWN,
    TARGETS_SEEN,
    TARGETS_UP,
    Answers,
    Buckets,
    Faults,
    Rows,
    ScopeKeys,
    count,
    edge_buckets,
    finite,
    ingress_observation,
    observation,
    parse_edge_buckets,
    parse_tagged,
)
from estimators.deadline import DeadlineAdapter, deadline_session
from estimators.decode import (
    AnswerDecoder,
    PartialAnswerError,
    buckets_from_samples,
    check_warnings,
    rows_from_samples,
)
from estimators.promql import (
    DEFAULT_MODEL_LABEL,
    DEFAULT_NAMESPACE_LABEL,
    DEFAULT_SCRAPE_INTERVAL_S,
    DEFAULT_SEED_WINDOW_S,
    DEFAULT_WINDOW_S,
    RULES_MARKER_MODEL,
    RULES_SIGNAL,
    QueryBuilder,
    TickQueries,
    queries_of,
)
from estimators.types import (
    ModelQuery,
    NoDataError,
    ObservationResult,
    SourceError,
    finite_or_none,
)

DEFAULT_TIMEOUT_S: Final = 3.0
DEFAULT_QUERY_METHOD: Final = "POST"
"""HTTP method of the instant queries (`PrometheusSettings.query_method`): POST sends a
query as a form body, which Prometheus's API takes as it takes the URL's parameters, with
no URL-length limit in a proxy between and ~10 % less client CPU than GET's long URLs
(urllib3 re-checks every character of a URL; measured on a recorded-run replay)."""
RULES_MAX_AGE_INTERVALS: Final = 3.0
"""How many scrape intervals old a recorded bucket series may be and still be read.

The chart evaluates its recording rules once per scrape interval (the group's interval
is the ServiceMonitor's, which `prometheus.scrape_interval_s` must equal). A healthy
rule's newest sample is then at most one interval old plus the group's evaluation time
(under an interval, or Prometheus skips the iteration): under two intervals. Three
tolerate one missed or late evaluation; a rule failing for longer reads as no data
after 45 s at a 15 s interval instead of its last values for 5 minutes."""
SERVER_TIME_QUERY: Final = "time()"
"""The query `server_time_s` asks, without a `time` parameter: Prometheus's own now."""
DEMAND_SIGNAL: Final = "arrival_rate"
"""The signal named in the `NoDataError` of a model without demand data."""
TARGETS_SIGNAL: Final = "targets_up"
"""The signal named in the `NoDataError` of a model whose engine targets are all down."""
STALENESS_SIGNAL: Final = "staleness"
"""The signal named in the `NoDataError` of a model without a current sample."""
FUTURE_STAMP_S: Final = 1.0
"""How far past the evaluation time a sample's timestamp may read (s: the query's time
has millisecond resolution): later, the answer is broken, and no staleness is read off
it (a gauge stamped 1e6 s ahead read a fresh model whose counters were a day old)."""
_UNSET: Final = object()
"""`PrometheusSource(namespace_label=...)` not given (None is a setting: no scoping)."""
DECISIVE: Final = frozenset(
    (ARRIVAL, INGRESS, TARGETS_UP, TARGETS_KNOWN, TARGETS_SEEN, GAUGE_TS, COUNTER_TS)
)
"""The signals `_outcome` decides on: the demand (an ingress rate raises it), the
targets (their absence passes a dead fleet on to a decaying demand) and the sample
times. A duplicated one fails its model (`NoDataError` naming it); any other duplicated
signal reads as absent (NaN -> None), as when its series is missing."""


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
    @property
    def ingress_rate_query(self) -> str | None: ...
    @property
    def namespace_label(self) -> str | None: ...
    @property
    def query_method(self) -> str: ...


@dataclass(frozen=True, slots=True)
class _UrlSettings:
    """The settings of a source given only a URL (`PrometheusSettingsLike`'s defaults)."""

    url: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    disable_ssl: bool = False
    model_label: str = DEFAULT_MODEL_LABEL
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    ingress_rate_query: str | None = None
    namespace_label: str | None = DEFAULT_NAMESPACE_LABEL
    query_method: str = DEFAULT_QUERY_METHOD


class QueryClient(Protocol):
    """The part of `PrometheusConnect` the source uses.

    `custom_query` returns the `data.result` list of the query API's JSON answer. When
    its signature has a `timeout` parameter the source passes its HTTP timeout per call.
    """

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


class BodyQueryClient(QueryClient, Protocol):
    """A `QueryClient` that also hands over an answer's HTTP body undecoded: the source
    then decodes it itself, straight into the records it reads (`estimators.decode`).

    `query_body` sends the request `custom_query` sends and returns the body of a 200
    answer (bytes); it raises as `custom_query` does for a failed request or status.
    """

    def query_body(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bytes: ...


def http_query_client(
    url: str,
    timeout_s: float,
    disable_ssl: bool,
    retries: int,
    method: str = DEFAULT_QUERY_METHOD,
) -> QueryClient:
    """A `PrometheusConnect` with an HTTP timeout and no backoff-retries by default,
    querying with HTTP `method` (POST: the query in a form body; GET: in the URL).

    PrometheusConnect's own default retries a failed request 3 times with exponential
    backoff (sleeps of 0, 2 and 4 s with urllib3 2.x) on connection errors, read
    timeouts and 408/429/5xx: one dead server would stall a 5 s tick for over 6 s, a
    slow one for 4 timeouts plus that. The control loop retries on the next tick instead.
    The client is a `BodyQueryClient`: the source reads each answer's body undecoded.
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
    verb = method.upper()
    if verb not in ("GET", "POST"):
        raise ValueError(f"query method must be GET or POST, got {method!r}")
    if "method" in params:
        kwargs["method"] = verb
    client = _body_connect_class()(**kwargs)
    if "session" in params:  # it mounted a plain HTTPAdapter on the URL
        client._session.mount(url, DeadlineAdapter(max_retries=retry))
    # `query_body` reads it; a client too old to take `method` sends `custom_query`
    # (the drain's queries) with GET.
    client._method = verb
    made: QueryClient = client
    return made


def query_request(
    method: str, fields: dict[str, Any]
) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """(HTTP method, URL parameters, form body) of a query API request with `fields`
    sent with `method`: POST in a form body (Prometheus reads it as the URL's
    parameters), anything else as GET in the URL."""
    if method.upper() == "POST":
        return "POST", None, fields
    return "GET", fields, None


def _body_connect_class() -> type:
    """`PrometheusConnect` with `query_body` (`BodyQueryClient`): the request of its
    `custom_query` (same URL, method, parameters, headers, auth, TLS and timeout), the body
    of a 200 answer returned undecoded, any other status raised as `custom_query` raises
    it. With POST the parameters go in a form body (`custom_query` leaves them in the URL
    whatever the method; Prometheus reads either)."""
    from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

    class BodyConnect(PrometheusConnect):  # type: ignore[misc]
        def query_body(
            self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
        ) -> bytes:
            """The HTTP body of instant query `query` (`custom_query`'s request)."""
            session = self._session
            fields = {"query": str(query), **(params or {})}
            method, url_params, form = query_request(getattr(self, "_method", "GET"), fields)
            response = session.request(
                method=method,
                url=f"{self.url}/api/v1/query",
                params=url_params,
                data=form,
                verify=session.verify,
                headers=self.headers,
                auth=getattr(self, "auth", None),
                cert=session.cert,
                timeout=getattr(self, "_timeout", None) if timeout is None else timeout,
            )
            if response.status_code != 200:
                raise PrometheusApiClientException(
                    f"HTTP Status Code {response.status_code} ({response.content!r})"
                )
            body: bytes = response.content
            return body

    return BodyConnect


def _orjson_session(verify: bool) -> Any:
    """A `estimators.deadline.deadline_session` (each request completes within
    DEADLINE_FACTOR x its timeout) whose responses decode their JSON body with orjson.

    PrometheusConnect's `custom_query` decodes every answer with `response.json()` (the
    standard json module); orjson decodes in ~60 % of the time, into the same plain
    lists, dicts, strings and numbers. The source itself reads bodies (`query_body`,
    decoded by `estimators.decode`) and decodes with orjson only a body of another shape
    than Prometheus writes; `custom_query` serves the drain's queries. A body that is
    not JSON raises `orjson.JSONDecodeError`, a `ValueError` like the json module's (the
    source reports it as a SourceError).
    `verify`: check TLS certificates (PrometheusConnect's own session: not disable_ssl).
    """
    session = deadline_session(verify)
    plain = session.request

    def request(*args: Any, **kwargs: Any) -> Any:
        response = plain(*args, **kwargs)
        body = response.content
        response.json = lambda **_kw: orjson.loads(body)
        return response

    session.request = request  # type: ignore[method-assign]
    return session


def _query_failed(exc: Exception, query: str) -> SourceError:
    """The SourceError of a query whose client failed (or whose answer is not JSON)."""
    return SourceError(f"query failed: {type(exc).__name__}: {exc}", query=query)


def _partial(exc: PartialAnswerError, query: str) -> SourceError:
    """The SourceError of an answer whose warnings say it misses data."""
    return SourceError(f"partial answer, warnings: {exc}", query=query)


def _decoded_result(body: bytes, query: str) -> Any:
    """`data.result` of a body the fast path refused, decoded as the client's own
    `custom_query` decodes it (orjson, then `["data"]["result"]`), so a body that is not
    JSON or has no result fails with the same SourceError as through `custom_query`; a
    body whose `warnings` say it misses data fails as on the fast path."""
    try:
        doc = orjson.loads(body)
        result = doc["data"]["result"]
    except Exception as exc:
        raise _query_failed(exc, query) from exc
    try:
        check_warnings(doc.get("warnings"))
    except PartialAnswerError as exc:
        raise _partial(exc, query) from exc
    return result


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
    wait for bytes, and the default client's session ends a query still running at
    DEADLINE_FACTOR (2) x it (estimators.deadline: a drip-fed answer). A failing
    observe stops at the first failing query; a succeeding one takes at most eight
    queries' time. `client`: injected query client (tests, custom
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
    `ingress_rate_query`: the request rate in front of the engines (estimators.promql;
    default: the settings' `ingress_rate_query`, else none). With it a model without any
    engine up is observed at that rate (`ingress_observation`) instead of being no data,
    the arrival rate is at least it, and `sees_demand_at_zero` is True.
    `namespace_label`: the label holding each series' namespace (default: the settings'
    `namespace_label`, else `namespace`; None: no scoping): a model reads the series of
    its `ModelQuery.namespace` only, and label-less ones where those have none
    (estimators.promql, "Namespaces").
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
        ingress_rate_query: str | None = None,
        namespace_label: str | object | None = _UNSET,  # object: `_UNSET` only
    ) -> None:
        s = _UrlSettings(settings_or_url) if isinstance(settings_or_url, str) else settings_or_url
        url, disable_ssl = s.url, s.disable_ssl
        label = model_label or s.model_label
        timeout = s.timeout_s if timeout_s is None else timeout_s
        scrape = scrape_interval_s or s.scrape_interval_s
        ingress_rate_query = ingress_rate_query or s.ingress_rate_query
        ns_label = s.namespace_label if namespace_label is _UNSET else namespace_label
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
        self.namespace_label: str | None = ns_label  # type: ignore[assignment]
        self.max_staleness_s: float | None = max_staleness_s
        self.scrape_interval_s: float = float(scrape)  # engines' scrape, s; lookback: two
        self.sees_demand_at_zero: bool = ingress_rate_query is not None
        """Whether a model scaled to zero still shows its demand (an ingress rate): the
        control loop lets a model scale to zero only then (controller.loop)."""
        self.recording_rules: bool = recording_rules
        """Read the recorded bucket rates when fitting rules are loaded (see the class doc)."""
        self.rules_in_use: bool = False
        """Whether the latest tick read the recording rules' series."""
        self._builders: dict[bool, QueryBuilder] = {}
        self._by_mode: dict[bool, TickQueries] = {}
        for recorded in (False, True):
            b = QueryBuilder(
                label,
                self.window_s,
                accept_escaped,
                short_window_s,
                seed_window_s,
                targets_lookback_s,
                recorded,
                2.0 * scrape,  # gauges and `up` over two scrapes
                ingress_rate_query,
                self.namespace_label,
                recorded_max_age_s=RULES_MAX_AGE_INTERVALS * scrape,
                scrape_interval_s=scrape,
            )
            self._builders[recorded] = b
            self._by_mode[recorded] = queries_of(b, rules_marker=recording_rules)
        self._edges: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())  # SLA edges, s
        self.queries: TickQueries = self._by_mode[False]
        """The queries of the latest tick (`sla_buckets` follows the models' SLAs; the
        quantile and SLA-edge queries follow `rules_in_use`)."""
        method = s.query_method
        made = client or http_query_client(self.url, self.timeout_s, disable_ssl, retries, method)
        self._client: QueryClient = made
        self._per_call_timeout = _takes_timeout(self._client)
        # Of the bodies of a `BodyQueryClient`:
        self._decoder = AnswerDecoder(label, self.namespace_label)
        self.queries_last_tick: int = 0
        """Queries sent by the latest `observe` call (counted even when it failed)."""
        self.queries_total: int = 0
        """Queries sent since construction."""

    # --- querying ---------------------------------------------------------------------

    def _query(self, query: str, eval_time_s: float) -> Any:
        """Run one instant query at `eval_time_s`; return the client's answer, unchecked:
        the HTTP body (bytes) from a `BodyQueryClient`, else the decoded `data.result`
        (the caller parses either: `_parse_rows`, `_parse_edges`).

        Raises SourceError when the client fails.
        """
        params = {"time": f"{eval_time_s:.3f}", "timeout": f"{self.timeout_s:g}"}
        self.queries_last_tick += 1
        self.queries_total += 1
        return self._send(query, params)

    def _send(self, query: str, params: dict[str, str]) -> Any:
        """Send instant query `query` with `params` through the client: the HTTP body
        (bytes) from a `BodyQueryClient`, else the decoded `data.result`. Raises
        SourceError when the client fails."""
        query_body = getattr(self._client, "query_body", None)
        try:
            if query_body is not None:
                return query_body(query, params=params, timeout=self.timeout_s)
            if self._per_call_timeout:
                return self._client.custom_query(query, params=params, timeout=self.timeout_s)
            return self._client.custom_query(query, params=params)
        except Exception as exc:  # any failure of the client means "cannot read the source"
            raise _query_failed(exc, query) from exc

    def server_time_s(self) -> float:
        """Prometheus's own current time, unix seconds: the instant query `time()` sent
        without a `time` parameter, so Prometheus evaluates it at its clock's now (the
        `service.promclock` offset is measured with it). Counted in `queries_total`, not
        in `queries_last_tick` (a tick's data queries). Raises SourceError when it
        cannot be read or the answer is not a finite, positive scalar."""
        self.queries_total += 1
        raw = self._send(SERVER_TIME_QUERY, {"timeout": f"{self.timeout_s:g}"})
        try:
            if isinstance(raw, bytes):  # the body of a `BodyQueryClient`
                data = orjson.loads(raw)["data"]
                if data.get("resultType", "scalar") != "scalar":
                    raise ValueError(f"resultType {data.get('resultType')!r}, not scalar")
                raw = data["result"]
            at_s = float(raw[1])  # a scalar: [evaluation time, "value"]
        except Exception as exc:
            raise SourceError(
                f"not a scalar answer: {type(exc).__name__}: {exc}", query=SERVER_TIME_QUERY
            ) from exc
        if not math.isfinite(at_s) or at_s <= 0.0:
            raise SourceError(f"not a time: {at_s!r}", query=SERVER_TIME_QUERY)
        return at_s

    @property
    def _reads_bodies(self) -> bool:
        """Whether the client hands over HTTP bodies (`BodyQueryClient`): `_query` then
        returns bodies."""
        return getattr(self._client, "query_body", None) is not None

    def _samples(self, body: bytes, query: str) -> list[Any] | None:
        """`AnswerDecoder.samples` of `body`; SourceError when its warnings say the
        answer misses data (`estimators.decode.partial_warnings`)."""
        try:
            return self._decoder.samples(body)
        except PartialAnswerError as exc:
            raise _partial(exc, query) from exc

    def _parse_rows(
        self, raw: Any, query: str, into: Rows | None, faults: Faults, scopes: ScopeKeys
    ) -> Rows:
        """A tagged answer (body or decoded) indexed into rows (`parse_tagged`) keyed by
        `scopes`, its models' faults recorded in `faults`."""
        if self._reads_bodies:  # `raw` is the HTTP body
            samples = self._samples(raw, query)
            rows = None if samples is None else rows_from_samples(samples, faults, into, scopes)
            if rows is not None:
                return rows
            raw = _decoded_result(raw, query)
        return parse_tagged(raw, query, self.model_label, faults, into, scopes)

    def _parse_edges(
        self, raw: Any, query: str, faults: Faults, scopes: ScopeKeys
    ) -> dict[str, dict[str, Buckets]]:
        """An SLA-edge bucket answer (body or decoded) indexed (`parse_edge_buckets`)
        keyed by `scopes`, its models' faults recorded in `faults`."""
        if self._reads_bodies:  # `raw` is the HTTP body
            samples = self._samples(raw, query)
            table = None if samples is None else buckets_from_samples(samples, faults, scopes)
            if table is not None:
                return edge_buckets(table)
            raw = _decoded_result(raw, query)
        return parse_edge_buckets(raw, query, self.model_label, faults, scopes)

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

    def _follow_rules(self, demand: Rows) -> None:
        """Read the recorded series from the next query on when the demand answer carries
        the rules' marker, the raw buckets when it does not (rules removed, or never
        loaded): decided on every tick, so a tick never reads series that are gone."""
        present = self.recording_rules and (
            RULES_SIGNAL in demand.get(RULES_MARKER_MODEL, EMPTY)
            or any(RULES_SIGNAL in row for row in demand.values())
        )
        if present != self.rules_in_use:
            self.rules_in_use = present
            self.queries = self._by_mode[present]

    # --- MetricSource -------------------------------------------------------------------

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        """Observe `models` as of `now_s` (unix seconds; every query is evaluated there).

        Returns one entry per requested model: an `Observation`, or a `NoDataError` when
        its demand signal is missing or not finite, its engine targets are all down, its
        data is stale, or a series of it is malformed or duplicated (module docstring).
        Raises `SourceError` when any query cannot be read (the tick then has no
        trustworthy data at all). Series of models not in `models` are ignored.
        """
        if not math.isfinite(now_s):
            raise ValueError(f"now_s must be finite, got {now_s}")
        self.queries_last_tick = 0
        wanted = {m.name: m for m in models}
        if not wanted:
            return {}
        self._follow_slas(models)
        rows: dict[str, Rows] = {}
        edges: dict[str, dict[str, Buckets]] = {}
        faults: Faults = {}  # model -> signal -> what was wrong (estimators.answers)
        scopes = ScopeKeys(self.namespace_label, {m.name: m.namespace for m in models})
        # Each answer is parsed as soon as it arrives (and dropped): a malformed one stops
        # the tick before the next query, and only one decoded answer is alive at a time.
        for name in [name for name, _query in self.queries.items()]:  # demand first
            query = getattr(self.queries, name)  # after demand: as `_follow_rules` says
            raw = self._query(query, now_s)
            if name == "sla_buckets":
                edges = self._parse_edges(raw, query, faults, scopes)
            else:  # the four quantile answers have distinct tags: one row per model
                group = "quantiles" if name.endswith("_quantiles") else name
                rows[group] = self._parse_rows(raw, query, rows.get(group), faults, scopes)
                if name == "demand":
                    self._follow_rules(rows[group])
            del raw
        scopes.settle(rows, edges, faults)
        t = Answers(rows, edges, faults)
        out: dict[str, ObservationResult] = {}
        for name, mq in wanted.items():
            out[name] = self._outcome(mq, now_s, t)
        return out

    def _outcome(self, mq: ModelQuery, now_s: float, t: Answers) -> ObservationResult:
        """One model's Observation, or the NoDataError that says why there is none."""
        name = mq.name
        faults = t.faults.get(name)
        if faults is not None:  # bad series of this model first: nothing else is read
            for signal, detail in faults.items():
                if detail != DUPLICATED or signal in DECISIVE:
                    return NoDataError(name, signal, detail)
        s = t.state.get(name, EMPTY)
        up = count(s.get(TARGETS_UP))
        known = count(s.get(TARGETS_KNOWN))
        seen = count(s.get(TARGETS_SEEN))
        if seen is None:
            seen = known
        bad = [(k, v) for k, v in (("up", up), ("known", known), ("seen", seen)) if v and v < 0]
        if bad:  # a count of targets below 0 is no count: never read as "some are up"
            detail = ", ".join(f"{k} {v}" for k, v in bad) + ": a target count below 0"
            return NoDataError(name, TARGETS_SIGNAL, detail)
        d = t.demand.get(name, EMPTY)
        ingress = finite(d.get(INGRESS))
        if ingress is not None and ingress < 0.0:
            ingress = None  # an invalid rate is no ingress signal, never 0 req/s
        # Targets first: once every target is gone the rate window empties and the
        # arrival is absent too, but the cause to report (for the whole lookback) is this.
        if seen and not up:  # up 0, or no `up` series left: down or gone, every one
            if ingress is not None:
                return ingress_observation(name, now_s, ingress, known)
            detail = f"every engine scrape target is down or gone (0 of {seen} up)"
            return NoDataError(name, TARGETS_SIGNAL, detail)
        raw_arrival = d.get(ARRIVAL)
        arrival = finite_or_none(raw_arrival)
        if arrival is None:
            if ingress is not None and not seen:  # no engine at all: scaled to zero
                return ingress_observation(name, now_s, ingress, known)
            detail = "absent from the answer" if raw_arrival is None else f"{raw_arrival}"
            return NoDataError(name, DEMAND_SIGNAL, detail)
        if arrival < 0.0:
            return NoDataError(name, DEMAND_SIGNAL, f"negative rate {arrival:g} req/s")
        if ingress is not None and ingress > arrival:
            arrival = ingress  # requests a server holds before its engine sees them
        gauge_ts, counter_ts = finite(s.get(GAUGE_TS)), finite(s.get(COUNTER_TS))
        stamps = [ts for ts in (gauge_ts, counter_ts) if ts is not None]
        if not stamps:
            detail = "no current sample: every engine series is stale (targets down or gone)"
            return NoDataError(name, STALENESS_SIGNAL, detail)
        if max(stamps) > now_s + FUTURE_STAMP_S:  # evaluated at now_s: no later sample
            detail = f"a sample stamped {max(stamps) - now_s:.1f} s after the evaluation time"
            return NoDataError(name, STALENESS_SIGNAL, detail)
        staleness_s = max(0.0, now_s - max(stamps))
        if self.max_staleness_s is not None and staleness_s > self.max_staleness_s:
            detail = f"newest sample {staleness_s:.1f} s old (limit {self.max_staleness_s:g} s)"
            return NoDataError(name, STALENESS_SIGNAL, detail)
        return observation(mq, now_s, arrival, staleness_s, t, up, known)
