"""Chart pieces of drain-aware scale-in and of an unreachable governor (real Helm render):
KEDA's fallback never shrinks the fleet, the plain-HPA path has no zero fallback, and the
engine pod's grace period and preStop drain hook (the hook's script is run for real
against a /metrics endpoint)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import (
    CHART,
    MODEL_8B,
    arg_value,
    chart_copy,
    container,
    find,
    one,
    parse,
    render,
    render_files,
    validate,
    values,
)


def _scaled_objects(**over: Any) -> dict[str, dict[str, Any]]:
    objs = render(values(**over))
    return {so["spec"]["scaleTargetRef"]["name"]: so for so in find(objs, "ScaledObject")}


def test_keda_fallback_holds_current_replicas_if_higher() -> None:
    sos = _scaled_objects()
    for so in sos.values():
        validate(so)  # KEDA >= 2.15's CRD has fallback.behavior
    fb = sos["llama-8b"]["spec"]["fallback"]
    assert fb == {"failureThreshold": 3, "replicas": 2, "behavior": "currentReplicasIfHigher"}


def test_keda_fallback_behavior_can_be_left_out_for_old_keda() -> None:
    sos = _scaled_objects(scaling={"keda": {"fallback": {"behavior": None}}})
    assert "behavior" not in sos["llama-8b"]["spec"]["fallback"]


def test_plain_hpa_metric_has_no_zero_fallback() -> None:
    """While the governor is down its series go stale and the recording rule yields
    nothing: prometheus-adapter has no value and the HPA keeps the current replicas
    (FailedGetExternalMetric). An `or vector(0)` / `absent()` would scale it to min."""
    monitoring = {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    objs = render(values(scaling={"via": "hpa"}, monitoring=monitoring))
    rule = one(objs, "PrometheusRule")
    exprs = [
        r["expr"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if r.get("record") == "governor_target_desired_replicas"
    ]
    assert exprs and all("vector(" not in e and "absent" not in e for e in exprs)


def _engine(**drain: Any) -> dict[str, Any]:
    objs = render(
        values(exampleEngine={"enabled": True, "drain": drain} if drain else {"enabled": True})
    )
    return one(objs, "Deployment", "llama-8b")["spec"]["template"]["spec"]


def test_engine_grace_period_from_e2e_p99_and_prestop_bounded_by_it() -> None:
    pod = _engine()
    assert MODEL_8B["sla"]["e2e_p99_ms"] == 30000
    assert pod["terminationGracePeriodSeconds"] == 60  # 30 s p99 + 30 s, on a step
    cmd = container(pod, "vllm")["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[:2] == ["python3", "-c"]
    assert cmd[2] == (CHART / "files" / "engine-drain.py").read_text()
    assert cmd[3:] == ["8000", "45"]  # port, grace - 15 s


def test_engine_grace_period_override_and_drain_off() -> None:
    assert _engine(gracePeriodSeconds=900)["terminationGracePeriodSeconds"] == 900
    assert "lifecycle" not in container(_engine(enabled=False), "vllm")
    objs = render(values(exampleEngine={"enabled": True, "model": "code-assistant"}))
    pod = one(objs, "Deployment", "code-assistant")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 300  # no e2e_p99_ms
    slow = values(exampleEngine={"enabled": True})
    slow["models"][0]["sla"]["e2e_p99_ms"] = 100_000  # 100 + 30 s -> the 300 s step
    pod = one(render(slow), "Deployment", "llama-8b")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 300


class _Metrics:
    """A /metrics endpoint whose in-flight requests the test sets."""

    def __init__(self) -> None:
        self.running, self.waiting, self.hits = 2.0, 1.0, 0
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return None

            def do_GET(self) -> None:
                outer.hits += 1
                body = (
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="m"}} {outer.running}\n'
                    f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {outer.waiting}\n'
                    'vllm:num_requests_running_total{model_name="m"} 99.0\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> str:
        return str(self.server.server_address[1])


@pytest.fixture
def metrics() -> Iterator[_Metrics]:
    m = _Metrics()
    yield m
    m.server.shutdown()


def _hook(port: str, bound_s: float) -> subprocess.Popen[bytes]:
    script = (CHART / "files" / "engine-drain.py").read_text()
    return subprocess.Popen([sys.executable, "-c", script, port, str(bound_s)])


def test_prestop_waits_until_no_request_is_running_or_waiting(metrics: _Metrics) -> None:
    proc = _hook(metrics.port, 60)
    deadline = time.monotonic() + 20
    while metrics.hits < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the hook polls once a second: let it see the busy engine twice
    assert proc.poll() is None, "returned while requests were in flight"
    metrics.running = 0.0
    seen = metrics.hits
    while metrics.hits < seen + 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # polled at least once with nothing running but one waiting
    assert proc.poll() is None, "returned while a request was still waiting"
    metrics.waiting = 0.0
    assert proc.wait(timeout=10) == 0


def test_prestop_is_bounded(metrics: _Metrics) -> None:
    t0 = time.monotonic()
    assert _hook(metrics.port, 1.5).wait(timeout=10) == 0
    assert time.monotonic() - t0 < 8


def test_prestop_returns_when_the_engine_does_not_answer() -> None:
    assert _hook("1", 60).wait(timeout=10) == 0


def test_engine_actuation_rbac_and_flags() -> None:
    objs = render(values())
    role = one(objs, "Role", "gov-llm-governor-engines")
    assert role["metadata"]["namespace"] == "llm"
    deps, pods = role["rules"]
    assert deps["resources"] == ["deployments"] and deps["verbs"] == ["get", "patch"]
    assert deps["resourceNames"] == ["code-assistant", "llama-8b"]  # exactly those
    assert pods == {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}
    one(objs, "RoleBinding", "gov-llm-governor-engines")
    args = container(one(objs, "Deployment")["spec"]["template"]["spec"], "governor")["args"]
    assert arg_value(args, "--knob-rollouts") == "on"
    assert arg_value(args, "--drain-scale-in") == "on"
    drain_only = render(values(actuation={"knobRollouts": False, "drainScaleIn": True}))
    deps, pods = one(drain_only, "Role", "gov-llm-governor-engines")["rules"]
    assert deps["verbs"] == ["get"]  # the drain only reads the Deployments' selectors
    assert pods["verbs"] == ["list", "patch"]
    off = render(values(actuation={"knobRollouts": False, "drainScaleIn": False}))
    assert not find(off, "Role", "gov-llm-governor-engines")
    args = container(one(off, "Deployment")["spec"]["template"]["spec"], "governor")["args"]
    assert arg_value(args, "--knob-rollouts") == "off"


def _crd(with_behavior: bool) -> dict[str, Any]:
    """The part of scaledobjects.keda.sh that matters: fallback.behavior from KEDA 2.15."""
    fb: dict[str, Any] = {"replicas": {"type": "integer"}}
    if with_behavior:
        fb["behavior"] = {"type": "string"}
    spec = {"properties": {"fallback": {"properties": fb}}}
    schema = {"openAPIV3Schema": {"properties": {"spec": spec}}}
    return {"spec": {"versions": [{"name": "v1alpha1", "schema": schema}]}}


def test_old_keda_is_detected_from_its_crd(tmp_path: Path) -> None:
    """The install checks the CRD `lookup` returns (offline renders cannot serve one, so
    the helper is called with stand-in CRD objects)."""
    chart = chart_copy(tmp_path, drop_schema=True)
    (chart / "templates" / "probe-crd.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe, namespace: x}\ndata:\n"
        '  keda215: "{{ include "llm-governor.crdHasFallbackBehavior" .Values.crd215 }}"\n'
        '  keda214: "{{ include "llm-governor.crdHasFallbackBehavior" .Values.crd214 }}"\n'
    )
    vals = values(crd215=_crd(True), crd214=_crd(False))
    probe = one(parse(render_files(vals, chart=chart)), "ConfigMap", "probe")
    assert probe["data"] == {"keda215": "true", "keda214": ""}
