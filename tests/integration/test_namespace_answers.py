"""Answers grouped by (model, namespace) are read per model's namespace, alike on both
parse paths (`estimators.answers.ScopeKeys`; the body path of `estimators.decode` and the
generic path). Crafted answers through the fake clients of test_answer_bodies; the
real-Prometheus counterpart is test_namespaces.

Rule checked: a series of the model's namespace is its own; one of another namespace is
skipped with its faults; label-less series stand in only for a model whose namespace
has none (two fleets are never mixed signal by signal), except the ingress rate, read
either way; a model whose namespace is unknown takes every namespace (two: duplicated).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from estimators.prometheus import PrometheusSource
from estimators.promql import Signal
from estimators.types import ModelQuery, NoDataError, Observation, ObservationResult
from tests.integration.test_answer_bodies import BodyClient
from tests.integration.test_prometheus_failures import (
    NOW,
    A,
    B,
    FakeClient,
    buckets,
    healthy_answers,
    tagged,
)

PROD, STAGING = "prod", "staging"


def _in(namespace: str, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`samples` copied with the namespace label set."""
    out = copy.deepcopy(samples)
    for s in out:
        s["metric"]["namespace"] = namespace
    return out


def _of(model: str, answers: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every sample of `model` in `answers`, by query name."""
    return {
        name: [s for s in samples if s["metric"].get("model_name") == model]
        for name, samples in answers.items()
    }


def _staging_a() -> dict[str, list[dict[str, Any]]]:
    """Model A's series in namespace staging: a busier fleet, its SLA edge all missed,
    and one malformed sample (which must not fault prod's A)."""
    other = _of(A, healthy_answers())
    other["state"] = [tagged(A, Signal.RUNNING, 99), tagged(A, Signal.TARGETS_UP, 9)]
    other["demand"] = [tagged(A, Signal.ARRIVAL_RPS, 500)]
    other["rates"] = [tagged(A, Signal.PROMPT_TOKENS_MEAN, "not a number")]
    other["sla_buckets"] = buckets(A, [("0.05", 0.0), ("+Inf", 10.0)])
    return {name: _in(STAGING, samples) for name, samples in other.items()}


def _answers(*extra: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    answers = healthy_answers()
    for more in extra:
        for name, samples in more.items():
            answers[name] = [*answers.get(name, []), *samples]
    return answers


def _observe(
    client_type: type[FakeClient], answers: dict[str, Any], namespace: str | None
) -> dict[str, ObservationResult]:
    client = client_type(answers)
    src = client.bind(PrometheusSource("http://fake:9090", client=client))
    models = [ModelQuery(A, 0.1, 0.05, namespace=namespace), ModelQuery(B, namespace=PROD)]
    return src.observe(models, NOW)


PATHS = pytest.mark.parametrize("client_type", [FakeClient, BodyClient], ids=["generic", "body"])


@PATHS
def test_another_namespace_is_skipped_with_its_faults(client_type: type[FakeClient]) -> None:
    plain = _observe(client_type, _answers(), PROD)
    out = _observe(client_type, _answers(_staging_a()), PROD)
    assert repr(out) == repr(plain)  # staging's series changed nothing, faults included
    a = out[A]
    assert isinstance(a, Observation) and a.running == 8 and a.arrival_rate_rps != 500
    assert a.itl_attainment_frac == pytest.approx(0.9)


def _prod_a(running: float = 3, without: tuple[str, ...] = ()) -> dict[str, list[dict[str, Any]]]:
    """Model A's whole fleet in namespace prod: the healthy series with `running`, its
    SLA edge half met, and the signals `without` left out."""
    own = _of(A, healthy_answers())
    for name, samples in own.items():
        kept = [s for s in samples if s["metric"].get("governor_signal") not in without]
        own[name] = _in(PROD, kept)
    for sample in own["state"]:
        if sample["metric"]["governor_signal"] == Signal.RUNNING.value:
            sample["value"][1] = str(running)
    own["sla_buckets"] = _in(PROD, buckets(A, [("0.05", 5.0), ("+Inf", 10.0)]))
    return own


@PATHS
def test_the_own_namespace_is_read_whole_and_the_ingress_from_label_less_series(
    client_type: type[FakeClient],
) -> None:
    ingress = {"demand": [tagged(A, Signal.INGRESS_RPS, 1)]}  # grouped by model alone
    answers = _answers(_staging_a(), _prod_a(without=(Signal.WAITING.value,)), ingress)
    out = _observe(client_type, answers, PROD)
    a = out[A]
    assert isinstance(a, Observation)
    assert a.running == 3  # prod's own, not the label-less 8 nor staging's 99
    assert a.waiting is None  # prod has none; the label-less fleet's 1 is another fleet's
    assert a.itl_attainment_frac == pytest.approx(0.5)  # prod's buckets
    assert a.ingress_rate_rps == 1.0
    assert isinstance(out[B], Observation)


@PATHS
def test_an_unknown_namespace_takes_every_one_two_are_duplicated(
    client_type: type[FakeClient],
) -> None:
    prod = {"demand": _in(PROD, [tagged(A, Signal.ARRIVAL_RPS, 20)])}
    out = _observe(client_type, _answers(_staging_a(), prod), None)
    a = out[A]
    assert isinstance(a, NoDataError) and a.signal == Signal.ARRIVAL_RPS.value
    assert isinstance(out[B], Observation)


@PATHS
def test_label_less_faults_are_the_models_only_where_its_namespace_has_no_series(
    client_type: type[FakeClient],
) -> None:
    """A malformed label-less sample is another fleet's where the model's namespace
    answers (even for a signal the namespace lacks); it makes the model no data where
    the label-less series are the model's."""
    bad = {"state": [tagged(A, Signal.WAITING, "abc")]}
    own = _prod_a(without=(Signal.WAITING.value,))
    ok = _observe(client_type, _answers(bad, own), PROD)[A]
    assert isinstance(ok, Observation) and ok.running == 3 and ok.waiting is None
    failed = _observe(client_type, _answers(bad), PROD)[A]
    assert isinstance(failed, NoDataError) and failed.signal == Signal.WAITING.value


def test_both_paths_read_the_same() -> None:
    prod = _prod_a()
    for answers in (_answers(_staging_a()), _answers(_staging_a(), prod)):
        for ns in (PROD, STAGING, None):
            generic = _observe(FakeClient, answers, ns)
            body = _observe(BodyClient, answers, ns)
            assert repr(generic) == repr(body), ns
