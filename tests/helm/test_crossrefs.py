"""Cross-references between the rendered objects and between the chart and the product:

- KEDA's scalerAddress and port are the governor Service's gRPC port, which is the
  container port the governor listens on;
- RBAC names exactly the configured Deployments (scale subresource), the store's
  ConfigMaps and the Lease that the container's flags name, and binds the pods' account;
- the container's flags are accepted by the real `governor` CLI, the config and targets
  ConfigMaps by the real config/targets validation;
- a real `governor run` started with the rendered flags answers SERVING to exactly the
  probes' gRPC health requests, and its /metrics lists every governor metric the
  dashboard and the alerts use (vLLM names: docs/ARCHITECTURE.md, Signals);
- the HPA's external metric is the PrometheusRule's recording rule, with its labels.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from actuators.rollout import WAITING_SECONDS
from controller.config import parse_config
from controller.targets import TargetsDoc, build_config
from service.cli import build_parser
from tests.helm.chart import (
    FULLNAME,
    MODEL_8B,
    MODEL_CODE,
    MODEL_OTHER_NS,
    NAMESPACE,
    ROOT,
    arg_value,
    container,
    find,
    one,
    render,
    render_files,
    values,
)

ALL_MODELS = [MODEL_8B, MODEL_CODE, MODEL_OTHER_NS]
# scaling.via=hpa needs both: the recording rule and the scrape it reads.
_HPA_MONITORING = {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}

# vLLM V1 metric names the chart may query (docs/ARCHITECTURE.md, Signals: gauges as is,
# counters with `_total`, histograms with their series suffixes; deprecated names too).
_VLLM_GAUGES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
}
_VLLM_COUNTERS = {
    "vllm:prefix_cache_hits",
    "vllm:prefix_cache_queries",
    "vllm:num_preemptions",
    "vllm:request_success",
}
_VLLM_HISTOGRAMS = {
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:iteration_tokens_total",
    # per-request phases and TPOT (vLLM >= 0.9 / 0.11), read by the recording rules
    "vllm:request_decode_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_time_per_output_token_seconds",
}
# kube-state-metrics: the engine Deployments' replicas (the actuation-gap alert).
KUBE_STATE_SERIES = {"kube_deployment_spec_replicas"}
CLUSTER_ONLY_SERIES = {WAITING_SECONDS}
"""Governor series exported only inside a cluster, which the governor run here is not:
the knob roll-out actuator's (`--knob-rollouts auto`), on its own registry hook
(actuators.rollout.KnobRolloutActuator.register_metrics, tested with the fake API)."""
VLLM_SERIES = (
    _VLLM_GAUGES
    | {f"{c}_total" for c in _VLLM_COUNTERS}
    | {f"{h}{s}" for h in _VLLM_HISTOGRAMS for s in ("_bucket", "_sum", "_count")}
)
# The same names with `:` escaped to `_`, as prometheus_client 0.26's OpenMetrics
# exposition writes them (the governor's queries and recording rules read both).
VLLM_SERIES |= {n.replace(":", "_") for n in VLLM_SERIES}


# ---------------------------------------------------------------------- helpers
def _governor_pod(objs: list[dict[str, Any]], name: str = FULLNAME) -> dict[str, Any]:
    return one(objs, "Deployment", name)["spec"]["template"]["spec"]


def _port_of(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


def _scale_grants(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(namespace, deployment) pairs any Role lets the governor scale (the `-engines`
    Roles of roll-outs and drain touch the pod template and pods, checked apart)."""
    out = set()
    for role in find(objs, "Role"):
        if role["metadata"]["name"].endswith("-engines"):
            continue
        for rule in role["rules"]:
            if any("deployments" in r for r in rule["resources"]):
                assert rule["resources"] == ["deployments/scale"], rule
                assert rule.get("resourceNames"), f"unrestricted deployment access: {rule}"
                for name in rule["resourceNames"]:
                    out.add((role["metadata"]["namespace"], name))
    return out


