"""The body path (`estimators.decode`) reads every answer as the generic path does.

`PrometheusSource` decodes an answer's HTTP body itself when its client has `query_body`
(the default client does) and falls back to orjson + the generic parser
(`estimators.answers`) for any body not of the exact shape Prometheus writes. Contract:
for every answer set, the same outcomes, bit for bit (compared by `repr`, so -0.0, NaN
and every float's last bit count, and the detail of every NoDataError: a malformed or
duplicated series of one model), and for every malformed answer the same SourceError
(message and query) as a client that decodes the body itself (`custom_query`). The
answers are crafted and fed through fake clients: the parsers are what is checked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import pytest

from estimators.prometheus import PrometheusSource
from estimators.promql import SIGNAL_LABEL, Signal
from estimators.types import ModelQuery, SourceError
from tests.integration.test_prometheus_failures import (
    ITL_OK,
    MODELS,
    NOW,
    A,
    B,
    FakeClient,
    buckets,
    healthy_answers,
    tagged,
)


class BodyClient(FakeClient):
    """`FakeClient` that answers `query_body` with the query API's JSON body; an answer
    that is `bytes` is sent as it is (a body that need not be JSON)."""

    def query_body(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bytes:
        answer = self.custom_query(query, params)
        if isinstance(answer, bytes):
            return answer
        return json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": answer}}
        ).encode()


class DecodingClient(FakeClient):
    """`FakeClient` that decodes a `bytes` answer as PrometheusConnect over the default
    client's session does (orjson, then `["data"]["result"]`)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        answer = super().custom_query(query, params)
        return orjson.loads(answer)["data"]["result"] if isinstance(answer, bytes) else answer


def outcome(client_type: type[FakeClient], answers: Mapping[str, Any], **kw: Any) -> str:
    """`repr` of the observe's outcomes (sorted by model), or of its SourceError."""
    client = client_type(answers)
    src = client.bind(PrometheusSource("http://fake:9090", client=client, **kw))
    models = [*MODELS, ModelQuery("model-c", 0.1, 0.05)]
    try:
        return repr(sorted(src.observe(models, NOW).items()))
    except SourceError as exc:
        return f"SourceError({exc!s}, query={exc.query is not None})"


