"""The PrometheusRule's groups and the dashboard's queries, checked and unit-tested by the
real Prometheus tooling (`promtool check rules`, `promtool test rules`): syntax, and that
the alerts fire on the situations they are for and not otherwise."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    FULLNAME,
    MODEL_8B,
    MODEL_CODE,
    NAMESPACE,
    deep_merge,
    helm,
    one,
    render,
    values,
)

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not found (Debian package `prometheus`; `make prometheus` installs it)",
)
SEL = f'job="{FULLNAME}",namespace="{NAMESPACE}"'


def _rules(**overrides: Any) -> dict[str, Any]:
    monitoring = {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    objs = render(values(**deep_merge({"monitoring": monitoring}, overrides)))
    return {"groups": one(objs, "PrometheusRule")["spec"]["groups"]}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def _run_tests(tmp_path: Path, rules: dict[str, Any], tests: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "15s", "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = _promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("via", ["keda", "hpa"])
def test_rules_pass_promtool_check(tmp_path: Path, via: str) -> None:
    rules = _rules(scaling={"via": via})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    out = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


# Durations for the alert windows (range selectors) and `for:`: what Prometheus loads in
# each place decides. Bare "0" (for: reads it as 0s) is left out: the chart asks for a unit.
DURATIONS = [
    "0s", "00m", "0h0m", "5m", "0h5m", "1h30m", "90s", "500ms", "1d", "2w",
    "1m1h", "5m5m", "1.5m", "5M", "5", "m", "",
]  # fmt: skip


def _prometheus_loads(tmp_path: Path, rule: dict[str, Any]) -> bool:
    rules = {"groups": [{"name": "g", "rules": [rule]}]}
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(rules))
    return _promtool("check", "rules", "one.yaml", cwd=tmp_path).returncode == 0


def _chart_takes(key: str, duration: str) -> bool:
    try:
        _rules(monitoring={"prometheusRule": {key: duration}})
    except helm.HelmError:
        return False
    return True


WINDOWS = (
    "slaShortWindow",
    "slaLongWindow",
    "actuationGapWindow",
    "tailWindow",
    "slowReplicaWindow",
)
"""The alerts' range selectors (monitoring.prometheusRule)."""
FORS = (
    "slaFor",
    "actuationFailingFor",
    "actuationGapFor",
    "tailFor",
    "plantOffProfileFor",
    "slowReplicaFor",
)
"""The alerts' `for:` durations (monitoring.prometheusRule)."""


@pytest.mark.parametrize("duration", DURATIONS)
def test_the_chart_takes_the_alert_durations_prometheus_loads(
    tmp_path: Path, duration: str
) -> None:
    """A window is a range selector: [0s] (or a malformed range) fails to load the rule
    file, every rule of its group with it. `for:` takes 0s (fire on the first evaluation
    that matches). The chart refuses at install exactly what Prometheus would not load."""
    as_range = _prometheus_loads(
        tmp_path, {"alert": "A", "expr": f"rate(x[{duration}]) > 0", "for": "1m"}
    )
    as_for = _prometheus_loads(tmp_path, {"alert": "A", "expr": "x > 0", "for": duration})
    for key in WINDOWS:
        assert _chart_takes(key, duration) == as_range, (key, duration, as_range)
    for key in FORS:
        assert _chart_takes(key, duration) == as_for, (key, duration, as_for)
    if as_range:
        # The rendered rules, with every window and for: at this duration, load.
        rules = _rules(monitoring={"prometheusRule": dict.fromkeys(WINDOWS + FORS, duration)})
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
        out = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr


def _grafana(expr: str, model: str, namespace: str) -> str:
    """`expr` as Grafana sends it, with the variables' regexes in."""
    return expr.replace("$model", model).replace("$namespace", namespace)


def _dashboard(**overrides: Any) -> dict[str, Any]:
    objs = render(values(**overrides))
    cm = one(objs, "ConfigMap", f"{FULLNAME}-dashboard")
    return json.loads(cm["data"]["llm-governor.json"])  # type: ignore[no-any-return]


