"""Unit tests of the PromQL templates (estimators/promql.py): exact text, label names,
windows, and the constant query set. No server needed."""

from __future__ import annotations

import re

import pytest

from estimators.promql import (
    ITL_METRICS,
    QUANTILES,
    SIGNAL_LABEL,
    TTFT_METRICS,
    QueryBuilder,
    Signal,
    le_regex,
    le_spellings,
    promql_duration,
    quantile_signal,
    queries_of,
)

ONCE = "max by (model_name, namespace, instance, engine, le, finished_reason, reason)"
"""Each engine series of each pod once (several jobs scraping one pod), then the sum."""


def test_quantile_is_promqls_histogram_quantile_exact_text() -> None:
    q = queries_of(QueryBuilder(accept_escaped=False))
    expected = (
        f"histogram_quantile(0.95, sum by (model_name, namespace, le) "
        f"({ONCE} (rate(vllm:time_to_first_token_seconds_bucket[60s]))))"
    )
    assert f'label_replace({expected}, "governor_signal", "ttft_p95", "", "")' in q.quantiles


def test_bucket_rates_with_escaped_names() -> None:
    assert QueryBuilder(window_s=30).buckets(TTFT_METRICS) == (
        f"sum by (model_name, namespace, le) ({ONCE} "
        "(rate(vllm:time_to_first_token_seconds_bucket[30s])"
        " or rate(vllm_time_to_first_token_seconds_bucket[30s])))"
    )


def test_itl_accepts_current_then_deprecated_name_in_one_query() -> None:
    assert QueryBuilder(accept_escaped=False).buckets(ITL_METRICS) == (
        f"sum by (model_name, namespace, le) ({ONCE} "
        "(rate(vllm:inter_token_latency_seconds_bucket[60s])"
        " or rate(vllm:time_per_output_token_seconds_bucket[60s])))"
    )


def test_every_quantile_appears_once_in_its_query() -> None:
    queries = queries_of(QueryBuilder())
    q = queries.quantiles
    assert "ttft_p95" in queries.ttft_quantiles and "ttft_p95" not in queries.itl_quantiles
    assert "decode_p95" in queries.other_quantiles
    for hist, _, qs in QUANTILES:
        for p in qs:
            assert q.count(f'"{SIGNAL_LABEL}", "{quantile_signal(hist, p)}"') == 1, (hist, p)
    assert quantile_signal("ttft", 0.99) == "ttft_p99"


def test_sla_edge_buckets_fetch_only_the_thresholds_and_the_count() -> None:
    q = queries_of(QueryBuilder(accept_escaped=False), {"ttft": [0.25], "itl": [0.05, 1.0]})
    assert (
        f"label_replace(sum by (model_name, namespace, le) ({ONCE} "
        "(rate(vllm:time_to_first_token_seconds_bucket"
        '{le=~`0\\.25|\\+Inf`}[60s]))), "governor_signal", "ttft", "", "")'
    ) in q.sla_buckets
    assert "{le=~`0\\.05|1\\.0|1|\\+Inf`}" in q.sla_buckets  # ITL: both thresholds
    assert "rate(vllm:request_time_per_output_token_seconds_bucket{le=~`\\+Inf`}" in q.sla_buckets


@pytest.mark.parametrize(
    ("bound", "spellings"),
    [(0.05, ["0.05"]), (1.0, ["1.0", "1"]), (2560.0, ["2560.0", "2560"]), (1e-5, ["1e-05"])],
)
def test_le_spellings_cover_python_and_go_clients(bound: float, spellings: list[str]) -> None:
    assert le_spellings(bound) == spellings
    for s in spellings:
        assert re.fullmatch(le_regex([bound]), s)
    assert re.fullmatch(le_regex([bound]), "+Inf")
    assert not re.fullmatch(le_regex([bound]), "0.5")


def test_le_regex_skips_values_that_are_no_threshold() -> None:
    assert le_regex([float("nan"), float("inf"), 0.0, -1.0]) == "\\+Inf"


def test_kv_usage_accepts_both_names() -> None:
    state = queries_of(QueryBuilder(accept_escaped=False)).state
    assert (
        f"label_replace(avg by (model_name, namespace) ({ONCE} (vllm:kv_cache_usage_perc or "
        'vllm:gpu_cache_usage_perc)), "governor_signal", "kv_usage_frac", "", "")'
    ) in state


def test_demand_query_exact_text() -> None:
    b = QueryBuilder(window_s=60, accept_escaped=False, seed_window_s=None, scrape_interval_s=5)
    by = "sum by (model_name, namespace)"
    completions = f"{by} ({ONCE} (rate(vllm:request_success_total[60s])))"
    # The slope of the fleet's sum, one point a scrape (not the sum of per-engine slopes).
    growth = (
        f"deriv(({by} ({ONCE} (vllm:num_requests_waiting)))[60s:5s]) + "
        f"deriv(({by} ({ONCE} (vllm:num_requests_running)))[60s:5s])"
    )
    rejected = f"{by} ({ONCE} (rate(vllm:admission_rejections_total[60s])))"
    served = f"{completions} + {growth}"
    assert b.demand() == (
        f"label_replace((clamp_min({served} + {rejected}, 0) or clamp_min({served}, 0) "
        f"or {completions}), "
        f'"governor_signal", "arrival_rps", "", "") or '
        f'label_replace({completions}, "governor_signal", "completions_rps", "", "")'
    )


