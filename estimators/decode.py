"""Query API bodies -> the indexes of `estimators.answers`, decoded into typed records.

`PrometheusSource` (estimators.prometheus) reads each answer's HTTP body itself when its
client offers `query_body` (the default client does). This module owns the fast path:

- `AnswerDecoder.samples` decodes the body `{"data": {"result": [...]}}` with msgspec
  straight into small records holding only what the source reads (the model label, the
  signal tag, `le`, the value's text): no dict per series and no label that is not read,
  and the records are not tracked by the cyclic collector;
- `rows_from_samples` / `buckets_from_samples` index them as `parse_tagged` /
  `index_buckets` do the decoded JSON (same rows, same buckets, same values: each
  value goes through the same `float()` of its text; the same faults: a duplicated
  signal NaN and `DUPLICATED`, a repeated bucket NaN, a value that is no number
  recorded against the model its sample names, with the same detail).

The fast path takes only answers of the exact shape Prometheus writes (every label a
string, `value` a pair [number, string]); anything else (a body that is not JSON, no
`data`, a scalar or matrix result, a label that is not a string, a value that is not a
number, such as a bare "90" or a boolean) makes it answer None, and the source then
decodes the body with orjson and parses it generically (`estimators.answers`: such a
sample naming a model makes that model no data, one naming none a `SourceError`), so
every answer reads as it does through `custom_query` (`estimators.prometheus`).

Warnings (`partial_warnings`): a `"status": "success"` answer may carry `warnings` (and,
from Prometheus 2.54, `infos`). Prometheus writes its PromQL annotations there as
`PromQL warning: ...` / `PromQL info: ...` (2.48 on; infos in their own list from 2.54):
notes on the query's data (a bad `le`, a fixed monotonicity), not missing data. Any
other warning comes from the storage: a remote-read source that failed, Thanos Query's
partial response ("No StoreAPIs matched for this query", a store that did not answer),
a truncated list ("3 more warnings omitted"): the answer misses part of the data, its
sums part of the fleet. `AnswerDecoder.samples` raises `PartialAnswerError` for such a
body, as `partial_warnings` says for the generic path (the source: a `SourceError`).

Cost (benchmarks/bench_tick.py, 1,000 models, ~43,000 series per tick): decoding into
records takes about two thirds of orjson's time into dicts and lists, and the index pass
reads two attributes per series instead of validating a dict and a list.

Units: values are as answered (seconds, per-second rates, counts); `le` bounds seconds.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from estimators.answers import (
    NAN,
    UNTAGGED,
    BucketIndex,
    Faults,
    Rows,
    ScopeKeys,
    duplicated,
    not_a_number,
)
from estimators.promql import (
    EDGE_HISTOGRAMS,
    QUANTILES,
    RULES_SIGNAL,
    SIGNAL_LABEL,
    Signal,
    quantile_signal,
)

TAGS: Final[tuple[str, ...]] = (
    *(s.value for s in Signal),
    *(quantile_signal(hist, q) for hist, _names, qs in QUANTILES for q in qs),
    *(hist for hist, _names in EDGE_HISTOGRAMS),
    RULES_SIGNAL,
)
"""Every value of `SIGNAL_LABEL` the queries of `estimators.promql` write. Decoded as a
`Literal` of these, a tag is the one string object kept here (no string made per series,
its hash computed once): about 40 % off decoding and indexing. A body with another tag
takes the generic path (same outcome, slower)."""


ANNOTATION_PREFIXES: Final[tuple[str, ...]] = ("PromQL info:", "PromQL warning:")
"""How Prometheus's PromQL annotations begin (util/annotations): not partial data."""


class PartialAnswerError(Exception):
    """An answer whose `warnings` say it misses data (`partial_warnings`)."""

    def __init__(self, warnings: list[str]) -> None:
        super().__init__("; ".join(warnings))
        self.warnings = warnings


def partial_warnings(warnings: Any) -> list[str]:
    """The entries of an answer's `warnings` that say data is missing: every entry but
    Prometheus's PromQL annotations (module doc); a `warnings` that is not a list of
    strings is one such entry (its `repr`). [] when there is none (None or [])."""
    if warnings is None:
        return []
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        return [repr(warnings)]
    return [w for w in warnings if not w.startswith(ANNOTATION_PREFIXES)]


def check_warnings(warnings: Any) -> None:
    """Raise `PartialAnswerError` when `partial_warnings(warnings)` has any."""
    if warnings:
        partial = partial_warnings(warnings)
        if partial:
            raise PartialAnswerError(partial)


