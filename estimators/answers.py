"""Prometheus answers -> per-model Observations, in one pass per answer.

`PrometheusSource` (estimators.prometheus) runs the queries; this module turns their
`data.result` lists into what it returns:

- a tagged (multi-signal) answer is indexed once into rows, model -> signal -> value
  (`parse_tagged`); the four quantile answers share one row per model;
- the SLA-edge bucket answer into histogram tag -> model -> cumulative buckets
  (`parse_edge_buckets`);
- then each model's Observation is read from its rows (`observation`): one dict get per
  signal, the values cleaned there (NaN and infinities are no data, never 0: a required
  count or time that is not finite is None, and the Observation's own construction turns
  every optional number that is not finite, or negative, into None).

A sample is well formed when it is {"metric": {labels}, "value": [timestamp, value]}
with `value` a string or a number (not a boolean) that parses as a float; "NaN", "+Inf"
and "-Inf" come back as such. Series without the model label or the tag are skipped.
Bad data stays with its model (`Faults`, model -> signal -> what was wrong):

- a malformed sample whose labels name a model (a value that is no [timestamp, number]
  pair, such as a bare "90", which must not read as 9 and 0; a boolean; text that is no
  number) is recorded against that model, whose outcome is then no data
  (`estimators.prometheus`); the other models are read as usual. A malformed sample that
  names no model (or an answer that is not a list) fails the whole answer: SourceError
  naming the query;
- a second value for one (model, signal) in a query group (two series where the query
  means one per model: an ingress expression grouped by more labels than the model's,
  a proxy merging two answers) is neither of them: the signal reads NaN (no data, never
  the last series or 0) and is recorded as `DUPLICATED`; the source fails the model
  when the signal is one it decides on (`estimators.prometheus.DECISIVE`);
- a repeated (model, histogram, `le` text) bucket voids that histogram of that model.

Namespaces (`ScopeKeys`): with a namespace label every per-model answer is grouped by
(model, namespace) (estimators.promql, "Namespaces"). Each series is keyed as it is
indexed: a series of the model's own namespace (or of any namespace where the model's
is not known) under the model's name; a series without the label under `BARE` + name;
a series of another namespace is skipped, its faults too. After the tick's answers,
`ScopeKeys.settle` reads a model from its own namespace's series whenever there are any,
and from the label-less ones only where there are none (a scrape config that adds no
namespace label): the two are different fleets, never mixed signal by signal (target
counts of one with gauges of the other). The one exception is the ingress rate, an
operator's query that may group by the model alone: it is read either way.

Cost (benchmarks/bench_tick.py, 1,000 models, ~43 series each): the rows replace the
per-signal columns the source used to build and then clean, one dict comprehension per
signal per tick, before reading them per model.

Units: latency signals are answered in seconds and reported in milliseconds; rates per
second; times in Unix seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from estimators.histogram import fraction_le
from estimators.promql import DIST_QUANTILES, SIGNAL_LABEL, Signal, quantile_signal
from estimators.types import LatencyQuantiles, ModelQuery, Observation, SourceError, finite_or_none

Buckets = list[tuple[float, float]]
"""Cumulative (upper bound, per-second rate) pairs sorted by bound."""
Rows = dict[str, dict[str, float]]
"""model -> signal -> value as answered (NaN and infinities included), one query group."""
Faults = dict[str, dict[str, str]]
"""model -> signal -> what was wrong with its series this tick (`DUPLICATED`, or the
detail of a malformed sample): one dict per tick, usually empty."""
BucketIndex = dict[str, dict[str, dict[str, float]]]
"""histogram tag -> model -> {`le` as answered: rate}, an SLA-edge answer indexed."""

DUPLICATED: Final = "duplicated series: more than one value for one model"
"""The `Faults` detail of a (model, signal) answered twice (module doc)."""
UNTAGGED: Final = "untagged"
"""The signal a malformed sample without the tag is recorded under."""
NAN: Final = math.nan

EMPTY: Mapping[str, Any] = MappingProxyType({})
_NUMBER = (str, int, float)
LE_CACHE: dict[str, float | None] = {}
_INF = math.inf
LE_CACHE_MAX = 4096  # distinct `le` strings are few (tens); bound it anyway

# Signal names as plain strings: a dict lookup by a `StrEnum` member hashes through
# `Enum.__hash__` (a Python call), three times slower than by its value.
ARRIVAL = Signal.ARRIVAL_RPS.value
_SHORT = Signal.ARRIVAL_SHORT_RPS.value
_SEED = Signal.ARRIVAL_SEED_RPS.value
INGRESS = Signal.INGRESS_RPS.value
_COMPLETIONS = Signal.COMPLETIONS_RPS.value
_RUNNING = Signal.RUNNING.value
_WAITING = Signal.WAITING.value
_KV = Signal.KV_USAGE_FRAC.value
_READY = Signal.READY_REPLICAS.value
GAUGE_TS = Signal.GAUGE_SAMPLE_TS.value
COUNTER_TS = Signal.COUNTER_SAMPLE_TS.value
TARGETS_UP = Signal.TARGETS_UP.value
TARGETS_KNOWN = Signal.TARGETS_KNOWN.value
TARGETS_SEEN = Signal.TARGETS_SEEN.value
_PREFIX = Signal.PREFIX_CACHE_HIT_FRAC.value
_PREEMPT = Signal.PREEMPTION_RATE_PER_S.value
_PROMPT_MEAN = Signal.PROMPT_TOKENS_MEAN.value
_OUTPUT_MEAN = Signal.OUTPUT_TOKENS_MEAN.value
_TTFT_MEAN = Signal.TTFT_MEAN_S.value
_ITL_MEAN = Signal.ITL_MEAN_S.value
_DECODE_MEAN = Signal.DECODE_TIME_MEAN_S.value
_PREFILL_MEAN = Signal.PREFILL_TIME_MEAN_S.value
_QUEUE_MEAN = Signal.QUEUE_TIME_MEAN_S.value
_E2E_MEAN = Signal.E2E_MEAN_S.value
_STEP_TOKENS = Signal.STEP_TOKENS_MEAN.value
_DISTS = {h: tuple(quantile_signal(h, p) for p in DIST_QUANTILES) for h in ("ttft", "itl", "e2e")}
_QUEUE_P95 = quantile_signal("queue", 0.95)
_DECODE_P95 = quantile_signal("decode", 0.95)
_TPOT_P95 = quantile_signal("tpot", 0.95)
_PROMPT_P95 = quantile_signal("prompt_tokens", 0.95)
_OUTPUT_P95 = quantile_signal("output_tokens", 0.95)


BARE: Final = "\x00"
"""Prefix of the key of a series without the namespace label (`ScopeKeys`); no model
label value holds it."""


class ScopeKeys:
    """Row keys by namespace (module doc, "Namespaces"). `label`: the namespace label
    (None: no scoping, every series keyed by its model); `want`: model -> its namespace
    (None: unknown, any namespace is the model's)."""

    __slots__ = ("label", "want")

    def __init__(self, label: str | None, want: Mapping[str, str | None]) -> None:
        self.label = label
        self.want = want

    def key(self, model: str, namespace: Any) -> str | None:
        """The row key of a series of `model` in `namespace` (None: no label); None
        when the series is another namespace's."""
        if namespace is None or self.label is None:
            return model if self.label is None else BARE + model
        want = self.want.get(model)
        return model if want is None or namespace == want else None

    def settle(self, groups: Mapping[str, Rows], edges: Mapping[str, dict[str, Any]],
               faults: Faults) -> None:  # fmt: skip
        """Fold the label-less keys into their models, in place (module doc). A model
        its namespace answered for (a row, buckets or a fault under its own key) keeps
        those and takes only the ingress rate from label-less series; any other model
        takes its label-less rows, buckets and faults whole. The `BARE` keys go."""
        owned = {k for k in faults if not k.startswith(BARE)}
        for table in (*groups.values(), *edges.values()):
            owned.update(k for k in table if not k.startswith(BARE))
        for rows in groups.values():
            for key in [k for k in rows if k.startswith(BARE)]:
                bare, model = rows.pop(key), key[1:]
                if model not in owned:
                    rows[model] = bare
                elif INGRESS in bare:
                    rows.setdefault(model, {}).setdefault(INGRESS, bare[INGRESS])
        for column in edges.values():
            for key in [k for k in column if k.startswith(BARE)]:
                bare_buckets = column.pop(key)
                if key[1:] not in owned:
                    column[key[1:]] = bare_buckets
        for key in [k for k in faults if k.startswith(BARE)]:
            model = key[1:]
            for signal, detail in faults.pop(key).items():
                if model not in owned or signal == INGRESS:
                    faults.setdefault(model, {}).setdefault(signal, detail)


def finite(v: float | None) -> float | None:
    """`v` when it is a finite number, else None (`v - v` is NaN for NaN and +-Inf)."""
    return v if v is not None and v - v == 0.0 else None


def count(v: float | None) -> int | None:
    """`v` rounded to an int when finite, else None."""
    return round(v) if v is not None and v - v == 0.0 else None


def _ms(v: float | None) -> float | None:
    """Seconds -> milliseconds where a latency (finite, >= 0, finite in ms), else None
    (Observation cleans its own fields the same way; the quantiles of a LatencyQuantiles
    are cleaned only here)."""
    if v is None or not 0.0 <= v < _INF:
        return None
    ms = v * 1000.0
    return ms if ms < _INF else None


def _dist(q: Mapping[str, float], tags: tuple[str, ...]) -> LatencyQuantiles | None:
    """p50/p90/p95/p99 in ms from a quantile row (finite values >= 0 only, finite in ms
    too); None when none."""
    t50, t90, t95, t99 = tags
    p50, p90, p95, p99 = (_ms(q.get(t)) for t in (t50, t90, t95, t99))
    if p50 is None and p90 is None and p95 is None and p99 is None:
        return None
    return LatencyQuantiles(p50, p90, p95, p99)


def _attainment(by_model: Mapping[str, Buckets], name: str, sla_s: float | None) -> float | None:
    buckets = by_model.get(name)
    if sla_s is None or not buckets:
        return None
    return finite_or_none(fraction_le(sla_s, buckets))


class Answers:
    """One tick's answers, indexed: the rows of each query group (`demand`, `state`,
    `rates`, `quantiles`), the SLA-edge buckets per histogram tag, and the faults of the
    tick's series per model (`Faults`)."""

    __slots__ = (
        "demand",
        "faults",
        "itl_edges",
        "quantiles",
        "rates",
        "state",
        "tpot_edges",
        "ttft_edges",
    )

    def __init__(
        self,
        rows: Mapping[str, Rows],
        edges: Mapping[str, dict[str, Buckets]],
        faults: Mapping[str, Mapping[str, str]] = EMPTY,
    ) -> None:
        self.faults: Mapping[str, Mapping[str, str]] = faults
        self.demand: Mapping[str, Mapping[str, float]] = rows.get("demand", EMPTY)
        self.state: Mapping[str, Mapping[str, float]] = rows.get("state", EMPTY)
        self.rates: Mapping[str, Mapping[str, float]] = rows.get("rates", EMPTY)
        self.quantiles: Mapping[str, Mapping[str, float]] = rows.get("quantiles", EMPTY)
        self.ttft_edges: Mapping[str, Buckets] = edges.get("ttft", EMPTY)
        self.itl_edges: Mapping[str, Buckets] = edges.get("itl", EMPTY)
        self.tpot_edges: Mapping[str, Buckets] = edges.get("tpot", EMPTY)


def observation(
    mq: ModelQuery,
    now_s: float,
    arrival_rps: float,
    staleness_s: float,
    t: Answers,
    up: int | None,
    known: int | None,
) -> Observation:
    """One model's Observation from its rows (the demand, targets and staleness already
    checked by the caller): every lookup a plain dict get (this runs once per model per
    tick). Optional numbers are passed as answered (ms scaled): `Observation` turns NaN,
    infinite and negative ones into None."""
    name = mq.name
    d = t.demand.get(name, EMPTY)
    s = t.state.get(name, EMPTY)
    r = t.rates.get(name, EMPTY)
    q = t.quantiles.get(name, EMPTY)
    ttft, itl, e2e = _dist(q, _DISTS["ttft"]), _dist(q, _DISTS["itl"]), _dist(q, _DISTS["e2e"])
    completions = finite(d.get(_COMPLETIONS))
    short = finite(d.get(_SHORT))
    seed = finite(d.get(_SEED))
    return Observation(
        model=name,
        observed_at_s=now_s,
        arrival_rate_rps=arrival_rps,
        arrival_rate_short_rps=short,
        staleness_s=staleness_s,
        prompt_tokens_mean=r.get(_PROMPT_MEAN),
        prompt_tokens_p95=q.get(_PROMPT_P95),
        output_tokens_mean=r.get(_OUTPUT_MEAN),
        output_tokens_p95=q.get(_OUTPUT_P95),
        itl_p95_ms=None if itl is None else itl.p95_ms,
        ttft_p95_ms=None if ttft is None else ttft.p95_ms,
        e2e_p99_ms=None if e2e is None else e2e.p99_ms,
        queue_time_p95_ms=_ms(q.get(_QUEUE_P95)),
        ttft_attainment_frac=_attainment(t.ttft_edges, name, mq.ttft_sla_s),
        itl_attainment_frac=_attainment(t.itl_edges, name, mq.itl_sla_s),
        running=s.get(_RUNNING),
        waiting=s.get(_WAITING),
        kv_usage_frac=s.get(_KV),
        prefix_cache_hit_frac=r.get(_PREFIX),
        preemption_rate_per_s=r.get(_PREEMPT),
        ready_replicas=count(s.get(_READY)),
        arrival_rate_5m_rps=seed,
        decode_time_p95_ms=_ms(q.get(_DECODE_P95)),
        decode_time_mean_ms=_ms(r.get(_DECODE_MEAN)),
        prefill_time_mean_ms=_ms(r.get(_PREFILL_MEAN)),
        queue_time_mean_ms=_ms(r.get(_QUEUE_MEAN)),
        e2e_mean_ms=_ms(r.get(_E2E_MEAN)),
        tpot_p95_ms=_ms(q.get(_TPOT_P95)),
        tpot_attainment_frac=_attainment(t.tpot_edges, name, mq.itl_sla_s),
        itl_mean_ms=_ms(r.get(_ITL_MEAN)),
        ttft_mean_ms=_ms(r.get(_TTFT_MEAN)),
        step_tokens_mean=r.get(_STEP_TOKENS),
        ttft_dist=ttft,
        itl_dist=itl,
        e2e_dist=e2e,
        targets_up=up,
        targets_down=None if known is None or up is None else max(0, known - up),
        ingress_rate_rps=finite(d.get(INGRESS)),
        extra={} if completions is None else {"completions_rps": completions},
    )


def ingress_observation(
    name: str, now_s: float, ingress_rps: float, known: int | None
) -> Observation:
    """The Observation of a model with no engine up but an ingress rate (>= 0, req/s):
    that rate is its arrival rate, `targets_up` 0, no engine signal. A fleet scaled to
    zero scales up from it; for a fleet asked to run it is a dead one (the decider holds,
    controller.nodata)."""
    return Observation(
        model=name,
        observed_at_s=now_s,
        arrival_rate_rps=ingress_rps,
        ingress_rate_rps=ingress_rps,
        targets_up=0,
        targets_down=known or 0,
    )


# --- answer parsing ---------------------------------------------------------------------


def _not_a_vector(raw: Any, query: str) -> SourceError:
    return SourceError(
        f"malformed answer: expected an instant vector (list), got {type(raw).__name__}",
        query=query,
    )


def _malformed(item: Any, exc: Exception, query: str) -> SourceError:
    return SourceError(
        f"malformed sample {str(item)[:200]!r}: {type(exc).__name__}: {exc}", query=query
    )


def not_a_number(value: Any) -> str:
    """The fault detail of a sample whose value is not a number (both decoders)."""
    return f"malformed sample: value {repr(value)[:80]} is not a number"


def note_fault(
    item: Any,
    exc: Exception,
    query: str,
    model_label: str,
    faults: Faults,
    scopes: ScopeKeys | None = None,
) -> None:
    """Record malformed sample `item` against the model its labels name (module doc),
    under its `scopes` key (another namespace's: not recorded); SourceError naming
    `query` when it names none (its labels unreadable or no model)."""
    metric = item.get("metric") if isinstance(item, dict) else None
    model = metric.get(model_label) if isinstance(metric, dict) else None
    if model is None:
        raise _malformed(item, exc, query) from exc
    if scopes is not None:
        key = scopes.key(str(model), metric.get(scopes.label or ""))  # type: ignore[union-attr]
        if key is None:
            return
        model = key
    signal = metric.get(SIGNAL_LABEL)
    pair = item.get("value")
    if pair is None:
        detail = "malformed sample: no value"
    elif not isinstance(pair, list | tuple) or len(pair) != 2:
        detail = f"malformed sample: value {repr(pair)[:80]} is not a [timestamp, number] pair"
    else:
        detail = not_a_number(pair[1])
    tag = UNTAGGED if signal is None else str(signal)
    faults.setdefault(str(model), {})[tag] = detail  # over a DUPLICATED: this one fails


def duplicated(faults: Faults, model: str, signal: str) -> None:
    """Record a second value of (`model`, `signal`) (a malformed one stays the cause)."""
    faults.setdefault(model, {}).setdefault(signal, DUPLICATED)


def parse_tagged(
    raw: Any,
    query: str,
    model_label: str,
    faults: Faults,
    into: Rows | None = None,
    scopes: ScopeKeys | None = None,
) -> Rows:
    """Validate a query API `data.result` as an instant vector (module doc) and index a
    tagged (multi-signal) answer into rows, model -> signal -> value, added to `into`
    when given (a signal already there is duplicated: NaN, recorded in `faults`, as is
    a malformed sample naming a model). With `scopes` rows are keyed by
    `ScopeKeys.key` (module doc, "Namespaces"). The validation is inlined: this runs
    once per series (about 40 per model per tick)."""
    if not isinstance(raw, list):
        raise _not_a_vector(raw, query)
    rows: Rows = {} if into is None else into
    tag = SIGNAL_LABEL
    for item in raw:
        try:
            metric = item["metric"]
            pair = item["value"]
            if pair.__class__ is not list and not isinstance(pair, tuple):
                raise TypeError("value must be a [timestamp, number] pair")
            _ts, value = pair
            if (metric.__class__ is not dict or value.__class__ is not str) and (
                not isinstance(metric, dict)
                or not isinstance(value, _NUMBER)
                or isinstance(value, bool)
            ):
                raise TypeError("metric must be an object and value a number")
            value = float(value)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            note_fault(item, exc, query, model_label, faults, scopes)
            continue
        model = metric.get(model_label)
        signal = metric.get(tag)
        if model is None or signal is None:
            continue
        if model.__class__ is not str:
            model = str(model)
        if scopes is not None:
            model = scopes.key(model, metric.get(scopes.label))
            if model is None:
                continue
        if signal.__class__ is not str:
            signal = str(signal)
        row = rows.get(model)
        if row is None:
            rows[model] = {signal: value}
        elif signal in row:
            row[signal] = NAN
            duplicated(faults, model, signal)
        else:
            row[signal] = value
    return rows


def le_bound(le: str) -> float | None:
    """The `le` label as a float bound; None when it does not parse or is NaN (memoized:
    the distinct `le` strings of a fleet are few)."""
    bound = LE_CACHE.get(le, LE_CACHE)
    if bound is not LE_CACHE:
        return bound  # type: ignore[return-value]
    try:
        parsed: float | None = float(le)
    except ValueError:
        parsed = None
    if parsed is not None and math.isnan(parsed):
        parsed = None
    if len(LE_CACHE) < LE_CACHE_MAX:
        LE_CACHE[le] = parsed
    return parsed


def index_buckets(
    raw: Any, query: str, model_label: str, faults: Faults, scopes: ScopeKeys | None = None
) -> BucketIndex:
    """The pass over a bucket answer: tag -> model -> {`le` text: value}, validated as
    `parse_tagged` (a malformed sample naming a model recorded in `faults`; models keyed
    by `scopes` when given); a repeated (model, tag, `le` text) reads NaN, which voids
    that histogram of that model."""
    if not isinstance(raw, list):
        raise _not_a_vector(raw, query)
    table: BucketIndex = {}
    for item in raw:
        try:
            metric = item["metric"]
            pair = item["value"]
            if pair.__class__ is not list and not isinstance(pair, tuple):
                raise TypeError("value must be a [timestamp, number] pair")
            _ts, value = pair
            if (metric.__class__ is not dict or value.__class__ is not str) and (
                not isinstance(metric, dict)
                or not isinstance(value, _NUMBER)
                or isinstance(value, bool)
            ):
                raise TypeError("metric must be an object and value a number")
            value = float(value)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            note_fault(item, exc, query, model_label, faults, scopes)
            continue
        model = metric.get(model_label)
        signal = metric.get(SIGNAL_LABEL)
        le = metric.get("le")
        if model is None or signal is None or le is None:
            continue
        if model.__class__ is not str:
            model = str(model)
        if scopes is not None:
            model = scopes.key(model, metric.get(scopes.label))
            if model is None:
                continue
        if signal.__class__ is not str:
            signal = str(signal)
        if le.__class__ is not str:
            le = str(le)
        column = table.get(signal)
        if column is None:
            column = table[signal] = {}
        by_le = column.get(model)
        if by_le is None:
            column[model] = {le: value}
        else:
            by_le[le] = NAN if le in by_le else value
    return table


def parse_edge_buckets(
    raw: Any, query: str, model_label: str, faults: Faults, scopes: ScopeKeys | None = None
) -> dict[str, dict[str, Buckets]]:
    """Validate a tagged bucket-rate answer (as `parse_tagged`) and index it: histogram
    tag -> model -> cumulative buckets (bound, rate) sorted by bound, PromQL-style cleaned
    (`edge_buckets`). A malformed sample naming a model is recorded in `faults`; models
    are keyed by `scopes` when given.
    """
    return edge_buckets(index_buckets(raw, query, model_label, faults, scopes))


BUCKET_NOISE = 0.01
"""How much less than a lower bound's a cumulative bucket's rate may read (relative to
the larger) and still be noise: float error, or `rate()`'s extrapolation, which differs
between series only while they are young (a first sample near zero). Within it the
running maximum holds; past it, no buckets (the attainment is then read off the p95)."""


def edge_buckets(acc: BucketIndex) -> dict[str, dict[str, Buckets]]:
    """Histogram tag -> model -> cumulative buckets from an index of bucket rates (tag ->
    model -> {`le` text: rate}).

    Buckets of one bound spelled differently are summed: `le` "1.0" (Python's client)
    and "1" (Go's) are two series under `sum by (<model>, le)`, each counting its own
    engines (`estimators.promql.le_spellings`); a non-numeric `le` is skipped. Counts
    are made monotonic (running maximum, as PromQL does against float noise in rates).
    A model with any bucket of a histogram that is not a finite count >= 0 (NaN,
    infinite, negative, or a repeated `le`, indexed as NaN), or that reads fewer than a
    lower bound's by more than noise (BUCKET_NOISE of the larger: the `+Inf`
    bucket under a finite one's, a lower bucket over a higher one's), gets no buckets of
    it at all: no data, not a wrong attainment. (The running maximum made `le="0.5"` at
    4 with `+Inf` at 0 read all of them within 500 ms, and that 100 % grew the capacity
    correction where TTFT p95 read 3 s.)
    """
    cache = LE_CACHE
    out: dict[str, dict[str, Buckets]] = {}
    for hist, by_model in acc.items():
        column = out[hist] = {}
        for model, by_le in by_model.items():
            pairs: list[tuple[float, float]] = []  # (bound, rate), then sorted by bound
            for le, c in by_le.items():
                bound = cache.get(le, cache)
                if bound is cache:
                    bound = le_bound(le)
                if bound is not None:
                    pairs.append((bound, c))  # type: ignore[arg-type]
            if not pairs:
                continue
            pairs.sort()
            buckets: Buckets = []
            running_max = 0.0
            prev: float | None = None  # the bound summed into `raw`
            raw = 0.0
            for bound, c in pairs:
                if bound == prev:  # one bound spelled another way: summed
                    raw += c
                    continue
                if prev is not None:
                    if not 0.0 <= raw < _INF:  # NaN, +-Inf or negative
                        break
                    if raw < running_max * (1.0 - BUCKET_NOISE):  # fewer than below
                        break
                    if raw > running_max:
                        running_max = raw
                    buckets.append((prev, running_max))
                prev, raw = bound, c
            else:
                if 0.0 <= raw < _INF and raw >= running_max * (1.0 - BUCKET_NOISE):
                    buckets.append((prev, max(running_max, raw)))  # type: ignore[arg-type]
                    column[model] = buckets
    return out