def _panel_expr(dash: dict[str, Any], title: str) -> str:
    panel = next(p for p in dash["panels"] if p["title"] == title)
    return panel["targets"][0]["expr"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("prometheus", "model_label", "ns_label"),
    [
        ({}, "model_name", "namespace"),
        ({"model_label": "model", "namespace_label": "kube_ns"}, "model", "kube_ns"),
    ],
)
def test_dashboard_shows_a_model_per_namespace(
    tmp_path: Path, prometheus: dict[str, Any], model_label: str, ns_label: str
) -> None:
    """One model name served in two namespaces (production and a staging load test): the
    dashboard's vLLM panels show two series, namespace/model, as the governor reads them,
    not their sum; the namespace variable narrows them to one."""
    dash = _dashboard(prometheus=prometheus)
    running = _panel_expr(dash, "Requests running / waiting")
    ttft = _panel_expr(dash, "TTFT p95")
    model = MODEL_8B["name"]
    series = [
        _series("vllm:num_requests_running", {model_label: model, ns_label: "llm"}, "3x10"),
        _series("vllm:num_requests_running", {model_label: model, ns_label: "staging"}, "5x10"),
        _series("vllm:num_requests_running", {model_label: "other", ns_label: "llm"}, "7x10"),
    ]
    # TTFT: production's requests all under 0.1 s, staging's between 0.1 and 2 s.
    for ns, counts in (("llm", ("0+10x10",) * 3), ("staging", ("0+0x10", "0+10x10", "0+10x10"))):
        for le, values_ in zip(("0.1", "2", "+Inf"), counts, strict=True):
            labels = {model_label: model, ns_label: ns, "le": le}
            series.append(_series("vllm:time_to_first_token_seconds_bucket", labels, values_))
    both = [
        {"labels": f'{{{model_label}="{model}",{ns_label}="{ns}"}}', "value": v}
        for ns, v in (("llm", 3), ("staging", 5))
    ]
    tests = [
        {
            "interval": "15s",
            "input_series": series,
            "promql_expr_test": [
                {
                    "expr": _grafana(running, model, ".*"),
                    "eval_time": "1m",
                    "exp_samples": both,
                },
                {
                    "expr": _grafana(running, model, "staging"),
                    "eval_time": "1m",
                    "exp_samples": both[1:],
                },
                {
                    "expr": f"{_grafana(ttft, model, '.*')} > bool 0.5",
                    "eval_time": "2m",
                    "exp_samples": [{**b, "value": v} for b, v in zip(both, (0, 1), strict=True)],
                },
            ],
        }
    ]
    _run_tests(tmp_path, {"groups": []}, tests)
    legends = {t["legendFormat"] for p in dash["panels"] for t in p.get("targets", [])}
    assert f"running {{{{{ns_label}}}}}/{{{{{model_label}}}}}" in legends, legends
    (var,) = [v for v in dash["templating"]["list"] if v["name"] == "namespace"]
    assert var["query"]["query"] == (
        f'label_values(vllm:num_requests_running{{{model_label}=~"$model"}}, {ns_label})'
    )
    # All keeps the series without the label, which the governor also reads.
    assert var["includeAll"] and var["allValue"] == ".*"


def test_dashboard_groups_as_the_recording_rules_do() -> None:
    """Each vLLM panel groups by the labels the recording rules group by (the governor's
    reading of prometheus.namespace_label: unset, `namespace`; null, none), and with null
    the dashboard has no namespace variable and no $namespace."""
    for prometheus in ({}, {"namespace_label": "kube_ns"}, {"namespace_label": None}):
        rules = _rules(prometheus=prometheus)
        recorded = next(g for g in rules["groups"] if g["name"] == "llm-governor.recording")
        m = re.match(r"sum by \(([^)]*), le\)", recorded["rules"][0]["expr"])
        assert m, recorded["rules"][0]["expr"]
        want = set(m.group(1).split(", "))
        dash = _dashboard(prometheus=prometheus)
        vllm = [
            t["expr"] for p in dash["panels"] for t in p.get("targets", []) if "vllm:" in t["expr"]
        ]
        assert len(vllm) == 8
        for expr in vllm:
            (by,) = set(re.findall(r"(?:sum|max) by \(([^)]*)\)", expr))
            # by the recording rules' labels, and the bucket or (one panel) the engine
            assert set(by.split(", ")) - {"le", "instance"} == want, (prometheus, expr)
        per_engine = [e for e in vllm if "instance)" in e]
        assert len(per_engine) == 1 and "le)" not in per_engine[0]
        names = [v["name"] for v in dash["templating"]["list"]]
        if prometheus.get("namespace_label", "namespace") is None:
            assert names == ["datasource", "model"]
            assert "$namespace" not in json.dumps(dash)
        else:
            assert names == ["datasource", "model", "namespace"]


@pytest.mark.parametrize("window", ["10m", "3m"])
def test_the_token_gap_panel_reads_the_slow_replica_alerts_window(window: str) -> None:
    """The per-engine token-gap panel shows what GovernorSlowReplica compares: each
    engine's mean over slowReplicaWindow (a 5m panel beside a 10m alert showed a spike
    the alert never saw, or hid one it fired on)."""
    dash = _dashboard(monitoring={"prometheusRule": {"slowReplicaWindow": window}})
    panel = next(p for p in dash["panels"] if p["title"] == "Mean token gap per engine")
    expr = panel["targets"][0]["expr"]
    assert set(re.findall(r"\[([^\]]+)\]", expr)) == {window}
    assert f"over {window}" in panel["description"]
    rules = _rules(monitoring={"prometheusRule": {"slowReplicaWindow": window}})
    records = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
    assert f"governor:engine_token_gap_seconds:mean{window}" in records
    assert "__" not in json.dumps(dash).replace("__name__", "")


