"""values.schema.json: its governor-config part is generated from controller/config.py and
must not be stale, and it accepts and refuses config values as the governor itself does
(checked with Helm's own schema validation against the governor's parse_config)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from controller.config import ConfigError, parse_config
from tests.helm.chart import CHART, MODEL_8B, ROOT, helm, values


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_values_schema", ROOT / "helm" / "gen_values_schema.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_schema_is_current() -> None:
    gen = _generator()
    current = json.loads((CHART / "values.schema.json").read_text())
    fresh = gen.render(current)
    assert gen.dumps(fresh) == (CHART / "values.schema.json").read_text(), (
        "helm/llm-governor/values.schema.json is stale (controller/config.py changed): "
        "run .venv/bin/python helm/gen_values_schema.py"
    )
    assert fresh["properties"]["models"]["items"] == {"$ref": "#/$defs/governor.ModelConfig"}


def test_generator_detects_a_stale_schema(tmp_path: Path) -> None:
    gen = _generator()
    current = json.loads((CHART / "values.schema.json").read_text())
    stale = copy.deepcopy(current)
    del stale["$defs"]["governor.SLA"]["properties"]["itl_p95_ms"]
    assert gen.dumps(gen.render(stale)) == gen.dumps(current)
    assert gen.dumps(stale) != gen.dumps(current)


def _model(**changes: Any) -> dict[str, Any]:
    m = copy.deepcopy(MODEL_8B)
    for dotted, value in changes.items():
        node = m
        *path, last = dotted.split("__")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return m


# (config values, should the governor accept them). Per-field rules only: the cross-field
# ones (min <= max, ...) are the templates' job (test_invalid_values.py).
PARITY: dict[str, tuple[dict[str, Any], bool]] = {
    "valid": ({"models": [_model()]}, True),
    "valid-policy-and-prometheus": (
        {
            "models": [_model(policy={"scale_down_stabilization_s": 600})],
            "policy": {
                "tick_interval_s": 10,
                "scale_up_limits": [{"type": "pods", "value": 2, "period_s": 30}],
            },
            "prometheus": {
                "url": "https://prom.example:9090",
                "timeout_s": 5,
                "model_label": "model",
            },
        },
        True,
    ),
    "itl-zero": ({"models": [_model(sla__itl_p95_ms=0)]}, False),
    "ttft-too-large": ({"models": [_model(sla__ttft_p95_ms=600_001)]}, False),
    "attainment-above-one": ({"models": [_model(sla__attainment_goal_frac=1.5)]}, False),
    "attainment-one": ({"models": [_model(sla__attainment_goal_frac=1)]}, False),
    "max-replicas-past-the-bound": ({"models": [_model(replicas__max_replicas=10_001)]}, False),
    "knob-past-int32": ({"models": [_model(knobs__max_num_seqs_max=2**31)]}, False),
    "sla-a-boolean": ({"models": [_model(sla__ttft_p95_ms=True)]}, False),
    "namespace-uppercase": ({"models": [_model(namespace="Prod")]}, False),
    "deployment-underscore": ({"models": [_model(deployment="llama_8b")]}, False),
    "name-with-space": ({"models": [_model(name="llama 8b")]}, False),
    "negative-min": ({"models": [_model(replicas__min_replicas=-1)]}, False),
    "zero-max": ({"models": [_model(replicas__max_replicas=0)]}, False),
    "knob-typo": ({"models": [_model(knobs__max_num_seq_max=64)]}, False),
    "bad-batching-policy": ({"models": [_model(batching_policy="greedy")]}, False),
    "negative-fallback": ({"models": [_model(fallback_replicas=-1)]}, False),
    "model-policy-override": (
        {"models": [_model(policy={"tolerance_frac": 0.2, "falling_release_after_s": None})]},
        True,
    ),
    "model-policy-typo": (
        {"models": [_model(policy={"scale_down_stabilisation_s": 600})]},
        False,
    ),
    "model-policy-global-only-key": ({"models": [_model(policy={"tick_interval_s": 10})]}, False),
    "model-policy-window": ({"models": [_model(policy={"window_s": 120})]}, False),
    "model-policy-out-of-range": ({"models": [_model(policy={"tolerance_frac": 1.5})]}, False),
    "model-policy-rate-limit-kind": (
        {
            "models": [
                _model(policy={"scale_up_limits": [{"type": "ratio", "value": 2, "period_s": 15}]})
            ]
        },
        False,
    ),
    "policy-tick-zero": ({"models": [_model()], "policy": {"tick_interval_s": 0}}, False),
    "policy-rate-limit-kind": (
        {
            "models": [_model()],
            "policy": {"scale_up_limits": [{"type": "ratio", "value": 2, "period_s": 15}]},
        },
        False,
    ),
    "prometheus-ftp": ({"models": [_model()], "prometheus": {"url": "ftp://prom"}}, False),
    "prometheus-unknown-key": (
        {"models": [_model()], "prometheus": {"url": "http://p:9090", "token": "x"}},
        False,
    ),
}


def _governor_accepts(cfg: dict[str, Any]) -> bool:
    try:
        parse_config(copy.deepcopy(cfg), environ={})
    except ConfigError:
        return False
    return True


def _chart_accepts(cfg: dict[str, Any]) -> bool:
    with helm.Chart.load(str(CHART)) as chart:
        try:
            chart.validate_schema(chart.merge_values(values(**cfg)))
        except helm.HelmValuesError:
            return False
    return True


@pytest.mark.parametrize("case", sorted(PARITY))
def test_chart_schema_agrees_with_the_governor(case: str) -> None:
    cfg, accepted = PARITY[case]
    assert _governor_accepts(cfg) is accepted, "the case itself is wrong"
    assert _chart_accepts(cfg) is accepted


def test_example_config_file_is_valid_chart_values() -> None:
    """examples/governor.yaml, pasted under the chart's values, installs as it is."""
    cfg = yaml.safe_load((ROOT / "examples" / "governor.yaml").read_text())
    assert _governor_accepts(cfg)
    assert _chart_accepts(cfg)


def test_model_policy_schema_is_the_global_policy_less_the_global_only_keys() -> None:
    """Generated from ScalingPolicy, so a policy field added to the governor is accepted
    per model at once, and a global-only one never."""
    from controller.config import GLOBAL_ONLY_POLICY, ScalingPolicy

    schema = json.loads((CHART / "values.schema.json").read_text())
    policy = schema["$defs"]["governor.ModelConfig"]["properties"]["policy"]
    assert policy["additionalProperties"] is False
    assert set(policy["properties"]) == set(ScalingPolicy.model_fields) - GLOBAL_ONLY_POLICY
    assert set(ScalingPolicy.model_fields) >= GLOBAL_ONLY_POLICY