def _added(group: str, *samples: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """The healthy answers with `samples` added to answer `group`."""

    def build() -> dict[str, Any]:
        answers = healthy_answers()
        answers[group] = [*answers[group], *samples]
        return answers

    return build


def _a(signal: str, value: Any, key: str = "value") -> dict[str, Any]:
    """A sample of model A's `signal` whose `key` is `value` (any shape)."""
    return {"metric": {"model_name": A, SIGNAL_LABEL: signal}, key: value}


def _with(**changes: Any) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        answers = healthy_answers()
        answers.update(changes)
        return answers

    return build


def _everything(value: str) -> dict[str, Any]:
    """Every signal of model A answered `value` (NaN, infinities, -0, odd spellings)."""
    answers = healthy_answers()
    answers["demand"] = [tagged(A, s, value) for s in ("arrival_rps", "arrival_short_rps")]
    answers["demand"] += [tagged(B, Signal.ARRIVAL_RPS, 3)]
    answers["state"] = [tagged(A, s, value) for s in Signal] + answers["state"][9:]
    answers["rates"] = [tagged(A, s, value) for s in Signal]
    answers["itl_quantiles"] = [tagged(A, f"itl_p{p}", value) for p in (50, 90, 95, 99)]
    answers["sla_buckets"] = buckets(A, [("0.05", value), ("+Inf", 10.0)])
    return answers


VALUES = [
    "NaN",
    "+Inf",
    "-Inf",
    "-0",
    "0",
    "1e-05",
    "1E5",
    "12.500000000000001",
    " 1",
    "1_0",
    "Infinity",
    "nan",
]

ANSWER_SETS: dict[str, Callable[[], dict[str, Any]]] = {
    "healthy": healthy_answers,
    **{f"every value {v!r}": (lambda v=v: _everything(v)) for v in VALUES},
    "numbers, not strings": _with(
        demand=[{"metric": {"model_name": A, SIGNAL_LABEL: "arrival_rps"}, "value": [NOW, 2]}]
    ),
    "a timestamp that is a string": _with(
        demand=[{"metric": {"model_name": A, SIGNAL_LABEL: "arrival_rps"}, "value": ["x", "2"]}]
    ),
    "extra labels and keys": _with(
        demand=[
            {
                "metric": {"model_name": A, SIGNAL_LABEL: "arrival_rps", "job": "j"},
                "value": [NOW, "2"],
                "histogram": 1,
            }
        ]
    ),
    "a label that is a number": _with(
        demand=[{"metric": {"model_name": 7, SIGNAL_LABEL: "arrival_rps"}, "value": [NOW, "2"]}]
    ),
    "a null label": _with(
        demand=[{"metric": {"model_name": None, SIGNAL_LABEL: "arrival_rps"}, "value": [NOW, "2"]}]
    ),
    "no tag, no model": _with(
        demand=[
            {"metric": {"model_name": A}, "value": [NOW, "2"]},
            {"metric": {}, "value": [NOW, "2"]},
        ]
    ),
    "an empty model": _with(demand=[tagged("", Signal.ARRIVAL_RPS, 2)]),
    "a tag in two answers of a group": _with(
        itl_quantiles=[tagged(A, "ttft_p95", 1)], ttft_quantiles=[tagged(A, "ttft_p95", 2)]
    ),
    "a duplicated optional signal": _added("state", tagged(A, Signal.WAITING, 300)),
    "a duplicated bucket": _added("sla_buckets", *buckets(A, [("0.05", 1.0)])),
    "buckets summed, unsorted, noisy": _with(
        sla_buckets=buckets(A, [("+Inf", 10), ("0.05", 4), ("5e-2", 5), ("0.1", 3)])
    ),
    "buckets: no le, bad le, NaN le": _with(
        sla_buckets=[
            *buckets(A, [("x", 1), ("NaN", 2), ("0.05", 9), ("+Inf", 10)]),
            {"metric": {"model_name": A, SIGNAL_LABEL: "itl"}, "value": [NOW, "1"]},
        ]
    ),
    "buckets: a number le": _with(
        sla_buckets=[
            {"metric": {"model_name": A, "le": 0.05, SIGNAL_LABEL: "itl"}, "value": [NOW, "9"]}
        ]
    ),
    "buckets: an infinite rate": _with(
        sla_buckets=buckets(A, [("0.05", "+Inf"), ("+Inf", 10)]) + buckets(B, ITL_OK)
    ),
    "buckets: of another tag": _with(
        sla_buckets=buckets(A, ITL_OK, hist="ttft") + buckets(B, ITL_OK, hist="tpot")
    ),
}

MODEL_FAULTS: dict[str, Callable[[], dict[str, Any]]] = {
    # model A no data (the same detail on both paths), model B observed
    "a value that is not a number": _added("state", tagged(A, Signal.RUNNING, "abc")),
    "a bucket value that is not a number": _added("sla_buckets", *buckets(A, [("0.1", "abc")])),
    "a null value": _added("rates", _a("waiting", [NOW, None])),
    "three-part value": _added("rates", _a("waiting", [NOW, "1", "2"])),
    "a bare string value": _added("demand", _a("arrival_rps", "90")),
    "a bare number value": _added("demand", _a("arrival_rps", 90)),
    "a boolean value": _added("demand", _a("arrival_rps", [NOW, True])),
    "a matrix": _added("state", _a("running", [[NOW, "1"]], key="values")),
    "an untagged sample that is not a number": _added(
        "state", {"metric": {"model_name": A}, "value": [NOW, "x"]}
    ),
    "a duplicated demand": _added("demand", tagged(A, Signal.ARRIVAL_RPS, 0)),
    "a duplicated target count": _added("state", tagged(A, Signal.TARGETS_UP, 0)),
}

SOURCE_ERRORS: dict[str, Callable[[], dict[str, Any]]] = {
    # malformed: a SourceError naming the query, the same message
    "a value that is not a number, no model": _with(
        state=[{"metric": {SIGNAL_LABEL: "running"}, "value": [NOW, "abc"]}]
    ),
    "a bucket value that is not a number, no model": _with(
        sla_buckets=[{"metric": {"le": "0.05", SIGNAL_LABEL: "itl"}, "value": [NOW, "x"]}]
    ),
    "a bare value, no model": _with(rates=[{"metric": {"model_name": None}, "value": "1"}]),
    "not a list": _with(state={"resultType": "vector"}),
    "a scalar": _with(state=[NOW, "1"]),
    "no labels": _with(state=[{"value": [NOW, "1"]}]),
    "labels not an object": _with(state=[{"metric": "x", "value": [NOW, "1"]}]),
    "null result": _with(state=None),
    "a body that is not JSON": _with(rates=b"<html>not json</html>"),
    "a body without data": _with(rates=b'{"status": "success"}'),
    "a body that is a list": _with(rates=b"[]"),
    "a body with invalid UTF-8": _with(
        rates=b'{"data": {"result": [{"metric": {"model_name": "\xff"}, "value": [1, "2"]}]}}'
    ),
    "a client failure": _with(rates=RuntimeError("boom")),
}


@pytest.mark.parametrize("name", [*ANSWER_SETS, *MODEL_FAULTS, *SOURCE_ERRORS])
def test_body_path_reads_every_answer_as_the_generic_path(name: str) -> None:
    answers = (ANSWER_SETS | MODEL_FAULTS | SOURCE_ERRORS)[name]()
    body = outcome(BodyClient, answers, window_s=30)
    assert body == outcome(DecodingClient, answers, window_s=30)
    assert body.startswith("SourceError") == (name in SOURCE_ERRORS), body
    if name in MODEL_FAULTS:
        assert body.startswith("[('model-a', NoDataError("), body
        assert "('model-b', Observation(" in body, body


def test_the_fast_path_takes_prometheus_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    """A healthy answer is not re-read by the generic path (its parser is never called)."""
    import estimators.prometheus as prom

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("generic path used")

    monkeypatch.setattr(prom, "parse_tagged", refuse)
    monkeypatch.setattr(prom, "parse_edge_buckets", refuse)
    assert outcome(BodyClient, healthy_answers()).startswith("[('model-a', Observation(")
    with pytest.raises(AssertionError, match="generic path"):
        outcome(DecodingClient, healthy_answers())


def test_every_tag_the_queries_write_is_decoded_on_the_fast_path() -> None:
    """A tag missing from `estimators.decode.TAGS` would send every body to the generic
    path (right, but slow): every tag of every query mode is listed."""
    import re

    from estimators.decode import TAGS
    from estimators.promql import QueryBuilder, queries_of

    tags: set[str] = set()
    for recorded in (False, True):
        b = QueryBuilder(short_window_s=10, recorded=recorded, gauge_lookback_s=30)
        edges = {"ttft": [0.5], "itl": [0.05], "tpot": [0.05]}
        queries = queries_of(b, edges, rules_marker=True)
        for _name, text in queries.items():
            tags |= set(re.findall(f'"{SIGNAL_LABEL}", "([^"]+)"', text))
    assert len(tags) >= 40 and tags <= set(TAGS), tags - set(TAGS)


STORE_ERROR = (
    'receive series from Addr: 10.0.3.7:10901 LabelSets: {cluster="eu-2"}: rpc error: '
    "code = Unavailable desc = connection error"
)
LE_WARNING = (
    'PromQL warning: bucket label "le" is missing or has a malformed value of "x" for '
    'metric name "vllm:inter_token_latency_seconds_bucket" (1:24)'
)
MONOTONICITY_INFO = (
    "PromQL info: input to histogram_quantile needed to be fixed for monotonicity (see "
    "https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile) "
    'for metric name "vllm:time_to_first_token_seconds_bucket" (1:31)'
)
WARNINGS: dict[str, tuple[dict[str, Any], str | None]] = {
    # name: (keys added to the body's envelope, the SourceError's warnings; None: read)
    "thanos partial response: a store did not answer": ({"warnings": [STORE_ERROR]}, STORE_ERROR),
    "thanos: no store matched": (
        {"warnings": ["No StoreAPIs matched for this query"]},
        "No StoreAPIs matched for this query",
    ),
    "prometheus: a remote read failed": (
        {"warnings": ['error sending request: Post "http://remote:9201/read": EOF']},
        'error sending request: Post "http://remote:9201/read": EOF',
    ),
    "an annotation and a store error": ({"warnings": [LE_WARNING, STORE_ERROR]}, STORE_ERROR),
    "a truncated list": (
        {"warnings": [LE_WARNING, "2 more warnings omitted"]},
        "2 more warnings omitted",
    ),
    "warnings not a list": ({"warnings": "partial"}, "'partial'"),
    "a warning that is not a string": ({"warnings": [7]}, "[7]"),
    "PromQL annotations (Prometheus 2.48 to 2.53: all in warnings)": (
        {"warnings": [LE_WARNING, MONOTONICITY_INFO]},
        None,
    ),
    "infos (Prometheus 2.54 on)": ({"infos": [MONOTONICITY_INFO]}, None),
    "infos that are not PromQL annotations": ({"infos": [STORE_ERROR]}, None),
    "no warnings": ({"warnings": []}, None),
    "null warnings": ({"warnings": None}, None),
}


@pytest.mark.parametrize("group", ["demand", "itl_quantiles", "sla_buckets"])
@pytest.mark.parametrize("name", list(WARNINGS))
def test_warnings_of_a_partial_answer_fail_the_tick_on_both_paths(
    name: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body whose `warnings` say data is missing (anything but Prometheus's PromQL
    annotations: a store of Thanos that did not answer, a failed remote read) is a
    SourceError naming the query, on the fast path and on the generic path alike; PromQL
    annotations and `infos` do not change the outcome. One answer of the tick carries
    the warnings (the first, a middle and the last query)."""
    import estimators.decode as dec
    import estimators.prometheus as prom

    extra, partial = WARNINGS[name]
    answers = healthy_answers()
    answers[group] = json.dumps(
        {"status": "success", **extra, "data": {"resultType": "vector", "result": answers[group]}}
    ).encode()
    with monkeypatch.context() as m:  # a Prometheus body: the generic parser is not used
        if isinstance(extra.get("warnings", []), list) and extra.get("warnings") != [7]:
            m.setattr(prom, "parse_tagged", _refuse)
            m.setattr(prom, "parse_edge_buckets", _refuse)
        fast = outcome(BodyClient, answers, window_s=30)
    with monkeypatch.context() as m:  # every body through orjson and the generic parser
        m.setattr(dec.AnswerDecoder, "samples", lambda _self, _body: None)
        generic = outcome(BodyClient, answers, window_s=30)
    assert fast == generic
    if partial is not None:
        assert fast.startswith(f"SourceError(partial answer, warnings: {partial} [query: "), fast
        assert fast.endswith(", query=True)"), fast
    else:
        assert fast == outcome(BodyClient, healthy_answers(), window_s=30)


def _refuse(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("generic path used")