class _Value(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """A sample's `[timestamp, "value"]` (Unix seconds, the value's text); exactly two
    elements (without `forbid_unknown_fields` msgspec would ignore a third)."""

    ts: float
    text: str


_NO_LABEL: Final = "no-namespace-label"
"""The name `.metric.ns` decodes from without a namespace label: no valid label name."""


class AnswerDecoder:
    """Decodes query API bodies for one model label and namespace label (`samples`)."""

    def __init__(self, model_label: str, namespace_label: str | None = None) -> None:
        metric = msgspec.defstruct(
            "Metric",
            [
                ("model", str | None, None),
                ("signal", Literal[TAGS] | None, None),  # type: ignore[valid-type]
                ("le", str | None, None),
                ("ns", str | None, None),
            ],
            rename={
                "model": model_label,
                "signal": SIGNAL_LABEL,
                "ns": namespace_label or _NO_LABEL,
            },
            gc=False,
        )
        sample = msgspec.defstruct("Sample", [("metric", metric), ("value", _Value)], gc=False)
        data = msgspec.defstruct("Data", [("result", list[sample])], gc=False)  # type: ignore[valid-type]
        envelope = msgspec.defstruct(
            "Envelope", [("data", data), ("warnings", list[str] | None, None)], gc=False
        )
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(envelope)

    def samples(self, body: bytes) -> list[Any] | None:
        """The samples of `body` (records with `.metric.model`, `.metric.signal`,
        `.metric.le`, `.metric.ns` (the namespace), None when absent, and `.value.text`);
        None when the body is not an instant vector of the exact shape Prometheus writes
        (module doc). Raises `PartialAnswerError` when its `warnings` say it misses data."""
        try:
            envelope = self._decoder.decode(body)
        except (msgspec.DecodeError, ValueError, TypeError):
            return None
        if envelope.warnings:
            check_warnings(envelope.warnings)
        result: list[Any] = envelope.data.result
        return result


def rows_from_samples(
    samples: list[Any], faults: Faults, into: Rows | None = None, scopes: ScopeKeys | None = None
) -> Rows | None:
    """Index decoded samples into rows, model -> signal -> value, added to `into` when
    given, as `estimators.answers.parse_tagged` does (a duplicated signal NaN and
    recorded in `faults`, as is a value that is not a number of a sample naming a
    model; models keyed by `scopes` when given). None when a sample naming no model has
    a value that is not a number: the caller then parses generically, which fails the
    answer with the sample named (the rows written so far do not matter then)."""
    rows: Rows = {} if into is None else into
    for s in samples:
        m = s.metric
        model = m.model
        if scopes is not None and model is not None:
            model = scopes.key(model, m.ns)
            if model is None:
                continue
        try:
            value = float(s.value.text)
        except ValueError:
            if model is None:
                return None
            faults.setdefault(model, {})[m.signal or UNTAGGED] = not_a_number(s.value.text)
            continue
        signal = m.signal
        if model is None or signal is None:
            continue
        row = rows.get(model)
        if row is None:
            rows[model] = {signal: value}
        elif signal in row:
            row[signal] = NAN
            duplicated(faults, model, signal)
        else:
            row[signal] = value
    return rows


def buckets_from_samples(
    samples: list[Any], faults: Faults, scopes: ScopeKeys | None = None
) -> BucketIndex | None:
    """Index decoded bucket samples: tag -> model -> {`le` text: value}, as
    `estimators.answers.index_buckets` does (series without the model label, the tag or
    `le` skipped; a repeated `le` NaN; a value that is not a number recorded in `faults`
    against the model its sample names; models keyed by `scopes` when given). None as
    `rows_from_samples` says."""
    table: BucketIndex = {}
    for s in samples:
        m = s.metric
        model = m.model
        if scopes is not None and model is not None:
            model = scopes.key(model, m.ns)
            if model is None:
                continue
        try:
            value = float(s.value.text)
        except ValueError:
            if model is None:
                return None
            faults.setdefault(model, {})[m.signal or UNTAGGED] = not_a_number(s.value.text)
            continue
        signal = m.signal
        le = m.le
        if model is None or signal is None or le is None:
            continue
        column = table.get(signal)
        if column is None:
            column = table[signal] = {}
        by_le = column.get(model)
        if by_le is None:
            column[model] = {le: value}
        else:
            by_le[le] = NAN if le in by_le else value
    return table