_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (Grafana variables allowed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    # label lists of by/without/on/ignoring/group_left/group_right
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\(?)", text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def test_metric_names_parser() -> None:
    expr = (
        'max by (model) (governor_desired_replicas{model=~"$model"} and on(instance) '
        "(governor_leader == 1)) or histogram_quantile(0.95, sum by (le) "
        '(rate(vllm:inter_token_latency_seconds_bucket{model_name="a:b"}[5m]))) > 0.05'
    )
    assert metric_names(expr) == {
        "governor_desired_replicas",
        "governor_leader",
        "vllm:inter_token_latency_seconds_bucket",
    }


# ---------------------------------------------------------------------- KEDA <-> Service
@pytest.mark.parametrize("mode", ["standalone", "sidecar"])
def test_scaler_address_and_port_are_the_services_grpc_port(mode: str) -> None:
    ns = NAMESPACE if mode == "standalone" else "llm"
    models = ALL_MODELS if mode == "standalone" else [MODEL_8B]
    objs = render(values(mode=mode, models=models, exampleEngine={"enabled": True}), namespace=ns)
    svc = one(objs, "Service", FULLNAME)
    svc_port = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
    scaled = find(objs, "ScaledObject")
    assert len(scaled) == len(models)
    for so in scaled:
        (trigger,) = so["spec"]["triggers"]
        host, port = trigger["metadata"]["scalerAddress"].rsplit(":", 1)
        assert host == f"{FULLNAME}.{ns}.svc.cluster.local"
        assert int(port) == svc_port["port"]
    # The Service's target port is the governor container's port, where it listens.
    if mode == "standalone":
        pod = _governor_pod(objs)
        pod_labels = one(objs, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
        gov = container(pod, "governor")
    else:
        engine = one(objs, "Deployment", MODEL_8B["deployment"])
        pod, pod_labels = (
            engine["spec"]["template"]["spec"],
            engine["spec"]["template"]["metadata"]["labels"],
        )
        gov = container(pod, "governor", init=True)
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    named = {p["name"]: p["containerPort"] for p in gov["ports"]}
    assert svc_port["targetPort"] == named["grpc"]
    assert named["grpc"] == _port_of(arg_value(gov["args"], "--grpc-listen"))
    metrics = next(p for p in svc["spec"]["ports"] if p["name"] == "metrics")
    assert metrics["targetPort"] == named["metrics"]
    assert named["metrics"] == _port_of(arg_value(gov["args"], "--metrics-listen"))


def test_service_and_network_policy_ports_are_numbers() -> None:
    """Kubernetes resolves a Service's named targetPort against a native sidecar (an init
    container with restartPolicy Always) only from 1.32 (kubernetes#127958): on 1.29-1.31,
    which the chart supports, a sidecar-mode Service would have no endpoints and KEDA no
    scaler. Named NetworkPolicy ports fail the same way in some network plugins
    (kubernetes#125285). So both carry the number the governor listens on."""
    ports = {"ports": {"grpc": 6000, "metrics": 9100}}
    objs = render(
        values(mode="sidecar", models=[MODEL_8B], exampleEngine={"enabled": True}, **ports),
        namespace="llm",
    )
    engine = one(objs, "Deployment", MODEL_8B["deployment"])["spec"]["template"]["spec"]
    gov = container(engine, "governor", init=True)
    assert gov["restartPolicy"] == "Always"
    listen = {
        "grpc": _port_of(arg_value(gov["args"], "--grpc-listen")),
        "metrics": _port_of(arg_value(gov["args"], "--metrics-listen")),
    }
    assert listen == {"grpc": 6000, "metrics": 9100}
    svc = one(objs, "Service", FULLNAME)
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == listen
    assert all(type(p["targetPort"]) is int for p in svc["spec"]["ports"])
    # The NetworkPolicy (standalone mode only: a policy would also fence the engine's pods).
    assert not find(objs, "NetworkPolicy")
    standalone = render(values(**ports))
    gov = container(_governor_pod(standalone), "governor")
    policy = one(standalone, "NetworkPolicy", FULLNAME)
    policy_ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert all(type(p) is int for p in policy_ports), policy_ports
    assert policy_ports == [
        _port_of(arg_value(gov["args"], "--grpc-listen")),
        _port_of(arg_value(gov["args"], "--metrics-listen")),
    ]


def test_scaled_objects_name_configured_models_and_their_deployments() -> None:
    objs = render(values(models=ALL_MODELS))
    cfg = parse_config(
        yaml.safe_load(one(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"]),
        environ={},
    )
    expected = {(m.namespace, m.deployment, m.name) for m in cfg.models}
    got = {
        (
            so["metadata"]["namespace"],
            so["spec"]["scaleTargetRef"]["name"],
            so["spec"]["triggers"][0]["metadata"]["model"],
        )
        for so in find(objs, "ScaledObject")
    }
    assert got == expected
    for so in find(objs, "ScaledObject"):
        # actuators/keda.py: scalerMetadata.namespace, when given, must be the model's.
        meta = so["spec"]["triggers"][0]["metadata"]
        assert meta["namespace"] == so["metadata"]["namespace"]


def test_example_engine_is_what_the_scaled_object_scales() -> None:
    objs = render(values(exampleEngine={"enabled": True, "model": "code-assistant"}))
    engine = one(objs, "Deployment", "code-assistant")
    so = next(
        s
        for s in find(objs, "ScaledObject")
        if s["spec"]["scaleTargetRef"]["name"] == "code-assistant"
    )
    assert so["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    assert so["metadata"]["namespace"] == engine["metadata"]["namespace"]
    init = container(engine["spec"]["template"]["spec"], "governor-engine-args", init=True)
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["GOVERNOR_MODEL"] == so["spec"]["triggers"][0]["metadata"]["model"]
    # engine-args asks the same gRPC endpoint KEDA uses.
    assert env["GOVERNOR_SERVER"] == so["spec"]["triggers"][0]["metadata"]["scalerAddress"]


# ---------------------------------------------------------------------- RBAC
def test_rbac_names_exactly_the_scaled_deployments() -> None:
    objs = render(values(models=ALL_MODELS, scaling={"via": "kubernetes"}))
    expected = {(m["namespace"], m["deployment"]) for m in ALL_MODELS}
    assert _scale_grants(objs) == expected
    sa = _governor_pod(objs)["serviceAccountName"]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in find(objs, "Role")}
    for rb in find(objs, "RoleBinding"):
        assert (rb["metadata"]["namespace"], rb["roleRef"]["name"]) in roles
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    # One scale Role per namespace that holds scaled Deployments, and nothing cluster-wide.
    scale_roles = [r for r in find(objs, "Role") if r["metadata"]["name"].endswith("-scale")]
    assert sorted(r["metadata"]["namespace"] for r in scale_roles) == ["llm", "research"]
    assert not find(objs, "ClusterRole") and not find(objs, "ClusterRoleBinding")
    for role in find(objs, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
            verbs = {"get", "update", "patch", "create", "list", "watch"}
            assert set(rule["verbs"]) <= verbs, rule
            if "watch" in rule["verbs"]:
                # the targets ConfigMap's watch (list + watch by name), nothing else
                assert rule["resources"] == ["configmaps"], rule
                assert rule["verbs"] == ["list", "watch"] and len(rule["resourceNames"]) == 1
            elif "list" in rule["verbs"] and rule["resources"] == ["pods"]:
                # The drain (actuation.drainScaleIn) lists the engine pods and patches
                # their pod-deletion-cost; pods cannot be named in advance.
                assert role["metadata"]["name"].endswith("-engines"), role
                assert rule["verbs"] == ["list", "patch"], rule
            elif "list" in rule["verbs"]:
                # Otherwise only the HPA conflict check lists, read-only.
                assert rule["resources"] == ["horizontalpodautoscalers"], rule
                assert rule["verbs"] == ["list"], rule
            if rule["resources"] == ["deployments"]:  # roll-outs: exactly the engines
                ns = role["metadata"]["namespace"]
                names = {d for n, d in expected if n == ns}
                assert set(rule["resourceNames"]) == names, rule


def test_rbac_without_direct_scaling_grants_no_deployment_access() -> None:
    for via in ("keda", "hpa"):
        extra = {"monitoring": _HPA_MONITORING} if via == "hpa" else {}
        objs = render(values(models=ALL_MODELS, scaling={"via": via}, **extra))
        assert _scale_grants(objs) == set(), via
        roles = [r for r in find(objs, "Role") if not r["metadata"]["name"].endswith("-engines")]
        assert [r["metadata"]["namespace"] for r in roles] == [NAMESPACE], via
        off = render(
            values(
                models=ALL_MODELS,
                scaling={"via": via},
                actuation={"knobRollouts": False, "drainScaleIn": False},
                **extra,
            )
        )
        assert [r["metadata"]["namespace"] for r in find(off, "Role")] == [NAMESPACE], via


@pytest.mark.parametrize("check", [True, False])
def test_rbac_hpa_conflict_check_can_be_turned_off(check: bool) -> None:
    """Off: no list rule, and the governor told not to list (else a 403 per namespace
    and interval, and no conflict ever seen)."""
    objs = render(values(scaling={"via": "kubernetes"}, rbac={"hpaConflictCheck": check}))
    resources = {
        r for role in find(objs, "Role") for rule in role["rules"] for r in rule["resources"]
    }
    assert ("horizontalpodautoscalers" in resources) is check
    args = container(_governor_pod(objs), "governor")["args"]
    assert arg_value(args, "--hpa-conflict-check") == ("on" if check else "off")


@pytest.mark.parametrize("managed", [True, False])
def test_rbac_names_the_store_and_lease_the_flags_name(managed: bool) -> None:
    objs = render(values(targets={"managedByHelm": managed}))
    args = container(_governor_pod(objs), "governor")["args"]
    cm, lease = arg_value(args, "--configmap"), arg_value(args, "--lease")
    assert arg_value(args, "--namespace") == NAMESPACE
    role = one(objs, "Role", FULLNAME)
    assert role["metadata"]["namespace"] == NAMESPACE
    by_resource: dict[str, list[dict[str, Any]]] = {}
    for rule in role["rules"]:
        for r in rule["resources"]:
            by_resource.setdefault(r, []).append(rule)
    named_cms = [r for r in by_resource["configmaps"] if r.get("resourceNames")]
    assert [(sorted(r["resourceNames"]), r["verbs"]) for r in named_cms] == [
        (sorted([cm, f"{cm}-state"]), ["get", "update"]),
        ([cm], ["list", "watch"]),  # the targets watch (service/cmwatch.py)
    ]
    creates = [r for r in by_resource["configmaps"] if "create" in r["verbs"]]
    if managed:
        # Helm creates both ConfigMaps, so the governor never needs `create`.
        assert not creates
        assert one(objs, "ConfigMap", cm) and one(objs, "ConfigMap", f"{cm}-state")
    else:
        assert creates and not find(objs, "ConfigMap", cm)
    named_leases = [r for r in by_resource["leases"] if r.get("resourceNames")]
    assert [r["resourceNames"] for r in named_leases] == [[lease]]


def test_no_lease_rights_without_leader_election() -> None:
    objs = render(
        values(
            standalone={"replicas": 1, "podDisruptionBudget": {"enabled": False}},
            leaderElection={"enabled": False},
        )
    )
    args = container(_governor_pod(objs), "governor")["args"]
    assert arg_value(args, "--leader-election") == "off"
    resources = {
        r for role in find(objs, "Role") for rule in role["rules"] for r in rule["resources"]
    }
    assert "leases" not in resources


# ---------------------------------------------------------------------- flags and config
@pytest.mark.parametrize("via", ["keda", "kubernetes", "hpa"])
def test_container_flags_are_accepted_by_the_governor_cli(via: str) -> None:
    extra = {"monitoring": _HPA_MONITORING} if via == "hpa" else {}
    objs = render(values(scaling={"via": via}, governor={"shutdownGraceSeconds": 7.5}, **extra))
    gov = container(_governor_pod(objs), "governor")
    args = build_parser().parse_args(gov["args"])
    assert args.command == "run"
    assert args.store == "configmap" and args.leader_election == "on"
    assert args.scale_via == ("kubernetes" if via == "kubernetes" else "keda")
    assert args.shutdown_grace_s == 7.5
    assert args.config.startswith(
        next(m["mountPath"] for m in gov["volumeMounts"] if m["name"] == "governor-config")
    )
    # The pod's grace period leaves the governor its own shutdown grace and more.
    assert _governor_pod(objs)["terminationGracePeriodSeconds"] > args.shutdown_grace_s


def test_engine_args_command_is_accepted_by_the_governor_cli() -> None:
    objs = render(values(exampleEngine={"enabled": True}))
    init = container(
        one(objs, "Deployment", "llama-8b")["spec"]["template"]["spec"],
        "governor-engine-args",
        init=True,
    )
    env = {e["name"]: e.get("value") for e in init["env"]}
    commands = [
        line.split(">", 1)[0]
        .replace('"$GOVERNOR_MODEL"', env["GOVERNOR_MODEL"])
        .replace('"$GOVERNOR_SERVER"', env["GOVERNOR_SERVER"])
        .split()
        for line in init["args"][0].splitlines()
        if line.strip().startswith("governor ")
    ]
    # engine.liveKnobs (default): the live command, then its start-only fallback.
    assert len(commands) == 2, init["args"][0]
    parsed = [build_parser().parse_args(argv[1:]) for argv in commands]
    for args in parsed:
        assert args.command == "engine-args"
        assert args.model == MODEL_8B["name"]
        assert args.default_max_num_seqs == 128
    assert parsed[0].live and parsed[0].plugin_dir == "/run/governor/plugin"
    # Without a governor the live engine starts at the model's knob bound (MODEL_8B: 512).
    assert parsed[0].default_max_num_seqs_ceiling == MODEL_8B["knobs"]["max_num_seqs_max"]
    assert not parsed[1].live and not parsed[1].plugin_dir


def test_config_and_targets_configmaps_pass_the_governors_validation() -> None:
    objs = render(values(models=ALL_MODELS, policy={"tick_interval_s": 10}))
    cfg = parse_config(
        yaml.safe_load(one(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"]),
        environ={},
    )
    assert [m.name for m in cfg.models] == [m["name"] for m in ALL_MODELS]
    assert cfg.policy.tick_interval_s == 10
    assert cfg.model("code-assistant").replicas.min_replicas == 0
    assert cfg.policy_for(cfg.model("code-assistant")).scale_down_stabilization_s == 600
    targets = TargetsDoc.model_validate(
        yaml.safe_load(one(objs, "ConfigMap", f"{FULLNAME}-targets")["data"]["targets.yaml"])
    )
    built = build_config(cfg, targets, "rendered targets")
    assert built.models == cfg.models


# ---------------------------------------------------------------------- a real governor
class _Governor:
    def __init__(self, proc: subprocess.Popen[str], grpc_port: int, metrics_port: int) -> None:
        self.proc, self.grpc_port, self.metrics_port = proc, grpc_port, metrics_port


def _local_argv(args: list[str], config: Path) -> list[str]:
    """The rendered flags with what needs a cluster swapped for local equivalents: the
    mounted config file, loopback listens on free ports, an in-memory store."""
    out = list(args)
    swaps = {
        "--config": str(config),
        "--grpc-listen": "127.0.0.1:0",
        "--metrics-listen": "127.0.0.1:0",
        "--store": "memory",
        "--leader-election": "off",
        "--knob-rollouts": "off",  # no API server here
        "--drain-scale-in": "off",
    }
    for flag, value in swaps.items():
        out[out.index(flag) + 1] = value
    return out


@pytest.fixture(scope="module")
def rendered_standalone() -> list[dict[str, Any]]:
    return render(
        values(
            models=ALL_MODELS,
            exampleEngine={"enabled": True},
            monitoring={"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}},
            # Unreachable at once: the governor must serve health whatever Prometheus does.
            prometheus={"url": "http://127.0.0.1:9", "timeout_s": 0.5},
        )
    )


@pytest.fixture(scope="module")
def governor(
    rendered_standalone: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Governor]:
    """`governor run` (the image's entry point) with the Deployment's rendered flags."""
    objs = rendered_standalone
    tmp = tmp_path_factory.mktemp("governor")
    config = tmp / "config.yaml"
    config.write_text(one(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
    argv = _local_argv(container(_governor_pod(objs), "governor")["args"], config)
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    found: dict[str, int] = {}
    ready = threading.Event()
    lines: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"serving gRPC on port (\d+), metrics on port (\d+)", line)
            if m:
                found.update(grpc=int(m.group(1)), metrics=int(m.group(2)))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        ready.wait(60)
        assert found, "governor run did not start:\n" + "".join(lines[-30:])
        yield _Governor(proc, found["grpc"], found["metrics"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    # SIGTERM (what the kubelet sends) is a clean exit within the pod's grace period.
    assert proc.returncode == 0, "".join(lines[-30:])


@pytest.fixture(scope="module")
def exported_series(governor: _Governor) -> set[str]:
    """Series names the running governor exports: from /metrics' families (with or without
    samples yet), counters as `_total`, histograms as `_bucket/_sum/_count`."""
    with urllib.request.urlopen(
        f"http://127.0.0.1:{governor.metrics_port}/metrics", timeout=10
    ) as r:
        text = r.read().decode()
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        if fam.type == "counter":
            names.add(f"{fam.name}_total")
        elif fam.type == "histogram":
            names.update(f"{fam.name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(fam.name)
        names.update(s.name for s in fam.samples if not s.name.endswith("_created"))
    return {n for n in names if n.startswith("governor_")}


def test_probes_hit_the_governors_grpc_health_service(
    governor: _Governor, rendered_standalone: list[dict[str, Any]]
) -> None:
    gov = container(_governor_pod(rendered_standalone), "governor")
    grpc_port = next(p["containerPort"] for p in gov["ports"] if p["name"] == "grpc")
    probes = {k: gov[k] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    with grpc.insecure_channel(f"127.0.0.1:{governor.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for kind, probe in probes.items():
            assert set(probe) >= {"grpc", "periodSeconds", "failureThreshold"}, kind
            assert probe["grpc"]["port"] == grpc_port, kind
            service = probe["grpc"].get("service", "")
            resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, (kind, service)
        # The check is not vacuous: an unknown service is NOT_FOUND.
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert probes["readinessProbe"]["grpc"]["service"] == "externalscaler.ExternalScaler"


def test_governor_exports_the_series_the_chart_relies_on(exported_series: set[str]) -> None:
    # Sanity of the scrape itself: families from controller/metrics.py and service/core.py.
    assert {
        "governor_desired_replicas",
        "governor_tick_duration_seconds_bucket",
        "governor_ticks_total",
        "governor_leader",
    } <= exported_series


def _rule_exprs(objs: list[dict[str, Any]]) -> tuple[list[str], set[str]]:
    rule = one(objs, "PrometheusRule")
    exprs, recorded = [], set()
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            exprs.append(r["expr"])
            if "record" in r:
                recorded.add(r["record"])
    return exprs, recorded


def _dashboard_exprs(objs: list[dict[str, Any]]) -> list[str]:
    cm = one(objs, "ConfigMap", f"{FULLNAME}-dashboard")
    import json

    dash = json.loads(cm["data"]["llm-governor.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        q = var.get("query")
        if isinstance(q, dict):
            m = re.fullmatch(r"label_values\(([\w:]+)(?:\{[^}]*\})?,\s*\w+\)", q["query"])
            assert m, q
            exprs.append(m.group(1))
    return exprs


@pytest.mark.parametrize("via", ["keda", "hpa"])
def test_dashboard_and_alerts_use_only_exported_metrics(
    exported_series: set[str], via: str
) -> None:
    objs = render(
        values(
            models=ALL_MODELS,
            scaling={"via": via},
            monitoring=_HPA_MONITORING,
        )
    )
    rule_exprs, recorded = _rule_exprs(objs)
    dash_exprs = _dashboard_exprs(objs)
    assert len(dash_exprs) >= 10 and len(rule_exprs) >= 7
    known = exported_series | VLLM_SERIES | KUBE_STATE_SERIES | CLUSTER_ONLY_SERIES | recorded
    for expr in rule_exprs + dash_exprs:
        names = metric_names(expr)
        assert names or expr == "vector(1)", expr  # vector(1): the recording rules' marker
        unknown = names - known
        assert not unknown, (
            f"{sorted(unknown)} in {expr!r} are neither exported by the governor nor vLLM metrics"
        )
    # The dashboard covers both sides: the governor's decisions and vLLM's SLA signals.
    used = set().union(*(metric_names(e) for e in dash_exprs))
    assert {"governor_desired_replicas", "governor_knob_max_num_seqs"} <= used
    assert "vllm:time_to_first_token_seconds_bucket" in used


def test_alerts_cover_sla_burn_staleness_and_actuation() -> None:
    # One model also sets the seed policy's e2e_p95_ms.
    code = {**MODEL_CODE, "sla": {**MODEL_CODE["sla"], "e2e_p95_ms": 20000}}
    models = [MODEL_8B, code, MODEL_OTHER_NS]
    objs = render(values(models=models, monitoring={"prometheusRule": {"enabled": True}}))
    rules = [r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    alerts = [r for r in rules if "alert" in r]
    names = {r["alert"] for r in alerts}
    assert {"GovernorSLABurn", "GovernorControllerStale", "GovernorActuationFailing"} <= names
    # One SLA burn alert per model and SLA field the model sets.
    burns = {
        (r["labels"]["model"], r["labels"]["sla"])
        for r in alerts
        if r["alert"] == "GovernorSLABurn"
    }
    expected = set()
    for m in models:
        expected |= {(m["name"], "ttft_p95"), (m["name"], "itl_p95")}
        for key in ("e2e_p95", "e2e_p99"):
            if m["sla"].get(f"{key}_ms"):
                expected.add((m["name"], key))
    assert burns == expected
    # Tail alerts: p99 and p99.9 per model for TTFT, ITL and end to end when set.
    tails = {
        (r["labels"]["model"], r["labels"]["latency"], r["labels"]["quantile"])
        for r in alerts
        if r["alert"].startswith("GovernorLatencyP")
    }
    assert (code["name"], "e2e", "p99.9") in tails
    assert (MODEL_OTHER_NS["name"], "e2e", "p99") not in tails
    assert len(tails) == 2 * (3 + 3 + 2)
    # The governor-side alerts select this release's Service (the ServiceMonitor's job);
    # the latency ones read vLLM's series, the unobserved one kube-state-metrics' only.
    vllm_side = {
        "GovernorSLABurn",
        "GovernorLatencyP99High",
        "GovernorLatencyP999High",
        "GovernorSlowReplica",
    }
    # One slow-replica alert per model, on the per-engine means recorded from that
    # model's vLLM series only.
    slow = {r["labels"]["model"]: r["expr"] for r in alerts if r["alert"] == "GovernorSlowReplica"}
    gaps = {
        r["labels"]["model"]: (r["record"], r["expr"])
        for r in rules
        if r.get("record", "").startswith("governor:engine_token_gap_seconds:")
    }
    assert set(slow) == set(gaps) == {m["name"] for m in models}
    for name, expr in slow.items():
        others = [m["name"] for m in models if m["name"] != name]
        record, recorded = gaps[name]
        governor = f"{NAMESPACE}/{FULLNAME}"
        assert expr.count(f'{record}{{model="{name}", governor="{governor}"}}') == 3, expr
        assert "vllm:" not in expr
        assert f'model_name="{name}"' in recorded
        assert not any(f'model_name="{o}"' in recorded for o in others)
    for r in alerts:
        if r["alert"] not in vllm_side | {"GovernorActuationUnobserved"}:
            assert f'job="{FULLNAME}"' in r["expr"], r["alert"]


def test_hpa_metric_is_the_recording_rule() -> None:
    vals = values(
        models=ALL_MODELS,
        scaling={"via": "hpa"},
        monitoring=_HPA_MONITORING,
    )
    files = render_files(vals)
    objs = render(vals)
    records = {}
    for g in one(objs, "PrometheusRule")["spec"]["groups"]:
        if g["name"] != "llm-governor.targets":  # not the recording rules the governor reads
            continue
        for r in g["rules"]:
            if "record" in r:
                records[(r["labels"]["target_namespace"], r["labels"]["target_deployment"])] = r
    hpas = find(objs, "HorizontalPodAutoscaler")
    assert len(hpas) == len(ALL_MODELS) == len(records)
    for hpa in hpas:
        metric = hpa["spec"]["metrics"][0]["external"]["metric"]
        sel = metric["selector"]["matchLabels"]
        key = (sel["target_namespace"], sel["target_deployment"])
        assert key == (hpa["metadata"]["namespace"], hpa["spec"]["scaleTargetRef"]["name"])
        rule = records[key]
        assert metric["name"] == rule["record"]
        assert rule["labels"] == sel
        model = hpa["metadata"]["annotations"]["llm-governor.io/model"]
        assert f'model="{model}"' in rule["expr"]
    assert f"seriesQuery: '{metric['name']}'" in files["llm-governor/templates/NOTES.txt"]


# ---------------------------------------------------------------------- sidecar via .Subcharts
ENGINE_CHART = """\
apiVersion: v2
name: my-engine
version: 1.0.0
dependencies:
  - name: llm-governor
    version: 0.1.0
    alias: governor
"""
ENGINE_TEMPLATE = """\
{{- $gov := .Subcharts.governor }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: router
  namespace: {{ .Release.Namespace }}
spec:
  selector:
    matchLabels: {app: router}
  template:
    metadata:
      labels:
        app: router
        {{- include "llm-governor.sidecar.podLabels" $gov | nindent 8 }}
      annotations:
        {{- include "llm-governor.sidecar.podAnnotations" $gov | nindent 8 }}
    spec:
      {{- include "llm-governor.sidecar.podAccount" $gov | nindent 6 }}
      initContainers:
        {{- $args := dict "gov" $gov "model" "code-assistant" }}
        {{- include "llm-governor.sidecar.initContainers" $args | nindent 8 }}
      containers:
        - name: router
          image: example/router:1.0
          volumeMounts:
            {{- include "llm-governor.sidecar.engineArgsMount" $gov | nindent 12 }}
        {{- include "llm-governor.sidecar.containers" $gov | nindent 8 }}
      volumes:
        {{- include "llm-governor.sidecar.volumes" $gov | nindent 8 }}
"""


def _engine_chart(tmp_path: Path, template: str) -> Path:
    """An engine chart with this chart as its `governor` dependency and one template."""
    from tests.helm.chart import chart_copy

    engine = tmp_path / "my-engine"
    (engine / "templates").mkdir(parents=True)
    (engine / "Chart.yaml").write_text(ENGINE_CHART)
    (engine / "templates" / "deployment.yaml").write_text(template)
    (engine / "charts").mkdir()
    chart_copy(engine / "charts")
    return engine


def _pod_annotations(objs: list[dict[str, Any]], name: str) -> dict[str, str]:
    return one(objs, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]  # type: ignore[no-any-return]


def test_engine_chart_includes_the_sidecar_through_subcharts(tmp_path: Path) -> None:
    """The documented sidecar integration, from another chart that depends on this one."""
    from tests.helm.chart import parse, validate

    engine = _engine_chart(tmp_path, ENGINE_TEMPLATE)
    gov_values = values(mode="sidecar", sidecar={"placement": "router"})
    objs = parse(render_files({"governor": gov_values}, chart=engine, namespace="llm"))
    for obj in objs:
        validate(obj)
    router = one(objs, "Deployment", "router")
    pod = router["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["governor", "governor-engine-args"]
    gov = pod["initContainers"][0]
    assert gov["restartPolicy"] == "Always"
    # The same names as the subchart's own objects: Service selector, account, config.
    svc = one(objs, "Service", FULLNAME)
    assert (
        svc["spec"]["selector"].items() <= router["spec"]["template"]["metadata"]["labels"].items()
    )
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]
    config_vol = next(v for v in pod["volumes"] if v["name"] == "governor-config")
    assert one(objs, "ConfigMap", config_vol["configMap"]["name"])
    # The subchart's scope gives the image its appVersion, not the engine chart's version.
    assert gov["image"] == "llm-governor:0.1.0"
    assert not find(objs, "Deployment", FULLNAME)
    # The governor reads policy and prometheus only at start: a change rolls the pods.
    policy = values(mode="sidecar", sidecar={"placement": "router"}, policy={"tick_interval_s": 10})
    changed = parse(render_files({"governor": policy}, chart=engine, namespace="llm"))
    assert _pod_annotations(changed, "router") != _pod_annotations(objs, "router")


def _docs_engine_template() -> str:
    """docs/deploy.md's sidecar snippet (a Deployment's pod template) as a whole template."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    m = re.search(r"```yaml\n# templates/deployment.yaml \(pod template\)\n(.*?)```", doc, re.S)
    assert m, "the engine chart's pod template snippet is gone from docs/deploy.md"
    head = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: llama-8b\n"
        "  namespace: {{ .Release.Namespace }}\nspec:\n  selector:\n    matchLabels:\n"
        '      {{- include "llm-governor.sidecar.podLabels" .Subcharts.governor | nindent 6 }}\n'
        "  template:\n"
    )
    return head + m.group(1)


def test_documented_engine_chart_rolls_on_start_only_settings(tmp_path: Path) -> None:
    """An engine chart built from docs/deploy.md's snippet: its pods carry the governor, which
    reads `policy` and `prometheus` only at start, so a change to either must change the
    pod template (the engine Deployment rolls, as the docs' upgrade table says); an
    SLA-only change must not (SLAs apply live, no GPU pod restarts)."""
    from tests.helm.chart import parse, validate

    engine = _engine_chart(tmp_path, _docs_engine_template())

    def rendered(**overrides: Any) -> list[dict[str, Any]]:
        gov = values(**{"mode": "sidecar", "models": [MODEL_8B], **overrides})
        return parse(render_files({"governor": gov}, chart=engine, namespace="llm"))

    base = rendered()
    for obj in base:
        validate(obj)
    pod = one(base, "Deployment", "llama-8b")["spec"]["template"]["spec"]
    assert container(pod, "governor", init=True)["restartPolicy"] == "Always"
    before = _pod_annotations(base, "llama-8b")
    assert before, "no pod annotations from the documented snippet"
    assert _pod_annotations(rendered(policy={"tick_interval_s": 10}), "llama-8b") != before
    prom = {"url": "http://prometheus.monitoring.svc:9090"}
    assert _pod_annotations(rendered(prometheus=prom), "llama-8b") != before
    sla = {**MODEL_8B, "sla": {**MODEL_8B["sla"], "ttft_p95_ms": 400}}
    sla_only = rendered(models=[sla])
    template = one(base, "Deployment", "llama-8b")["spec"]["template"]
    assert one(sla_only, "Deployment", "llama-8b")["spec"]["template"] == template
    assert sla_only != base  # not vacuous: the targets ConfigMap changed