@pytest.mark.parametrize("namespace_label", ["namespace", None])
def test_dashboard_queries_are_valid_promql(tmp_path: Path, namespace_label: str | None) -> None:
    dash = _dashboard(prometheus={"namespace_label": namespace_label})
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    # Grafana substitutes $model and $namespace (regexes, multi-value) before Prometheus
    # sees the query.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _grafana(e, ".*", ".*")}
        for i, e in enumerate(exprs)
    ]
    (tmp_path / "dash.yaml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    out = _promtool("check", "rules", "dash.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def _series(name: str, labels: dict[str, str], values_: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values_}


GOV = {"job": FULLNAME, "namespace": NAMESPACE}


def test_controller_stale_fires_when_ticks_stop_and_not_before(tmp_path: Path) -> None:
    leader = {**GOV, "instance": "10.0.0.1:9464"}
    tests = [
        {
            # Ticking: the last-tick timestamp follows time (15 s steps).
            "interval": "15s",
            "input_series": [
                _series("governor_last_tick_timestamp_seconds", leader, "0+15x40"),
                _series("governor_leader", leader, "1x40"),
            ],
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": "GovernorControllerStale", "exp_alerts": []}
            ],
        },
        {
            # Stuck since t=60 s: stale after 60 s more, alert after its 2 m `for`.
            "interval": "15s",
            "input_series": [
                _series("governor_last_tick_timestamp_seconds", leader, "0 15 30 45 60x40"),
                _series("governor_leader", leader, "1x40"),
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "GovernorControllerStale", "exp_alerts": []},
                {
                    "eval_time": "6m",
                    "alertname": "GovernorControllerStale",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "critical"},
                            "exp_annotations": {
                                "summary": "llm-governor has not completed a control tick recently",
                                "description": "No control tick for 5m 0s (or no governor "
                                "scraped). Check the pods and 'governor status'.",
                            },
                        }
                    ],
                },
            ],
        },
    ]
    _run_tests(tmp_path, _rules(), tests)


def test_serving_down_fires_when_it_stays_down_not_on_one_restart(tmp_path: Path) -> None:
    down = {**GOV, "instance": "10.0.0.1:9464"}
    blip = {**GOV, "instance": "10.0.0.2:9464"}
    tests = [
        {
            "interval": "15s",
            "input_series": [
                _series("governor_serving_up", down, "1x8 0x30"),  # down from 2m15s
                _series("governor_serving_up", blip, "1x8 0 1x30"),  # one restart
            ],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "GovernorServingDown", "exp_alerts": []},
                {
                    "eval_time": "6m",
                    "alertname": "GovernorServingDown",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "instance": down["instance"]},
                            "exp_annotations": {
                                "summary": "an llm-governor instance is not serving the "
                                "engines and KEDA",
                                "description": f"{down['instance']}: the serving process "
                                "keeps exiting or hanging; see the governor log "
                                "(serving_process_exited / serving_process_unresponsive) "
                                "and governor_serving_restarts_total.",
                            },
                        }
                    ],
                },
            ],
        },
    ]
    _run_tests(tmp_path, _rules(), tests)


def test_knob_rollout_waiting_fires_on_a_roll_out_that_never_gets_room(tmp_path: Path) -> None:
    """`governor_knob_rollout_waiting_seconds` past `knobRolloutWaitingAfterSeconds` (set
    to 600 here) fires, with the model and why; a roll-out that waited 5 minutes and
    started (its series ends) does not."""
    stuck = {**GOV, "instance": "10.0.0.1:9464", "model": "a", "reason": "ROLLOUT_WAITING_CAPACITY"}
    started = {**stuck, "model": "b", "reason": "ROLLOUT_WAITING_IN_PROGRESS"}
    tests = [
        {
            "interval": "15s",
            "input_series": [
                _series("governor_knob_rollout_waiting_seconds", stuck, "0+15x80"),
                _series("governor_knob_rollout_waiting_seconds", started, "0+15x20 _x60"),
            ],
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": "GovernorKnobRolloutWaiting", "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": "GovernorKnobRolloutWaiting",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "model": "a",
                                "reason": "ROLLOUT_WAITING_CAPACITY",
                            },
                            "exp_annotations": {
                                "summary": "an llm-governor knob roll-out has not started",
                                "description": "a's knob roll-out has waited 12m 0s "
                                "(ROLLOUT_WAITING_CAPACITY); its replicas run older knobs. "
                                "ROLLOUT_WAITING_CAPACITY: the Deployment's strategy would "
                                "take down replicas the load needs (allow a maxSurge, or let "
                                "it scale out); see 'governor status'.",
                            },
                        }
                    ],
                },
            ],
        },
    ]
    rules = _rules(monitoring={"prometheusRule": {"knobRolloutWaitingAfterSeconds": 600}})
    _run_tests(tmp_path, rules, tests)


