"""The chart fails safe: sidecar mode never holds an engine back, SLA-only upgrades restart
no GPU pod, the scaling paths are configured so that they work or are refused at install.

Rendered with the real Helm library (tests/helm/chart.py). Kubernetes itself is not here:
what the kubelet does with a pod spec is read from its documented behaviour (a container
without a readiness probe is ready while it runs; native sidecars' readiness counts into
the Pod's Ready condition; a native sidecar's startup probe holds the next containers
back), and the one piece of runtime the chart adds, the sidecar's supervisor script, is
run for real with /bin/sh against stand-in `governor`, `sleep` and `date` commands.
"""

from __future__ import annotations

import copy
import functools
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helm import crd_schemas
from tests.helm.chart import (
    FULLNAME,
    MODEL_8B,
    MODEL_CODE,
    NAMESPACE,
    chart_copy,
    container,
    find,
    helm,
    one,
    parse,
    render,
    render_files,
    validate,
    values,
)

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_CODE_MIN1 = {**MODEL_CODE, "replicas": {"min_replicas": 1, "max_replicas": 8}}
_SECRET = {"existingSecret": "gov-admin", "key": "token"}

# id -> (values, release namespace); rendered once each (Helm renders cost ~0.3 s).
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "sidecar-native": (
        values(
            mode="sidecar",
            models=[MODEL_8B, _CODE_MIN1],
            exampleEngine={"enabled": True},
            adminToken=_SECRET,
            monitoring={"serviceMonitor": {"enabled": True}},
        ),
        "llm",
    ),
    "sidecar-classic": (
        values(
            mode="sidecar",
            models=[MODEL_8B, _CODE_MIN1],
            sidecar={"native": False},
            exampleEngine={"enabled": True},
            adminToken=_SECRET,
        ),
        "llm",
    ),
    "standalone": (
        values(exampleEngine={"enabled": True}, adminToken=_SECRET),
        NAMESPACE,
    ),
}
SIDECARS = ("sidecar-native", "sidecar-classic")


@functools.cache
def _rendered(case: str) -> list[dict[str, Any]]:
    vals, ns = CASES[case]
    objs = render(vals, namespace=ns)
    for obj in objs:
        validate(obj)
    return objs


