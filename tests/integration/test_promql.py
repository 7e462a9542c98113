"""Unit tests of the PromQL templates (estimators/promql.py): exact text, label names,
windows, and the constant query set. No server needed."""

from __future__ import annotations

import pytest

from estimators.promql import (
    SIGNAL_LABEL,
    QueryBuilder,
    Signal,
    build_queries,
    promql_duration,
)


def test_ttft_bucket_query_exact_text() -> None:
    q = build_queries(accept_escaped=False)
    assert q.ttft_buckets == (
        "sum by (model_name, le) (rate(vllm:time_to_first_token_seconds_bucket[60s]))"
    )


def test_ttft_bucket_query_with_escaped_names() -> None:
    q = build_queries(window_s=30)
    assert q.ttft_buckets == (
        "sum by (model_name, le) (rate(vllm:time_to_first_token_seconds_bucket[30s])"
        " or rate(vllm_time_to_first_token_seconds_bucket[30s]))"
    )


def test_itl_accepts_current_then_deprecated_name_in_one_query() -> None:
    q = build_queries(accept_escaped=False)
    assert q.itl_buckets == (
        "sum by (model_name, le) (rate(vllm:inter_token_latency_seconds_bucket[60s])"
        " or rate(vllm:time_per_output_token_seconds_bucket[60s]))"
    )


def test_kv_usage_accepts_both_names() -> None:
    state = build_queries(accept_escaped=False).state
    assert (
        "label_replace(avg by (model_name) (vllm:kv_cache_usage_perc or "
        'vllm:gpu_cache_usage_perc), "governor_signal", "kv_usage_frac", "", "")'
    ) in state


def test_demand_query_exact_text() -> None:
    b = QueryBuilder(window_s=60, accept_escaped=False)
    completions = "sum by (model_name) (rate(vllm:request_success_total[60s]))"
    growth = (
        "sum by (model_name) (deriv(vllm:num_requests_waiting[60s])) + "
        "sum by (model_name) (deriv(vllm:num_requests_running[60s]))"
    )
    assert b.demand() == (
        f"label_replace((clamp_min({completions} + {growth}, 0) or {completions}), "
        f'"governor_signal", "arrival_rps", "", "") or '
        f'label_replace({completions}, "governor_signal", "completions_rps", "", "")'
    )


def test_model_label_is_substituted_everywhere() -> None:
    queries = dict(build_queries(model_label="served_model", window_s=15).items())
    for name, text in queries.items():
        assert "model_name" not in text, name
        assert "served_model" in text, name
        assert "[15s]" in text or name == "state", name
    assert queries["itl_buckets"].startswith("sum by (served_model, le) (")


def test_ten_queries_naming_no_model() -> None:
    queries = dict(build_queries().items())
    assert len(queries) == 10
    assert next(iter(queries)) == "demand"
    for text in queries.values():
        assert "model_name=" not in text and "=~" not in text  # no per-model selectors


def test_every_tagged_signal_appears_once() -> None:
    q = build_queries(short_window_s=10)
    tagged = q.demand + q.state + q.rates + q.token_means
    for signal in Signal:
        assert tagged.count(f'"{SIGNAL_LABEL}", "{signal.value}"') == 1, signal


def test_short_window_is_optional_and_uses_its_own_range() -> None:
    plain, short = build_queries(window_s=60), build_queries(window_s=60, short_window_s=10)
    assert Signal.ARRIVAL_SHORT_RPS.value not in plain.demand
    assert "[10s]" in short.demand and "[10s]" not in plain.demand
    assert len(list(short.items())) == len(list(plain.items()))


@pytest.mark.parametrize(
    ("seconds", "text"), [(60, "60s"), (60.0, "60s"), (5, "5s"), (2.5, "2500ms"), (0.001, "1ms")]
)
def test_duration_rendering(seconds: float, text: str) -> None:
    assert promql_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, -1, 0.0001, float("nan"), float("inf")])
def test_bad_windows_are_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="window"):
        build_queries(window_s=seconds)


@pytest.mark.parametrize("label", ["", "1model", "model-name", "a b", SIGNAL_LABEL, "le"])
def test_bad_label_names_are_refused(label: str) -> None:
    with pytest.raises(ValueError, match="label"):
        build_queries(model_label=label)