def _out_of_reach_description(model: str, reason: str) -> str:
    return (
        f"{model}: 100% of the decisions over 10m read {reason}. SLA_INFEASIBLE: one unloaded "
        "replica on the engines as learned (governor_plant_speed_factor) gives more than two "
        "thirds of a target; the fleet is sized for 1.5x what it gives. KNOBS_SLA_INFEASIBLE: "
        "at the fewest sequences the knob bounds allow, tokens still stream slower than the ITL "
        "target, and the fleet pays for that floor. Relax the target ('governor target "
        "set') or move the model to faster engines; 'governor explain' shows the decisions."
    )


def test_sla_out_of_reach_fires_where_most_decisions_say_so_for_10_minutes(
    tmp_path: Path,
) -> None:
    """GovernorSLAOutOfReach, from the stage reason counter (a decision every 5 s: 3 per
    15 s): model a's every raw stage reads SLA_INFEASIBLE and model c's every knob step
    KNOBS_SLA_INFEASIBLE, both alert after 10 minutes (not at 5), each with its stage
    and reason; model b's knob step reads it in a third of its decisions (a floor it
    leaves and comes back to), which does not alert."""
    reasons = "governor_stage_reasons_total"
    gov = {**GOV, "instance": "10.0.0.1:9464"}

    def series(model: str, stage: str, reason: str, per_15s: int) -> dict[str, str]:
        labels = {**gov, "model": model, "stage": stage, "reason": reason}
        return _series(reasons, labels, f"0+{per_15s}x80")

    def fired(model: str, stage: str, reason: str) -> dict[str, Any]:
        return {
            "exp_labels": {"severity": "warning", "model": model, "stage": stage, "reason": reason},
            "exp_annotations": {
                "summary": "llm-governor: a model's SLA is out of reach of scaling and knobs",
                "description": _out_of_reach_description(model, reason),
            },
        }

    tests = [
        {
            "interval": "15s",
            "input_series": [
                series("a", "raw", "SLA_INFEASIBLE", 3),
                series("a", "knobs", "KNOBS_UNCHANGED", 3),
                series("b", "raw", "CAPACITY", 3),
                series("b", "knobs", "KNOBS_SLA_INFEASIBLE", 1),
                series("b", "knobs", "KNOBS_UNCHANGED", 2),
                series("c", "raw", "CAPACITY", 3),
                series("c", "knobs", "KNOBS_SLA_INFEASIBLE", 3),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "GovernorSLAOutOfReach", "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": "GovernorSLAOutOfReach",
                    "exp_alerts": [
                        fired("a", "raw", "SLA_INFEASIBLE"),
                        fired("c", "knobs", "KNOBS_SLA_INFEASIBLE"),
                    ],
                },
            ],
        },
    ]
    _run_tests(tmp_path, _rules(), tests)


def test_at_max_replicas_fires_where_most_decisions_are_clamped_for_10_minutes(
    tmp_path: Path,
) -> None:
    """GovernorAtMaxReplicas, from the stage reason counter (3 decisions per 15 s): model
    a's every clamp stage reads CLAMPED_MAX and alerts after 10 minutes (not at 5); model
    b's does in a third of its decisions (a burst's peaks), which does not alert."""
    reasons = "governor_stage_reasons_total"
    gov = {**GOV, "instance": "10.0.0.1:9464"}

    def series(model: str, reason: str, per_15s: int) -> dict[str, str]:
        labels = {**gov, "model": model, "stage": "clamp", "reason": reason}
        return _series(reasons, labels, f"0+{per_15s}x80")

    description = (
        "a: 100% of the decisions over 10m asked for more replicas than its maximum "
        "(CLAMPED_MAX). A queue stands and the SLA is missed while the load lasts; the "
        "knobs serve throughput meanwhile (KNOBS_THROUGHPUT). Raise the maximum ('governor "
        "target set --max-replicas') where GPUs allow; 'governor explain' shows the "
        "decisions."
    )
    fired = {
        "exp_labels": {"severity": "warning", "model": "a"},
        "exp_annotations": {
            "summary": "llm-governor: a model's load needs more replicas than its maximum",
            "description": description,
        },
    }
    tests = [
        {
            "interval": "15s",
            "input_series": [
                series("a", "CLAMPED_MAX", 3),
                series("b", "CLAMPED_MAX", 1),
                series("b", "WITHIN_BOUNDS", 2),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "GovernorAtMaxReplicas", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "GovernorAtMaxReplicas", "exp_alerts": [fired]},
            ],
        },
    ]
    _run_tests(tmp_path, _rules(), tests)


