"""The chart's recording rules are exactly the rules the governor's recorded queries read
(`QueryBuilder.recording_rules` for the chart's window and model label), so the marker
the governor trusts is never on rules that compute something else."""

from __future__ import annotations

from typing import Any

import pytest

from estimators.promql import QueryBuilder
from tests.helm.chart import deep_merge, one, render, values

GROUP = "llm-governor.recording"


def chart_recording_group(**overrides: Any) -> dict[str, Any] | None:
    """The rendered recording group (None when the chart renders none)."""
    monitoring = {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    vals = deep_merge(values(monitoring=monitoring), overrides)
    groups = one(render(vals), "PrometheusRule")["spec"]["groups"]
    return next((g for g in groups if g["name"] == GROUP), None)


@pytest.mark.parametrize(
    ("policy", "prometheus", "label", "ns_label", "window_s"),
    [
        ({}, {}, "model_name", "namespace", 60.0),
        ({"window_s": 45}, {"model_label": "served_model"}, "served_model", "namespace", 45.0),
        ({"window_s": 37.5}, {}, "model_name", "namespace", 37.5),
        ({}, {"namespace_label": "kube_ns"}, "model_name", "kube_ns", 60.0),
        ({}, {"namespace_label": None}, "model_name", None, 60.0),
    ],
)
def test_rendered_rules_are_the_governors(
    policy: dict[str, Any],
    prometheus: dict[str, Any],
    label: str,
    ns_label: str | None,
    window_s: float,
) -> None:
    group = chart_recording_group(policy=policy, prometheus=prometheus)
    assert group is not None
    builder = QueryBuilder(model_label=label, window_s=window_s, namespace_label=ns_label)
    expected = builder.recording_rules()
    assert group["rules"] == expected
    assert group["interval"] == "15s"  # the monitors' scrape interval: no staler than data


def test_recording_rules_can_be_turned_off() -> None:
    monitoring = {"prometheusRule": {"recordingRules": False}}
    assert chart_recording_group(monitoring=monitoring) is None


@pytest.mark.parametrize(
    ("monitoring", "prometheus", "interval"),
    [
        ({"serviceMonitor": {"enabled": True, "interval": "30s"}}, {}, "30s"),
        ({"serviceMonitor": {"enabled": False, "interval": "60s"}}, {}, "15s"),
        ({"serviceMonitor": {"enabled": False}}, {"scrape_interval_s": 5}, "5s"),
        ({"serviceMonitor": {"enabled": False}}, {"scrape_interval_s": 7.5}, "7500ms"),
    ],
)
def test_rules_run_at_the_scrape_interval_the_governor_reads_them_by(
    monitoring: dict[str, Any], prometheus: dict[str, Any], interval: str
) -> None:
    """The governor reads a recorded series only while it is at most 3 of its
    prometheus.scrape_interval_s old (estimators/prometheus.py RULES_MAX_AGE_INTERVALS):
    found in review, without the chart's monitors the rules ran at the monitors'
    interval setting anyway, e.g. every 15 s for a governor told its engines are scraped
    every 5 s, whose recorded quantiles then read as no data most of the time."""
    group = chart_recording_group(monitoring=monitoring, prometheus=prometheus)
    assert group is not None and group["interval"] == interval