def _engine_pod(case: str) -> dict[str, Any]:
    dep = one(_rendered(case), "Deployment", MODEL_8B["deployment"])
    return dep["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list(pod.get("initContainers") or []) + list(pod["containers"])


def _governor(case: str) -> dict[str, Any]:
    pod = _engine_pod(case)
    return container(pod, "governor", init=case == "sidecar-native")


# ---------------------------------------------------------------------- 1. no gate
@pytest.mark.parametrize("case", SIDECARS)
def test_sidecar_governor_has_no_probe_that_can_gate_the_engine(case: str) -> None:
    """Kubernetes counts a (native) sidecar's readiness into the Pod's Ready condition and
    starts the engine only once a native sidecar's startup probe passed. Without any probe
    the governor container is ready while it runs, and the supervisor keeps it running
    whatever `governor run` does, so the engine starts and stays Ready with the governor
    crashing."""
    gov = _governor(case)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe not in gov, f"{probe} on the sidecar can hold back or fail the engine pod"
    assert gov["command"][:2] == ["/bin/sh", "-c"]
    assert "while :; do" in gov["command"][2], "the governor must run under the supervisor"
    assert gov["args"][0] == "run"
    # The engine keeps its own probes: its readiness is vLLM's alone.
    vllm = container(_engine_pod(case), "vllm")
    assert vllm["readinessProbe"]["httpGet"]["port"] == "http"


def test_native_sidecar_engine_args_waits_a_bounded_time_only() -> None:
    init = container(_engine_pod("sidecar-native"), "governor-engine-args", init=True)
    script = init["args"][0]
    # At most sidecar.engineArgsWaitSeconds (20 s) for the pod's own governor, then the
    # default knobs: engine-args always exits 0.
    assert "python - 20 50051 <<'EOF'" in script
    assert (
        script.split("<<'EOF'", 1)[1]
        .split("\nEOF\n", 1)[1]
        .lstrip()
        .startswith("# engine.liveKnobs")
    ), "engine-args runs after the wait, whatever the wait's outcome"
    quick = render(
        values(
            mode="sidecar",
            models=[MODEL_8B],
            sidecar={"engineArgsWaitSeconds": 5},
            exampleEngine={"enabled": True},
        ),
        namespace="llm",
    )
    pod = one(quick, "Deployment", MODEL_8B["deployment"])["spec"]["template"]["spec"]
    assert "python - 5 50051" in container(pod, "governor-engine-args", init=True)["args"][0]


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _wait_for(predicate: Any, what: str, timeout_s: float = 30.0) -> None:
    """Poll for an event the stubs write (not a timing sleep: the deadline only bounds a
    hang)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_supervisor_restarts_a_crashing_governor_and_forwards_sigterm(tmp_path: Path) -> None:
    """The rendered supervisor script, run by /bin/sh: `governor` crashes 8 times (exit 3),
    then runs until SIGTERM. Stand-in `sleep` and `date` record the back-off instead of
    waiting. The admin token file appears after the second crash: the flag is dropped
    while it is missing and passed once it is there."""
    gov = _governor("sidecar-native")
    token = tmp_path / "token"
    script = gov["command"][2].replace("/etc/governor-admin/token", str(token))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls, sleeps, running = tmp_path / "calls", tmp_path / "sleeps", tmp_path / "running"
    _stub(
        bin_dir / "governor",
        f'echo "$*" >> {calls}\n'
        f"n=$(wc -l < {calls})\n"
        f'if [ "$n" -eq 2 ]; then echo abcdefghijklmnopqrstuvwxyz0123456789 > {token}; fi\n'
        f'if [ "$n" -le 8 ]; then exit 3; fi\n'
        f"touch {running}\n"
        "exec /bin/sleep 300\n",
    )
    _stub(bin_dir / "sleep", f'echo "$1" >> {sleeps}\n')
    _stub(bin_dir / "date", "echo 1000\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ADMIN_TOKEN_SECRET": "gov-admin"}
    proc = subprocess.Popen(
        ["/bin/sh", "-c", script, "governor-supervisor", *gov["args"]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(running.exists, "the 9th start")
        assert proc.poll() is None, "the supervisor (the container's PID 1) must not exit"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    runs = calls.read_text().splitlines()
    assert len(runs) == 9
    # Capped exponential back-off (1 s doubling to 60 s).
    assert sleeps.read_text().split() == ["1", "2", "4", "8", "16", "32", "60", "60"]
    full = " ".join(gov["args"])
    without = full.replace(" --admin-token-file /etc/governor-admin/token", "")
    assert "--admin-token-file" in full and "--admin-token-file" not in without
    assert runs[:2] == [without, without]
    assert runs[2:] == [full] * 7
    assert "admin API off" in err and "exited with status 3" in err


# ---------------------------------------------------------------------- optional Secret
@pytest.mark.parametrize("case", [*SIDECARS, "standalone"])
def test_admin_token_secret_is_optional(case: str) -> None:
    if case == "standalone":
        pod = one(_rendered(case), "Deployment", FULLNAME)["spec"]["template"]["spec"]
    else:
        pod = _engine_pod(case)
    vol = next(v for v in pod["volumes"] if v["name"] == "governor-admin-token")
    assert vol["secret"]["optional"] is True, "a missing Secret would block the pod"


# ---------------------------------------------------------------------- 2. endpoints
def test_sidecar_service_publishes_not_ready_engine_pods() -> None:
    """The sidecar Service's endpoints are engine pods, NotReady while vLLM loads: KEDA
    must still reach their governors."""
    svc = one(_rendered("sidecar-native"), "Service", FULLNAME)
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"] for p in svc["spec"]["ports"]} >= {"grpc"}
    # Standalone: the governor's own readiness decides (KEDA gets SERVING instances only).
    standalone = one(_rendered("standalone"), "Service", FULLNAME)
    assert not standalone["spec"].get("publishNotReadyAddresses")


# ---------------------------------------------------------------------- 3. credentials
@pytest.mark.parametrize("case", SIDECARS)
def test_service_account_token_reaches_the_governor_container_only(case: str) -> None:
    pod = _engine_pod(case)
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == FULLNAME
    vol = next(v for v in pod["volumes"] if v["name"] == "governor-sa-token")
    sources = vol["projected"]["sources"]
    assert any("serviceAccountToken" in s for s in sources)
    assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" for s in sources)
    assert any("downwardAPI" in s for s in sources)
    holders = [
        c["name"]
        for c in _all_containers(pod)
        if any(m["name"] == "governor-sa-token" for m in c.get("volumeMounts") or [])
    ]
    assert holders == ["governor"]
    mount = next(m for m in _governor(case)["volumeMounts"] if m["name"] == "governor-sa-token")
    assert mount["mountPath"] == SA_MOUNT and mount["readOnly"] is True


def _restricted_violations(pod: dict[str, Any], c: dict[str, Any]) -> list[str]:
    """Pod Security Standards "restricted", the container-level checks (v1.25+)."""
    psc, sc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    out = []
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append("allowPrivilegeEscalation must be false")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        out.append("capabilities must drop ALL")
    if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        out.append("only NET_BIND_SERVICE may be added")
    if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
        out.append("runAsNonRoot must be true")
    if sc.get("runAsUser", psc.get("runAsUser")) == 0:
        out.append("runAsUser must not be 0")
    profile = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
    if profile not in ("RuntimeDefault", "Localhost"):
        out.append("seccompProfile must be RuntimeDefault or Localhost")
    return out


@pytest.mark.parametrize("case", SIDECARS)
def test_sidecar_containers_pass_pod_security_restricted(case: str) -> None:
    pod = _engine_pod(case)
    assert "securityContext" not in pod  # the engine's to set: the chart adds none
    for c in _all_containers(pod):
        if c["image"].startswith("llm-governor"):
            assert not _restricted_violations(pod, c), (c["name"], _restricted_violations(pod, c))


# ---------------------------------------------------------------------- 4. upgrades
def _sla_changed(vals: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(vals)
    for m in out["models"]:
        m["sla"] = {k: v * 0.8 for k, v in m["sla"].items()}
    return out


def _pod_templates(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"]["template"]
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }


@pytest.mark.parametrize("case", [*SIDECARS, "standalone"])
def test_sla_only_upgrade_leaves_every_pod_template_untouched(case: str) -> None:
    """`helm upgrade` with only `sla` changed: SLAs apply live through the targets
    ConfigMap, so no engine (GPU) pod and no governor pod restarts."""
    vals, ns = CASES[case]
    before, after = _rendered(case), render(_sla_changed(vals), namespace=ns)
    templates = _pod_templates(before)
    assert (("llm", MODEL_8B["deployment"])) in templates
    assert _pod_templates(after) == templates
    # Not vacuous: the targets the governor applies live did change.
    targets = f"{FULLNAME}-targets"
    assert one(after, "ConfigMap", targets) != one(before, "ConfigMap", targets)


def test_start_only_settings_still_restart_the_sidecar_pods() -> None:
    vals, ns = CASES["sidecar-native"]
    after = render({**vals, "policy": {"tick_interval_s": 10}}, namespace=ns)
    assert _pod_templates(after) != _pod_templates(_rendered("sidecar-native"))


# ---------------------------------------------------------------------- 8. tolerance
def _so_behavior(objs: list[dict[str, Any]]) -> dict[str, Any]:
    so = find(objs, "ScaledObject")[0]
    return so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]  # type: ignore[no-any-return]


def test_tolerance_switch() -> None:
    """auto (default): no KEDA CRD to read offline (lookup is empty), so no `tolerance` in
    the ScaledObject: KEDA 2.17's CRD lacks it and Helm 4's strict field validation would
    fail the install. true / false force it; a plain HPA gets it from Kubernetes 1.33 on."""
    keda_2_17 = crd_schemas.validator(crd_schemas.SCALED_OBJECT_KEDA_2_17)
    auto = _so_behavior(_rendered("standalone"))
    assert "tolerance" not in auto["scaleUp"] and "tolerance" not in auto["scaleDown"]
    for so in find(_rendered("standalone"), "ScaledObject"):
        assert not list(keda_2_17.iter_errors(so)), "would fail to install on KEDA 2.17"
    forced_objs = render(values(scaling={"zeroTolerance": True}))
    forced = _so_behavior(forced_objs)
    assert forced["scaleUp"]["tolerance"] == "0" and forced["scaleDown"]["tolerance"] == "0"
    # What KEDA 2.17 (and strict field validation) refuses: the switch is needed.
    assert list(keda_2_17.iter_errors(find(forced_objs, "ScaledObject")[0]))
    hpa_vals = values(
        scaling={"via": "hpa"},
        monitoring={"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}},
    )
    hpa = find(render(hpa_vals), "HorizontalPodAutoscaler")[0]["spec"]["behavior"]
    assert hpa["scaleUp"]["tolerance"] == "0"
    off = values(**{**hpa_vals, "scaling": {"via": "hpa", "zeroTolerance": False}})
    hpa_off = find(render(off), "HorizontalPodAutoscaler")[0]["spec"]["behavior"]
    assert "tolerance" not in hpa_off["scaleUp"]
    with pytest.raises(helm.HelmError, match="zeroTolerance"):
        render(values(scaling={"zeroTolerance": "yes"}))


def _crd(with_tolerance: bool) -> dict[str, Any]:
    """The part of scaledobjects.keda.sh that matters: KEDA 2.18's HPA scaling rules carry
    `tolerance`, 2.17's do not."""
    rules: dict[str, Any] = {"stabilizationWindowSeconds": {"type": "integer"}}
    if with_tolerance:
        rules["tolerance"] = {"x-kubernetes-int-or-string": True}
    behavior = {"properties": {"scaleUp": {"properties": rules}}}
    spec = {
        "properties": {
            "advanced": {
                "properties": {
                    "horizontalPodAutoscalerConfig": {"properties": {"behavior": behavior}}
                }
            }
        }
    }
    schema = {"openAPIV3Schema": {"properties": {"spec": spec}}}
    return {"spec": {"versions": [{"name": "v1alpha1", "schema": schema}]}}


def test_tolerance_auto_reads_the_installed_crd(tmp_path: Path) -> None:
    """The check `auto` applies to what `lookup` returns (offline renders cannot serve a
    CRD, so the helper is called here with stand-in CRD objects)."""
    chart = chart_copy(tmp_path, drop_schema=True)
    (chart / "templates" / "probe-crd.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe, namespace: x}\ndata:\n"
        '  keda218: "{{ include "llm-governor.crdHasTolerance" .Values.crd218 }}"\n'
        '  keda217: "{{ include "llm-governor.crdHasTolerance" .Values.crd217 }}"\n'
        '  none: "{{ include "llm-governor.crdHasTolerance" dict }}"\n'
    )
    vals = values(crd218=_crd(True), crd217=_crd(False))
    probe = one(parse(render_files(vals, chart=chart)), "ConfigMap", "probe")
    assert probe["data"] == {"keda218": "true", "keda217": "", "none": ""}


# ---------------------------------------------------------------------- 9. traps
def test_models_default_to_the_release_namespace() -> None:
    """A sidecar install with `-n llm` and models without `namespace`: everything lands in
    llm, and the governor is told so (its own default would be `default`)."""
    import yaml

    models = [{k: v for k, v in m.items() if k != "namespace"} for m in (MODEL_8B, _CODE_MIN1)]
    objs = render(
        values(mode="sidecar", models=models, exampleEngine={"enabled": True}), namespace="llm"
    )
    assert {so["metadata"]["namespace"] for so in find(objs, "ScaledObject")} == {"llm"}
    assert one(objs, "Deployment", MODEL_8B["deployment"])["metadata"]["namespace"] == "llm"
    for cm, key in ((f"{FULLNAME}-config", "config.yaml"), (f"{FULLNAME}-targets", "targets.yaml")):
        doc = yaml.safe_load(one(objs, "ConfigMap", cm)["data"][key])
        assert {m["namespace"] for m in doc["models"]} == {"llm"}, cm
    for so in find(objs, "ScaledObject"):
        assert so["spec"]["triggers"][0]["metadata"]["namespace"] == "llm"


def test_example_engine_gets_a_service_and_pod_monitor() -> None:
    objs = _rendered("sidecar-native")
    dep = one(objs, "Deployment", MODEL_8B["deployment"])
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for p in container(dep["spec"]["template"]["spec"], "vllm")["ports"]}
    svc = one(objs, "Service", MODEL_8B["deployment"])
    assert svc["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
    pm = one(objs, "PodMonitor", MODEL_8B["deployment"])
    assert pm["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
    # The governor's own pods are selected by the Service only, not twice by the PodMonitor.
    assert "llm-governor.io/instance" not in pm["spec"]["selector"]["matchLabels"]
    # Without the Prometheus Operator (serviceMonitor off) no PodMonitor is rendered.
    assert not find(_rendered("sidecar-classic"), "PodMonitor")


def test_new_schema_fields_reach_the_objects() -> None:
    """Probe timeouts, KEDA's initialCooldownPeriod, the PDB's unhealthyPodEvictionPolicy,
    the ServiceMonitor's scrapeTimeout, TLS and --admin-listen: settable, and rendered."""
    from service.cli import build_parser

    vals = values(
        probes={"liveness": {"timeoutSeconds": 5, "initialDelaySeconds": 3}},
        scaling={"keda": {"initialCooldownPeriod": 300}},
        standalone={"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "IfHealthyBudget"}},
        monitoring={"serviceMonitor": {"enabled": True, "scrapeTimeout": "5s"}},
        tls={"existingSecret": "gov-tls", "clientCA": True},
        governor={"adminListen": "127.0.0.1:50052"},
    )
    objs = render(vals)
    for obj in objs:
        validate(obj)
    pod = one(objs, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    gov = container(pod, "governor")
    assert gov["livenessProbe"]["timeoutSeconds"] == 5
    assert gov["livenessProbe"]["initialDelaySeconds"] == 3
    assert find(objs, "ScaledObject")[0]["spec"]["initialCooldownPeriod"] == 300
    pdb = one(objs, "PodDisruptionBudget")["spec"]
    assert pdb["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"
    assert one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["scrapeTimeout"] == "5s"
    args = build_parser().parse_args(gov["args"])
    assert args.admin_listen == "127.0.0.1:50052"
    assert (args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file) == (
        "/etc/governor-tls/tls.crt",
        "/etc/governor-tls/tls.key",
        "/etc/governor-tls/ca.crt",
    )
    # The kubelet's gRPC probe has no TLS: a TLS server is probed with TCP connects.
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert gov[kind]["tcpSocket"] == {"port": 50051} and "grpc" not in gov[kind], kind
    tls = next(v for v in pod["volumes"] if v["name"] == "governor-tls")
    assert tls["secret"]["secretName"] == "gov-tls"
    assert any(m["mountPath"] == "/etc/governor-tls" for m in gov["volumeMounts"])
    # Defaults: a drain may evict a crash-looping governor; no TLS flags.
    default_pod = one(render(values()), "PodDisruptionBudget")["spec"]
    assert default_pod["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_dashboard_is_scoped_to_the_release() -> None:
    import json
    import re

    def dashboard(objs: list[dict[str, Any]]) -> dict[str, Any]:
        cm = one(objs, "ConfigMap", f"{FULLNAME}-dashboard")
        return json.loads(cm["data"]["llm-governor.json"])  # type: ignore[no-any-return]

    dash = dashboard(_rendered("standalone"))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    scope = f'job="{FULLNAME}", namespace="{NAMESPACE}"'
    for expr in exprs:
        for m in re.finditer(r"\b(governor_[a-z_]+)(\{[^}]*\})?", expr):
            assert m.group(2) and scope in m.group(2), f"unscoped {m.group(1)} in {expr}"
    # The configured model label, not a hard-coded model_name.
    relabelled = dashboard(
        render(values(prometheus={"url": "http://p:9090", "model_label": "model"}))
    )
    text = json.dumps(relabelled)
    assert "model_name" not in text and 'vllm:num_requests_running{model=~\\"$model\\"}' in text
    # A uid per release (Grafana keys dashboards by uid).
    other = dashboard(render(values(), namespace="other"))
    assert dash["uid"] != other["uid"] and len(dash["uid"]) <= 40
    assert "__" not in json.dumps(dash).replace("__name__", "")


def test_engine_chart_pod_account_through_subcharts(tmp_path: Path) -> None:
    """The documented include (llm-governor.sidecar.podAccount) gives an engine chart's pod
    the governor's account without automounting its token."""
    from tests.helm.test_crossrefs import ENGINE_CHART, ENGINE_TEMPLATE

    engine = tmp_path / "my-engine"
    (engine / "templates").mkdir(parents=True)
    (engine / "Chart.yaml").write_text(ENGINE_CHART)
    (engine / "templates" / "router.yaml").write_text(ENGINE_TEMPLATE)
    (engine / "charts").mkdir()
    chart_copy(engine / "charts")
    gov_values = values(mode="sidecar", sidecar={"placement": "router"})
    objs = parse(render_files({"governor": gov_values}, chart=engine, namespace="llm"))
    pod = one(objs, "Deployment", "router")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    router = container(pod, "router")
    assert all(m["name"] != "governor-sa-token" for m in router.get("volumeMounts") or [])
    sla = copy.deepcopy(gov_values)
    for m in sla["models"]:
        m["sla"]["ttft_p95_ms"] += 100
    again = parse(render_files({"governor": sla}, chart=engine, namespace="llm"))
    assert _pod_templates(again) == _pod_templates(objs)


def test_notes_warn_about_unselected_monitoring_and_dropped_tolerance() -> None:
    def notes(**kw: Any) -> str:
        return render_files(values(**kw))["llm-governor/templates/NOTES.txt"]

    bare = notes(monitoring={"serviceMonitor": {"enabled": True}})
    assert "release: <its release name>" in bare
    assert "10 % band" in bare  # auto could not read KEDA's CRD offline
    labelled = notes(
        monitoring={"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}},
        scaling={"zeroTolerance": True},
    )
    assert "release: <its release name>" not in labelled and "10 % band" not in labelled


def test_engine_args_script_runs_with_or_without_the_local_governor(tmp_path: Path) -> None:
    """The rendered engine-args script, run by /bin/sh with the real Python: it waits for
    the pod's own governor port (bounded), then runs engine-args either way."""
    import socket
    import sys

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    vals = values(
        mode="sidecar",
        models=[MODEL_8B],
        ports={"grpc": port},
        sidecar={"engineArgsWaitSeconds": 1},
        exampleEngine={"enabled": True},
        engine={"liveKnobs": False},  # the wait; the live flags: test_engine_wiring.py
    )
    pod = one(render(vals, namespace="llm"), "Deployment", MODEL_8B["deployment"])
    init = container(pod["spec"]["template"]["spec"], "governor-engine-args", init=True)
    out = tmp_path / "engine-args"
    script = init["args"][0].replace("/run/governor/engine-args", str(out))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    _stub(bin_dir / "governor", 'echo "--max-num-seqs 64 $*"\n')
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "GOVERNOR_MODEL": MODEL_8B["name"],
        "GOVERNOR_SERVER": f"127.0.0.1:{port}",
    }
    try:
        for _ in ("listening", "closed"):
            done = subprocess.run(
                ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=30
            )
            assert done.returncode == 0, done.stderr
            # The wait itself ran cleanly (a broken wait would not stop engine-args).
            assert done.stderr == "", done.stderr
            flags = out.read_text()
            assert flags.startswith("--max-num-seqs 64 engine-args --model"), flags
            assert f"--server 127.0.0.1:{port}" in flags
            listener.close()  # second round: nobody listens, the wait gives up after 1 s
    finally:
        listener.close()