def test_actuation_failing_fires_on_sustained_errors(tmp_path: Path) -> None:
    pod = {**GOV, "instance": "10.0.0.1:9464", "actuator": "KubernetesScaleActuator"}
    tests = [
        {
            "interval": "15s",
            "input_series": [_series("governor_actuation_errors_total", pod, "0+1x80")],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "GovernorActuationFailing", "exp_alerts": []},
                {
                    "eval_time": "17m",
                    "alertname": "GovernorActuationFailing",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "critical",
                                "actuator": "KubernetesScaleActuator",
                            },
                            "exp_annotations": {
                                "summary": "llm-governor actuation is failing",
                                "description": "Actuator KubernetesScaleActuator has been failing "
                                "for a while; replicas do not follow decisions.",
                            },
                        }
                    ],
                },
            ],
        }
    ]
    _run_tests(tmp_path, _rules(), tests)


def _ttft_buckets(
    model: str, slow: bool, namespace: str | None = None, instance: str = "10.1.0.1:8000"
) -> list[dict[str, str]]:
    """10 requests per 15 s, all in (0.25, 0.5] s when slow, else all under 0.1 s (series
    labelled `namespace` when given)."""
    label = {"model_name": model, "engine": "0", "instance": instance}
    if namespace is not None:
        label["namespace"] = namespace
    edges = {"0.1": not slow, "0.25": not slow, "0.5": True, "+Inf": True}
    return [
        _series(
            "vllm:time_to_first_token_seconds_bucket",
            {**label, "le": le},
            "0+10x300" if counted else "0x300",
        )
        for le, counted in edges.items()
    ]


def _ttft_burn(model: str) -> dict[str, Any]:
    """The GovernorSLABurn alert expected for `model`'s 300 ms TTFT SLA."""
    return {
        "exp_labels": {"severity": "warning", "model": model, "sla": "ttft_p95"},
        "exp_annotations": {
            "summary": f"{model}: ttft_p95 SLA (300ms) is being missed",
            "description": "ttft_p95 is above 300ms over 5m and 1h although the governor is "
            f"scaling; check max_replicas and 'governor explain {model}'.",
        },
    }


def test_sla_burn_fires_for_the_model_missing_its_ttft_sla_only(tmp_path: Path) -> None:
    # code-assistant's TTFT SLA is 300 ms: its p95 (~0.49 s) misses it; the 8B model's
    # 500 ms SLA is met by requests under 0.1 s.
    code, llama = MODEL_CODE["name"], MODEL_8B["name"]
    tests = [
        {
            "interval": "15s",
            "input_series": _ttft_buckets(code, slow=True) + _ttft_buckets(llama, slow=False),
            "alert_rule_test": [
                # Both windows are over the target only after the `for` period.
                {"eval_time": "3m", "alertname": "GovernorSLABurn", "exp_alerts": []},
                {
                    "eval_time": "30m",
                    "alertname": "GovernorSLABurn",
                    "exp_alerts": [_ttft_burn(code)],
                },
            ],
        }
    ]
    _run_tests(tmp_path, _rules(), tests)


def test_sla_alerts_read_the_models_own_namespace(tmp_path: Path) -> None:
    """code-assistant (namespace `research`) served fast there while a load test of the same
    model name misses its TTFT in `staging`: no alert (the burn and the p99 tail alike).
    Engines scraped without the namespace label stand in for a namespace that has none,
    as the governor reads them: slow there, the burn fires."""
    code = MODEL_CODE["name"]
    quiet = _ttft_buckets(code, slow=False, namespace=MODEL_CODE["namespace"]) + _ttft_buckets(
        code, slow=True, namespace="staging", instance="10.2.0.1:8000"
    )
    tests = [
        {
            "interval": "15s",
            "input_series": quiet,
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": name, "exp_alerts": []}
                for name in ("GovernorSLABurn", "GovernorLatencyP99High")
            ],
        },
        {
            "interval": "15s",
            "input_series": _ttft_buckets(code, slow=True),
            "alert_rule_test": [
                {
                    "eval_time": "30m",
                    "alertname": "GovernorSLABurn",
                    "exp_alerts": [_ttft_burn(code)],
                }
            ],
        },
    ]
    _run_tests(tmp_path, _rules(), tests)