def test_model_label_is_substituted_everywhere() -> None:
    queries = dict(queries_of(QueryBuilder(model_label="served_model", window_s=15)).items())
    for name, text in queries.items():
        assert "model_name" not in text, name
        assert "served_model" in text, name
        assert "[15s]" in text or name == "state", name
    assert "sum by (served_model, namespace, le) (" in queries["itl_quantiles"]


def test_eight_queries_naming_no_model() -> None:
    queries = dict(queries_of(QueryBuilder(), {"ttft": [1.0]}).items())
    assert len(queries) == 8
    assert next(iter(queries)) == "demand"
    for text in queries.values():
        assert "model_name=" not in text  # no per-model selectors
        assert text.count("=~") == text.count("{le=~")  # the only regexes pick buckets


INGRESS = "sum by (model_name) (rate(inference_model_request_total[{window}]))"


def test_every_tagged_signal_appears_once() -> None:
    q = queries_of(QueryBuilder(short_window_s=10, ingress_rate_query=INGRESS))
    tagged = q.demand + q.state + q.rates
    for signal in Signal:
        assert tagged.count(f'"{SIGNAL_LABEL}", "{signal.value}"') == 1, signal


def test_short_window_is_optional_and_uses_its_own_range() -> None:
    plain, short = (
        queries_of(QueryBuilder(window_s=60)),
        queries_of(QueryBuilder(window_s=60, short_window_s=10)),
    )
    assert Signal.ARRIVAL_SHORT_RPS.value not in plain.demand
    assert "[10s]" in short.demand and "[10s]" not in plain.demand
    assert len(list(short.items())) == len(list(plain.items()))


def test_seed_window_rides_in_the_demand_query() -> None:
    q = queries_of(QueryBuilder(window_s=60))
    assert Signal.ARRIVAL_SEED_RPS.value in q.demand and "[300s]" in q.demand
    assert Signal.ARRIVAL_SEED_RPS.value not in queries_of(QueryBuilder(seed_window_s=None)).demand


def test_ingress_rate_rides_in_the_demand_query_over_the_window() -> None:
    q = queries_of(QueryBuilder(window_s=45, ingress_rate_query=INGRESS))
    tagged = (
        "label_replace((sum by (model_name) (rate(inference_model_request_total[45s]))), "
        f'"{SIGNAL_LABEL}", "{Signal.INGRESS_RPS.value}", "", "")'
    )
    assert f" or {tagged}" in q.demand
    assert Signal.INGRESS_RPS.value not in queries_of(QueryBuilder(window_s=45)).demand
    assert len(list(q.items())) == len(list(queries_of(QueryBuilder()).items()))  # no extra query


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("sum by (model_name) (rate(gw_requests_total[1m]))", "must contain {window}"),
    ],
)
def test_bad_ingress_queries_are_refused_naming_the_problem(query: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        queries_of(QueryBuilder(ingress_rate_query=query))


def test_targets_are_pods_joined_with_up_on_instance() -> None:
    """A target is a pod (`instance`), whichever jobs scrape it: two jobs are not two."""
    state = queries_of(QueryBuilder(accept_escaped=False, window_s=60)).state
    engines = (
        "group by (model_name, namespace, instance) "
        "(last_over_time(vllm:num_requests_running[300s]))"
    )
    health = f"({engines} * on (instance) group_left () max by (instance) (up))"
    assert f"sum by (model_name, namespace) {health}" in state
    assert f"count by (model_name, namespace) {health}" in state
    assert f"count by (model_name, namespace) ({engines})" in state  # seen within the lookback
    lb = queries_of(QueryBuilder(targets_lookback_s=120)).state
    assert "[120s]" in lb and "[300s]" not in lb


@pytest.mark.parametrize(
    ("seconds", "text"), [(60, "60s"), (60.0, "60s"), (5, "5s"), (2.5, "2500ms"), (0.001, "1ms")]
)
def test_duration_rendering(seconds: float, text: str) -> None:
    assert promql_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, -1, 0.0001, float("nan"), float("inf")])
def test_bad_windows_are_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="window"):
        queries_of(QueryBuilder(window_s=seconds))


@pytest.mark.parametrize("label", ["", "1model", "model-name", "a b", SIGNAL_LABEL, "le"])
def test_bad_label_names_are_refused(label: str) -> None:
    with pytest.raises(ValueError, match="label"):
        queries_of(QueryBuilder(model_label=label))


def test_namespace_label_groups_every_per_model_aggregation() -> None:
    """Every aggregation that keeps the model label keeps the namespace label with it
    (estimators/promql.py "Namespaces"); None groups by the model label alone."""
    scoped = dict(queries_of(QueryBuilder(namespace_label="kube_ns"), {"ttft": [1.0]}).items())
    plain = dict(queries_of(QueryBuilder(namespace_label=None), {"ttft": [1.0]}).items())
    for name, text in scoped.items():
        grouped = re.findall(r"(?:sum|avg|count|max|group) by \(([^)]*)\)", text)
        per_model = [g for g in grouped if "model_name" in g]
        assert per_model, name
        assert all("kube_ns" in g for g in per_model), (name, per_model)
        assert "kube_ns" not in plain[name], name
    with pytest.raises(ValueError, match="both 'model_name'"):
        QueryBuilder(namespace_label="model_name")
    with pytest.raises(ValueError, match="invalid namespace label name 'le'"):
        QueryBuilder(namespace_label="le")
