"""The chart renders, for each mode and a matrix of values, into objects that the
Kubernetes schemas accept, that `helm lint --strict` accepts, and that carry the
properties the design requires (security context, no HPA damping, KEDA fallback, ...)."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import (
    CHART,
    MODEL_8B,
    MODEL_CODE,
    MODEL_OTHER_NS,
    NAMESPACE,
    arg_value,
    container,
    find,
    helm,
    one,
    render,
    render_files,
    validate,
    values,
)

# Models whose min_replicas >= 1 (sidecar mode with placement engine requires it).
_MODEL_CODE_MIN1 = {**MODEL_CODE, "replicas": {"min_replicas": 1, "max_replicas": 8}}

# id -> (values, release namespace). Sidecar cases install into the models' namespace "llm".
MATRIX: dict[str, tuple[dict[str, Any], str]] = {
    "standalone-keda-defaults": (values(), NAMESPACE),
    "standalone-keda-everything": (
        values(
            models=[MODEL_8B, MODEL_CODE, MODEL_OTHER_NS],
            scaling={"keda": {"triggerType": "external", "fallback": {"enabled": False}}},
            monitoring={"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
            exampleEngine={"enabled": True, "model": "code-assistant"},
            image={"digest": "sha256:" + "a" * 64},
            governor={
                "extraArgs": ["--log-level", "debug"],
                "extraEnv": [{"name": "X", "value": "1"}],
            },
        ),
        NAMESPACE,
    ),
    "standalone-kubernetes": (
        values(models=[MODEL_8B, MODEL_CODE, MODEL_OTHER_NS], scaling={"via": "kubernetes"}),
        NAMESPACE,
    ),
    "standalone-kubernetes-no-hpa-check": (
        values(scaling={"via": "kubernetes"}, rbac={"hpaConflictCheck": False}),
        NAMESPACE,
    ),
    "standalone-hpa": (
        values(
            models=[MODEL_8B, MODEL_CODE, MODEL_OTHER_NS],
            scaling={"via": "hpa"},
            monitoring={"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}},
        ),
        NAMESPACE,
    ),
    "standalone-single-replica": (
        values(
            standalone={"replicas": 1, "podDisruptionBudget": {"enabled": False}},
            leaderElection={"enabled": False},
            networkPolicy={"enabled": False},
            monitoring={"dashboard": {"enabled": False}},
        ),
        NAMESPACE,
    ),
    "standalone-targets-unmanaged": (values(targets={"managedByHelm": False}), NAMESPACE),
    "standalone-existing-serviceaccount": (
        values(
            serviceAccount={"create": False, "name": "platform-sa"},
            rbac={"create": False},
            fullnameOverride="governor",
        ),
        NAMESPACE,
    ),
    "sidecar-engine-native": (
        values(
            mode="sidecar",
            models=[MODEL_8B, _MODEL_CODE_MIN1],
            exampleEngine={"enabled": True},
            monitoring={"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
        ),
        "llm",
    ),
    "sidecar-engine-classic": (
        values(
            mode="sidecar",
            models=[MODEL_8B, _MODEL_CODE_MIN1],
            sidecar={"native": False},
            exampleEngine={"enabled": True},
        ),
        "llm",
    ),
    "sidecar-router-scale-to-zero": (
        values(mode="sidecar", sidecar={"placement": "router"}, scaling={"via": "kubernetes"}),
        "llm",
    ),
}


def _render(case: str) -> list[dict[str, Any]]:
    vals, ns = MATRIX[case]
    return render(vals, namespace=ns)


def _governor_containers(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every container or init container that runs the governor image."""
    out = []
    for o in objs:
        if o["kind"] != "Deployment":
            continue
        spec = o["spec"]["template"]["spec"]
        for c in (spec.get("initContainers") or []) + spec["containers"]:
            if c["image"].startswith("llm-governor"):
                out.append(c)
    return out


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_object_matches_its_schema(case: str) -> None:
    objs = _render(case)
    assert objs, "nothing rendered"
    for obj in objs:
        validate(obj)
    keys = Counter((o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs)
    dupes = [k for k, n in keys.items() if n > 1]
    assert not dupes, f"objects rendered twice: {dupes}"
    for o in objs:
        if o["kind"] not in ("Namespace",):
            assert o["metadata"].get("namespace"), (
                f"{o['kind']} {o['metadata']['name']}: no namespace"
            )


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_helm_lint_strict_is_clean(case: str) -> None:
    vals, ns = MATRIX[case]
    report = helm.lint(str(CHART), vals, strict=True, namespace=ns)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems, problems
    assert not report["errors"], report["errors"]


def test_rendered_against_kubernetes_1_33_or_newer() -> None:
    """The offline render's .Capabilities.KubeVersion decides `tolerance` on a plain HPA
    (>= 1.33); the schemas the objects are validated against are that version's
    (chart.KUBE_VERSION)."""
    hpa = find(_render("standalone-hpa"), "HorizontalPodAutoscaler")[0]
    assert hpa["spec"]["behavior"]["scaleUp"]["tolerance"] == "0"


def test_standalone_mode_objects() -> None:
    objs = _render("standalone-keda-defaults")
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    args = container(dep["spec"]["template"]["spec"], "governor")["args"]
    assert arg_value(args, "--leader-election") == "on"
    assert arg_value(args, "--store") == "configmap"
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    svc = one(objs, "Service")
    assert {p["name"] for p in svc["spec"]["ports"]} == {"grpc", "metrics"}
    assert one(objs, "NetworkPolicy")["spec"]["podSelector"] == dep["spec"]["selector"]
    assert len(find(objs, "ScaledObject")) == 2
    # Dashboard on by default; CRD-backed monitoring objects off by default.
    assert one(objs, "ConfigMap", "gov-llm-governor-dashboard")
    assert not find(objs, "ServiceMonitor") and not find(objs, "PrometheusRule")


def test_sidecar_mode_renders_no_governor_deployment() -> None:
    objs = render(values(mode="sidecar", models=[MODEL_8B]), namespace="llm")
    assert not find(objs, "Deployment"), "sidecar mode must not create a governor Deployment"
    assert not find(objs, "PodDisruptionBudget")
    assert not find(objs, "NetworkPolicy"), "would isolate the engine pods' own port"
    assert one(objs, "Service")
    assert one(objs, "ScaledObject")


def test_governor_containers_are_locked_down() -> None:
    for case in MATRIX:
        objs = _render(case)
        containers = _governor_containers(objs)
        if MATRIX[case][0].get("mode", "standalone") == "standalone":
            assert containers, case
        for c in containers:
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, (case, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (case, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (case, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (case, c["name"])
            # Pod Security "restricted": in sidecar mode the pod's context is the engine's.
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", (case, c["name"])
            # Set on the container: in sidecar mode the pod's context is the engine's.
            assert sc["runAsUser"] > 0 and sc["runAsGroup"] > 0, (case, c["name"])
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
            assert c["resources"]["limits"]["memory"]
        for dep in find(objs, "Deployment"):
            pod = dep["spec"]["template"]["spec"]
            if dep["metadata"]["name"] == "gov-llm-governor":
                psc = pod["securityContext"]
                assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0
                assert psc["seccompProfile"]["type"] == "RuntimeDefault"


def _assert_no_damping(behavior: dict[str, Any], max_replicas: int, tolerance: bool = True) -> None:
    up, down = behavior["scaleUp"], behavior["scaleDown"]
    assert up["stabilizationWindowSeconds"] == 0 and down["stabilizationWindowSeconds"] == 0
    assert up["selectPolicy"] == "Max" and down["selectPolicy"] == "Max"
    # From any count to max replicas within one period; down to min within one period.
    assert any(p["type"] == "Pods" and p["value"] >= max_replicas for p in up["policies"])
    assert any(p["type"] == "Percent" and p["value"] >= 100 for p in down["policies"])
    if tolerance:
        assert up["tolerance"] == "0" and down["tolerance"] == "0"
    else:
        assert "tolerance" not in up and "tolerance" not in down


def test_keda_scaled_objects_add_no_damping_and_have_fallback() -> None:
    objs = _render("standalone-keda-defaults")
    by_target = {so["spec"]["scaleTargetRef"]["name"]: so for so in find(objs, "ScaledObject")}
    assert set(by_target) == {"llama-8b", "code-assistant"}
    so = by_target["llama-8b"]
    spec = so["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 16)
    # No tolerance offline: scaling.zeroTolerance=auto could not read KEDA's CRD
    # (test_fail_safe.py covers the switch).
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    _assert_no_damping(behavior, 16, tolerance=False)
    # a governor outage holds max(current, fallback_replicas): it never shrinks the fleet
    assert spec["fallback"] == {
        "failureThreshold": 3,
        "replicas": 2,  # fallback_replicas
        "behavior": "currentReplicasIfHigher",
    }
    trig = spec["triggers"][0]
    assert trig["type"] == "external-push"
    assert trig["metadata"]["model"] == MODEL_8B["name"]
    assert trig["metadata"]["namespace"] == "llm"
    assert so["metadata"]["namespace"] == "llm"
    # No fallback_replicas and min 0: hold at least one replica when the scaler fails.
    code = by_target["code-assistant"]["spec"]
    assert code["minReplicaCount"] == 0
    assert code["fallback"]["replicas"] == 1


def test_keda_trigger_type_and_fallback_switch() -> None:
    objs = _render("standalone-keda-everything")
    for so in find(objs, "ScaledObject"):
        assert so["spec"]["triggers"][0]["type"] == "external"
        assert "fallback" not in so["spec"]


def test_plain_hpa_per_model_on_desired_replicas() -> None:
    objs = _render("standalone-hpa")
    assert not find(objs, "ScaledObject")
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in find(objs, "HorizontalPodAutoscaler")}
    assert set(hpas) == {"llama-8b", "code-assistant", "qwen"}
    h = hpas["code-assistant"]
    assert h["metadata"]["namespace"] == "llm"
    # min_replicas 0 cannot be held by a plain HPA (needs the HPAScaleToZero alpha gate).
    assert (h["spec"]["minReplicas"], h["spec"]["maxReplicas"]) == (1, 8)
    (metric,) = h["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    _assert_no_damping(h["spec"]["behavior"], 8)
    assert hpas["qwen"]["metadata"]["namespace"] == "research"
    # The governor itself must not patch Deployments (the HPA owns the scale).
    args = container(one(objs, "Deployment")["spec"]["template"]["spec"], "governor")["args"]
    assert arg_value(args, "--scale-via") == "keda"


def test_direct_scale_mode_has_no_keda_or_hpa() -> None:
    objs = _render("standalone-kubernetes")
    assert not find(objs, "ScaledObject") and not find(objs, "HorizontalPodAutoscaler")
    args = container(one(objs, "Deployment")["spec"]["template"]["spec"], "governor")["args"]
    assert arg_value(args, "--scale-via") == "kubernetes"


def test_example_engine_gpu_pool_and_engine_args() -> None:
    objs = _render("standalone-keda-everything")
    dep = one(objs, "Deployment", "code-assistant")
    assert dep["metadata"]["namespace"] == "llm"
    assert "replicas" not in dep["spec"], "the governor owns the replica count"
    pod = dep["spec"]["template"]["spec"]
    vllm = container(pod, "vllm")
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    cmd = " ".join(vllm["command"] + vllm["args"])
    assert "$(cat /run/governor/engine-args)" in cmd
    assert '--served-model-name "$MODEL"' in cmd
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["MODEL"] == "code-assistant"
    init = container(pod, "governor-engine-args", init=True)
    script = init["args"][0]
    assert 'governor engine-args --model "$GOVERNOR_MODEL"' in script
    assert "> /run/governor/engine-args\n" in script
    ienv = {e["name"]: e.get("value") for e in init["env"]}
    assert ienv["GOVERNOR_MODEL"] == "code-assistant"
    # Standalone: the engine (another namespace) asks the governor's Service.
    assert ienv["GOVERNOR_SERVER"] == "gov-llm-governor.llm-system.svc.cluster.local:50051"
    # The hand-over directory is shared by the init container and the engine.
    mounts = {m["name"] for m in vllm["volumeMounts"]} & {m["name"] for m in init["volumeMounts"]}
    assert "governor-engine-args" in mounts
    assert pod["automountServiceAccountToken"] is False


def test_engine_args_fallback_knobs_come_from_the_model() -> None:
    objs = render(values(exampleEngine={"enabled": True}))
    init = container(
        one(objs, "Deployment", "llama-8b")["spec"]["template"]["spec"],
        "governor-engine-args",
        init=True,
    )
    # MODEL_8B sets knobs.default_max_num_seqs 128 and leaves the token default.
    assert "--default-max-num-seqs 128" in init["args"][0]
    assert "--default-max-num-batched-tokens" not in init["args"][0]


def test_native_sidecar_starts_before_engine_args() -> None:
    objs = _render("sidecar-engine-native")
    pod = one(objs, "Deployment", "llama-8b")["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["initContainers"]]
    assert names == ["governor", "governor-engine-args"], names
    gov = pod["initContainers"][0]
    assert gov["restartPolicy"] == "Always"
    # No startup probe: it would hold the engine back until the governor serves.
    assert "startupProbe" not in gov
    env = {e["name"]: e.get("value") for e in pod["initContainers"][1]["env"]}
    assert env["GOVERNOR_SERVER"] == "127.0.0.1:50051"
    assert [c["name"] for c in pod["containers"]] == ["vllm"]


def test_classic_sidecar_runs_next_to_the_engine() -> None:
    objs = _render("sidecar-engine-classic")
    pod = one(objs, "Deployment", "llama-8b")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["governor-engine-args"]
    assert [c["name"] for c in pod["containers"]] == ["vllm", "governor"]
    assert "restartPolicy" not in container(pod, "governor")
    env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert env["GOVERNOR_SERVER"] == "gov-llm-governor.llm.svc.cluster.local:50051"


def test_targets_managed_by_helm_or_by_the_governor() -> None:
    managed = _render("standalone-keda-defaults")
    assert one(managed, "ConfigMap", "gov-llm-governor-targets")
    state = one(managed, "ConfigMap", "gov-llm-governor-targets-state")
    assert "data" not in state, "Helm must never own the state the governor writes"
    unmanaged = _render("standalone-targets-unmanaged")
    assert not find(unmanaged, "ConfigMap", "gov-llm-governor-targets")
    assert not find(unmanaged, "ConfigMap", "gov-llm-governor-targets-state")


def test_config_change_restarts_pods() -> None:
    def checksum(vals: dict[str, Any]) -> str:
        dep = one(render(vals), "Deployment")
        return dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum(values()) == checksum(values())
    assert checksum(values()) != checksum(values(policy={"tick_interval_s": 10}))


def test_notes_name_the_grpc_address_and_adapter_rule() -> None:
    notes = render_files(MATRIX["standalone-hpa"][0])["llm-governor/templates/NOTES.txt"]
    assert "gov-llm-governor.llm-system.svc.cluster.local:50051" in notes
    assert "seriesQuery: 'governor_target_desired_replicas'" in notes


def test_schema_validation_is_not_vacuous() -> None:
    """The validation above refuses what the API server would refuse."""
    import copy

    objs = _render("standalone-keda-everything")
    broken: list[dict[str, Any]] = []
    dep = copy.deepcopy(one(objs, "Deployment", "gov-llm-governor"))
    dep["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["port"] = "grpc"
    broken.append(dep)
    svc = copy.deepcopy(one(objs, "Service", "gov-llm-governor"))
    svc["spec"]["ports"][0]["protocl"] = "TCP"
    broken.append(svc)
    so = copy.deepcopy(find(objs, "ScaledObject")[0])
    so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["policies"][0][
        "periodSeconds"
    ] = 3600
    broken.append(so)
    rule = copy.deepcopy(one(objs, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "two minutes"
    broken.append(rule)
    for obj in broken:
        with pytest.raises(AssertionError):
            validate(obj)


def test_packaged_chart_renders_the_same(tmp_path: Path) -> None:
    """`helm package` keeps every file the templates need (.helmignore), and the chart's
    appVersion (the default image tag) is the package version it deploys."""
    archive = helm.package(str(CHART), destination=str(tmp_path))
    with helm.Chart.load(archive) as packaged:
        assert packaged.version == "0.1.0"
        files = packaged.render(values(), name="gov", namespace=NAMESPACE)
    assert files == render_files(values())
    assert "llm-governor/files/dashboard.json" not in files  # data, not a template
    pyproject = tomllib.loads((CHART.parents[1] / "pyproject.toml").read_text())
    with helm.Chart.load(str(CHART)) as chart:
        assert chart.metadata["appVersion"] == pyproject["project"]["version"]