def test_recording_rule_keeps_only_the_leaders_desired_replicas(tmp_path: Path) -> None:
    # The follower (a former leader) still exports its last, stale value 9.
    leader = {**GOV, "instance": "10.0.0.1:9464"}
    follower = {**GOV, "instance": "10.0.0.2:9464"}
    model = MODEL_8B["name"]
    tests = [
        {
            "interval": "15s",
            "input_series": [
                _series("governor_leader", leader, "1x10"),
                _series("governor_leader", follower, "0x10"),
                _series("governor_desired_replicas", {**leader, "model": model}, "5x10"),
                _series("governor_desired_replicas", {**follower, "model": model}, "9x10"),
            ],
            "promql_expr_test": [
                {
                    "expr": "governor_target_desired_replicas",
                    "eval_time": "1m",
                    "exp_samples": [
                        {
                            "labels": "governor_target_desired_replicas"
                            '{target_deployment="llama-8b",target_namespace="llm"}',
                            "value": 5,
                        }
                    ],
                }
            ],
        }
    ]
    _run_tests(tmp_path, _rules(scaling={"via": "hpa"}), tests)


def _rule(rules: dict[str, Any], alert: str, **labels: str) -> dict[str, Any]:
    for group in rules["groups"]:
        for r in group["rules"]:
            if r.get("alert") == alert and labels.items() <= r.get("labels", {}).items():
                return r  # type: ignore[no-any-return]
    raise AssertionError(f"no {alert} {labels}")


def _gap_case(desired: list[int], spec: list[int], paused: int = 0) -> dict[str, Any]:
    leader = {**GOV, "instance": "10.0.0.1:9464"}
    model = {**leader, "model": MODEL_8B["name"]}
    ksm = {"job": "kube-state-metrics", "namespace": "llm", "deployment": "llama-8b"}
    return {
        "interval": "15s",
        "input_series": [
            _series("governor_leader", leader, f"1x{len(desired)}"),
            _series("governor_model_paused", model, f"{paused}x{len(desired)}"),
            _series("governor_desired_replicas", model, " ".join(map(str, desired))),
            _series("kube_deployment_spec_replicas", ksm, " ".join(map(str, spec))),
        ],
    }


def test_actuation_gap_fires_when_the_deployment_ignores_the_governor(tmp_path: Path) -> None:
    """KEDA (or an HPA, or the direct actuator) not applying decisions: the Deployment stays
    at 2 replicas while the governor decides 5. Neither the actuator's own error counter nor
    anything else would fire: a KEDA that cannot reach the scaler increments nothing."""
    rules = _rules()
    rule = _rule(rules, "GovernorActuationGap", model=MODEL_8B["name"])
    n = 100  # 25 minutes of 15 s samples
    ignored = _gap_case([5] * n, [2] * n)
    firing = {
        "exp_labels": {
            "severity": "critical",
            "model": MODEL_8B["name"],
            "target_namespace": "llm",
            "target_deployment": "llama-8b",
        },
        "exp_annotations": {
            k: v.replace("{{ $value }}", "2") for k, v in rule["annotations"].items()
        },
    }
    ignored["alert_rule_test"] = [
        # Pending within its 10 m `for`, firing after.
        {"eval_time": "8m", "alertname": "GovernorActuationGap", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "GovernorActuationGap", "exp_alerts": [firing]},
    ]
    # Following with one sample of lag through changing decisions: never fires.
    wave = [(3, 4, 5, 4)[i % 4] for i in range(n)]
    following = _gap_case(wave, [3, *wave[:-1]])
    following["alert_rule_test"] = [
        {"eval_time": "20m", "alertname": "GovernorActuationGap", "exp_alerts": []}
    ]
    # A paused model (shadow mode) is decided, deliberately not actuated.
    paused = _gap_case([5] * n, [2] * n, paused=1)
    paused["alert_rule_test"] = [
        {"eval_time": "20m", "alertname": "GovernorActuationGap", "exp_alerts": []}
    ]
    _run_tests(tmp_path, rules, [ignored, following, paused])


def test_actuation_gap_on_the_hpa_path_allows_the_hpa_minimum(tmp_path: Path) -> None:
    """A plain HPA holds at least one replica: a decision of 0 with 1 replica is no gap;
    5 with 1 is."""
    n = 100
    at_min = _gap_case([0] * n, [1] * n)
    at_min["alert_rule_test"] = [
        {"eval_time": "20m", "alertname": "GovernorActuationGap", "exp_alerts": []}
    ]
    _run_tests(tmp_path, _rules(scaling={"via": "hpa"}), [at_min])
    stuck = _gap_case([5] * n, [1] * n)
    stuck["promql_expr_test"] = [
        {
            "expr": 'ALERTS{alertname="GovernorActuationGap", alertstate="firing"}',
            "eval_time": "20m",
            "exp_samples": [
                {
                    "labels": 'ALERTS{alertname="GovernorActuationGap", alertstate="firing", '
                    f'model="{MODEL_8B["name"]}", severity="critical", '
                    'target_deployment="llama-8b", target_namespace="llm"}',
                    "value": 1,
                }
            ],
        }
    ]
    _run_tests(tmp_path, _rules(scaling={"via": "hpa"}), [stuck])


