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
    ("policy", "prometheus", "label", "window_s"),
    [
        ({}, {}, "model_name", 60.0),
        ({"window_s": 45}, {"model_label": "served_model"}, "served_model", 45.0),
        ({"window_s": 37.5}, {}, "model_name", 37.5),
    ],
)
def test_rendered_rules_are_the_governors(
    policy: dict[str, Any], prometheus: dict[str, Any], label: str, window_s: float
) -> None:
    group = chart_recording_group(policy=policy, prometheus=prometheus)
    assert group is not None
    expected = QueryBuilder(model_label=label, window_s=window_s).recording_rules()
    assert group["rules"] == expected
    assert group["interval"] == "15s"  # the monitors' scrape interval: no staler than data


def test_recording_rules_can_be_turned_off() -> None:
    monitoring = {"prometheusRule": {"recordingRules": False}}
    assert chart_recording_group(monitoring=monitoring) is None