def _tail_buckets(model: str) -> list[dict[str, str]]:
    """100 requests per 15 s: 97 under 0.1 s, 3 in (1.0, 1.5] s. p95 < 0.1 s (the 500 ms
    SLA is met), p99 ~1.33 s (above 2 x 500 ms), p99.9 ~1.48 s (below 4 x 500 ms)."""
    label = {"model_name": model, "instance": "10.1.0.1:8000"}
    counts = {"0.1": 97, "1": 97, "1.5": 100, "5": 100, "+Inf": 100}
    return [
        _series("vllm:time_to_first_token_seconds_bucket", {**label, "le": le}, f"0+{c}x200")
        for le, c in counts.items()
    ]


def test_tail_latency_alerts_see_what_the_p95_sla_does_not(tmp_path: Path) -> None:
    rules = _rules()
    model = MODEL_8B["name"]
    names = {
        (r["alert"], r["labels"]["model"], r["labels"]["latency"], r["labels"]["quantile"])
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert", "").startswith("GovernorLatencyP")
    }
    # p99 and p99.9, per model, for TTFT, ITL and (when the SLA sets it) end-to-end.
    assert ("GovernorLatencyP999High", model, "e2e", "p99.9") in names
    assert ("GovernorLatencyP99High", MODEL_CODE["name"], "itl", "p99") in names
    assert len(names) == 2 * (3 + 2)
    p99 = _rule(rules, "GovernorLatencyP99High", model=model, latency="ttft")
    assert "histogram_quantile(0.99," in p99["expr"] and "> 1" in p99["expr"]
    tests = [
        {
            "interval": "15s",
            "input_series": _tail_buckets(model),
            "alert_rule_test": [
                {
                    "eval_time": "30m",
                    "alertname": "GovernorLatencyP99High",
                    "exp_alerts": [
                        {"exp_labels": p99["labels"], "exp_annotations": p99["annotations"]}
                    ],
                },
                {"eval_time": "30m", "alertname": "GovernorLatencyP999High", "exp_alerts": []},
                {"eval_time": "30m", "alertname": "GovernorSLABurn", "exp_alerts": []},
            ],
        }
    ]
    _run_tests(tmp_path, rules, tests)


def test_actuation_gap_alerts_can_be_turned_off_without_kube_state_metrics() -> None:
    on = {r.get("alert") for g in _rules()["groups"] for r in g["rules"]}
    assert {"GovernorActuationGap", "GovernorActuationUnobserved"} <= on
    rules = _rules(monitoring={"prometheusRule": {"actuationGap": False}})
    off = {r.get("alert") for g in rules["groups"] for r in g["rules"]}
    assert not {"GovernorActuationGap", "GovernorActuationUnobserved"} & off
    assert "GovernorControllerStale" in off


def test_plant_off_profile_fires_either_way_past_the_factor_and_only_for_the_leader(
    tmp_path: Path,
) -> None:
    """GovernorPlantOffProfile (plantOffProfileFactor 1.5, for 30m by default): model a's
    engines read 2.10x the profile's step time and c's 0.50x (faster than the profile)
    for 40 minutes, so both alert after 30 (not at 20); b reads 1.20x, within the factor;
    a follower's stale 3.0x for b is not read."""
    leader = {**GOV, "instance": "10.0.0.1:9464"}
    follower = {**GOV, "instance": "10.0.0.2:9464"}
    speed = "governor_plant_speed_factor"

    def fired(model: str, value: str) -> dict[str, Any]:
        return {
            "exp_labels": {"severity": "warning", "model": model},
            "exp_annotations": {
                "summary": "llm-governor: a model's engines run far off its profile",
                "description": f"{model}: its engines' steps have taken {value}x the "
                "profile's for 30m (warned past 1.5x either way). The governor sizes "
                "replicas and knobs with what it learned, but the profile is for other "
                "hardware, or the hardware changed under the model (a degraded or "
                "throttling GPU, another node pool, another vLLM version): check the "
                "engines' nodes and the model's profile; 'governor explain' shows the "
                "learned factors.",
            },
        }

    tests = [
        {
            "interval": "1m",
            "input_series": [
                _series(speed, {**leader, "model": "a"}, "2.1x40"),
                _series(speed, {**leader, "model": "b"}, "1.2x40"),
                _series(speed, {**leader, "model": "c"}, "0.5x40"),
                _series(speed, {**follower, "model": "b"}, "3x40"),
                _series("governor_leader", leader, "1x40"),
                _series("governor_leader", follower, "0x40"),
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "GovernorPlantOffProfile", "exp_alerts": []},
                {
                    "eval_time": "35m",
                    "alertname": "GovernorPlantOffProfile",
                    "exp_alerts": [fired("a", "2.10"), fired("c", "0.50")],
                },
            ],
        },
    ]
    _run_tests(tmp_path, _rules(), tests)
    rules = _rules(monitoring={"prometheusRule": {"plantOffProfileFactor": 2.5}})
    tests[0]["alert_rule_test"] = [
        {
            "eval_time": "35m",
            "alertname": "GovernorPlantOffProfile",
            "exp_alerts": [],  # 2.10 and 0.50 are within 2.5x either way
        }
    ]
    _run_tests(tmp_path, rules, tests)


@pytest.mark.parametrize("factor", [1, 0.5, -2])
def test_the_chart_refuses_a_plant_factor_that_is_not_over_one(factor: float) -> None:
    """A factor of 1 or less would fire on every model at every speed."""
    with pytest.raises(helm.HelmError, match="plantOffProfileFactor"):
        _rules(monitoring={"prometheusRule": {"plantOffProfileFactor": factor}})


def _itl_counters(
    model: str, instance: str, gap_s: float, per_s: float, name: str = ""
) -> list[dict[str, str]]:
    """An engine's ITL histogram _sum and _count: `per_s` token gaps a second, each
    `gap_s` apart (1-minute samples); `name` the metric (vLLM's current one by default)."""
    metric = name or "vllm:inter_token_latency_seconds"
    labels = {"model_name": model, "instance": instance}
    n = per_s * 60
    return [
        _series(f"{metric}_sum", labels, f"0+{n * gap_s:g}x60"),
        _series(f"{metric}_count", labels, f"0+{n:g}x60"),
    ]


def test_slow_replica_fires_on_the_engine_far_off_the_median_only(tmp_path: Path) -> None:
    """GovernorSlowReplica (factor 1.5 over 10m, for 15m): model A's four streaming
    engines read 20, 20, 22 and 45 ms (the last on the deprecated metric name only); the
    45 ms one alerts, once, after its `for`. An idle fifth engine (0.5 gaps a second at 100 ms)
    neither alerts nor counts. Model B's three engines (20, 24, 28 ms) are within 1.5x of
    their median; two engines (20 and 80 ms) have no median to speak of."""
    a, b = MODEL_8B["name"], MODEL_CODE["name"]
    tpot = "vllm:time_per_output_token_seconds"
    engines = [
        *_itl_counters(a, "10.1.0.1:8000", 0.020, 50),
        *_itl_counters(a, "10.1.0.2:8000", 0.020, 50),
        *_itl_counters(a, "10.1.0.3:8000", 0.022, 50),
        *_itl_counters(a, "10.1.0.4:8000", 0.045, 25, tpot),
        *_itl_counters(a, "10.1.0.5:8000", 0.100, 0.5),
        *_itl_counters(b, "10.2.0.1:8000", 0.020, 40),
        *_itl_counters(b, "10.2.0.2:8000", 0.024, 40),
        *_itl_counters(b, "10.2.0.3:8000", 0.028, 40),
    ]
    rules = _rules()
    rule = _rule(rules, "GovernorSlowReplica", model=a)
    description = (
        f"Engine 10.1.0.4:8000 of {a} has streamed tokens 45ms apart on average over "
        "10m, more than 1.5 x the median engine's, for 15m: a degraded or throttling GPU "
        "or a bad node (check its node and GPU health); its requests miss the ITL target "
        "first. Cordon its node and delete the pod to move it."
    )
    record = next(
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("record", "").startswith("governor:engine_token_gap_seconds:")
        and r["labels"]["model"] == a
    )
    fired = {
        # The recorded mean's release label comes with it.
        "exp_labels": {**rule["labels"], "instance": "10.1.0.4:8000", **record["labels"]},
        "exp_annotations": {"summary": rule["annotations"]["summary"], "description": description},
    }
    two = [
        *_itl_counters(b, "10.2.0.1:8000", 0.020, 40),
        *_itl_counters(b, "10.2.0.2:8000", 0.080, 40),  # > 1.5 x their median, 50 ms
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": engines,
            "alert_rule_test": [
                {"eval_time": "12m", "alertname": "GovernorSlowReplica", "exp_alerts": []},
                {"eval_time": "40m", "alertname": "GovernorSlowReplica", "exp_alerts": [fired]},
            ],
        },
        {
            "interval": "1m",
            "input_series": two,
            "alert_rule_test": [
                {"eval_time": "40m", "alertname": "GovernorSlowReplica", "exp_alerts": []},
            ],
        },
    ]
    _run_tests(tmp_path, rules, tests)
