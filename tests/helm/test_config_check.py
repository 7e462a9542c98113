"""The config check: values the governor would refuse at start fail `helm install` and
`helm upgrade`, through the pre-install/pre-upgrade hook Job that runs the governor
image's `governor check-config` on the files the release renders.

What is tested here is the Job's own part: the chart is rendered, the hook ConfigMap's
files are written where the Job's volume mounts them, and the Job's very command and
arguments run with the real CLI (`governor` is the image's console script,
pyproject's [project.scripts], service.cli:main). It must exit 2 naming the problem for
values the governor refuses, 0 for good values. The cluster's part, running that Job
before anything of the release is applied and failing the install or upgrade when it
fails, is what Helm does with a hook, per its published hook contract (helm.sh/docs,
"Chart Hooks": pre-install hooks run after templates are rendered and before any
resource is created, pre-upgrade ones before any is updated; Helm waits for a hook Job
to complete, and if the hook fails the release fails; hooks run in ascending weight
order; before-hook-creation and hook-succeeded delete them before a new run and after
success). That part needs a cluster and is not run here.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    FULLNAME,
    MODEL_8B,
    NAMESPACE,
    ROOT,
    chart_copy,
    container,
    find,
    helm,
    one,
    parse,
    render,
    render_files,
    values,
)

CHECK = f"{FULLNAME}-config-check"
CHAT: dict[str, Any] = {
    "name": "chat",
    "namespace": "llm",
    "deployment": "chat",
    "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50},
}


def _chat(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(CHAT), **changes}


# id -> (values, does values.schema.json let them through, what the governor says).
# The ones the schema refuses reach the hook when an install skips the schema
# (--skip-schema-validation); the others pass every check of the chart but this one.
BAD: dict[str, tuple[dict[str, Any], bool, str]] = {
    "knob-bounds-out-of-order": (
        {"models": [_chat(knobs={"max_num_seqs_max": 128})]},
        True,
        "models[chat].knobs: default_max_num_seqs (256) must lie in [8, 128]",
    ),
    "unknown-policy-key": (
        {"models": [_chat(policy={"scale_down_stabilisation_s": 600})]},
        False,
        "models[chat].policy.scale_down_stabilisation_s: unknown key",
    ),
    "global-only-policy-key": (
        {"models": [_chat(policy={"window_s": 120})]},
        False,
        "window_s is set in the global policy only",
    ),
    "panic-window-over-window": (
        {"models": [CHAT], "policy": {"panic_window_s": 120}},
        True,
        "panic_window_s (120.0) must be <= window_s (60.0)",
    ),
    "seed-without-e2e-target": (
        {"models": [_chat(batching_policy="seed")]},
        True,
        "batching_policy 'seed' needs sla.e2e_p95_ms",
    ),
    "ingress-query-without-window": (
        {"models": [CHAT], "prometheus": {"ingress_rate_query": "sum(rate(x[5m]))"}},
        True,
        "ingress_rate_query must contain {window}",
    ),
    "window-under-two-scrapes": (
        {"models": [CHAT], "policy": {"window_s": 20}},
        True,
        "policy.window_s (20.0) must be >= 2 x prometheus.scrape_interval_s (15.0)",
    ),
    "unknown-profile": (
        {"models": [_chat(profile="no-such-profile")]},
        True,
        "models[chat].profile: profile 'no-such-profile' not found",
    ),
    "override-in-extra-env": (
        {
            "models": [CHAT],
            "governor": {"extraEnv": [{"name": "GOVERNOR_POLICY__PANIC_WINDOW_S", "value": "90"}]},
        },
        True,
        "panic_window_s (90.0) must be <= window_s (60.0)",
    ),
}


@pytest.fixture(scope="module")
def schemaless(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chart_copy(tmp_path_factory.mktemp("chart"), drop_schema=True)


def _hook(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    obj = one(objs, kind, CHECK)
    notes = obj["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    return obj


def run_hook(objs: list[dict[str, Any]], tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run the hook Job's container command as the kubelet would, locally: the hook
    ConfigMap's keys written as files where the Job mounts them, its environment, and
    `governor` (the image's entry point) as this checkout's service.cli."""
    cm, job = _hook(objs, "ConfigMap"), _hook(objs, "Job")
    # The ConfigMap is created first (lower weight): the Job's volume needs it.
    weight = int(cm["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == CHECK)
    mount = next(m for m in c["volumeMounts"] if m["name"] == volume["name"])
    files = tmp / "mounted"
    files.mkdir()
    for key, text in cm["data"].items():
        (files / key).write_text(text)
    argv = [*c["command"], *c["args"]]
    assert argv[0] == "governor"
    argv = [a.replace(mount["mountPath"], str(files), 1) for a in argv]
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GOVERNOR_")}
    env.update({e["name"]: e["value"] for e in c.get("env", [])})
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *argv[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _schema_accepts(vals: dict[str, Any]) -> bool:
    with helm.Chart.load(str(CHART)) as chart:
        try:
            chart.validate_schema(chart.merge_values(vals))
        except helm.HelmValuesError:
            return False
    return True


@pytest.mark.parametrize("case", sorted(BAD))
def test_values_the_governor_refuses_fail_the_hook(
    case: str, schemaless: Path, tmp_path: Path
) -> None:
    vals, schema_passes, problem = BAD[case]
    assert _schema_accepts(vals) is schema_passes
    # Every check of the chart but the hook lets these through (with the schema when it
    # passes them, else as an install that skips it does).
    objs = parse(render_files(vals) if schema_passes else render_files(vals, chart=schemaless))
    done = run_hook(objs, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "FAILED: " in done.stderr and problem in done.stderr, done.stderr


def _example_values() -> dict[str, Any]:
    """examples/governor.yaml pasted under the chart's values."""
    return yaml.safe_load((ROOT / "examples" / "governor.yaml").read_text())


GOOD: dict[str, tuple[dict[str, Any], str]] = {
    "defaults": (values(), NAMESPACE),
    "example-config": (_example_values(), NAMESPACE),
    "one-model": ({"models": [CHAT]}, NAMESPACE),
    "targets-unmanaged": (values(targets={"managedByHelm": False}), NAMESPACE),
    "service-monitor": (values(monitoring={"serviceMonitor": {"enabled": True}}), NAMESPACE),
    "sidecar": (
        values(
            mode="sidecar",
            models=[MODEL_8B],
            exampleEngine={"enabled": True},
            governor={"extraEnv": [{"name": "GOVERNOR_POLICY__TOLERANCE_FRAC", "value": "0.2"}]},
        ),
        "llm",
    ),
}


@pytest.mark.parametrize("case", sorted(GOOD))
def test_good_values_pass_the_hook(case: str, tmp_path: Path) -> None:
    vals, ns = GOOD[case]
    objs = render(vals, namespace=ns)
    done = run_hook(objs, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    args = container(_hook(objs, "Job")["spec"]["template"]["spec"], "check-config")["args"]
    managed = vals.get("targets", {}).get("managedByHelm", True)
    assert ("--targets" in args) is managed
    if managed:
        assert "/targets.yaml is valid with it" in done.stdout


@pytest.mark.parametrize("managed", [True, False])
def test_the_hook_checks_exactly_the_files_the_release_gets(managed: bool) -> None:
    objs = render(values(targets={"managedByHelm": managed}, policy={"tick_interval_s": 10}))
    hook = _hook(objs, "ConfigMap")["data"]
    real = one(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"]
    assert hook["config.yaml"] == real
    if managed:
        stored = one(objs, "ConfigMap", f"{FULLNAME}-targets")["data"]["targets.yaml"]
        assert hook["targets.yaml"] == stored
    else:
        assert set(hook) == {"config.yaml"}


def test_the_hook_runs_like_the_governor() -> None:
    """The governor's image, pull secrets and security contexts; no ServiceAccount token
    (the chart's ServiceAccount does not exist before the first install); no label the
    release's Service, PodDisruptionBudget or NetworkPolicy selects; no retry."""
    objs = render(values(imagePullSecrets=[{"name": "registry"}], image={"tag": "1.2.3"}))
    job = _hook(objs, "Job")
    pod = job["spec"]["template"]["spec"]
    gov_pod = one(objs, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    check, gov = container(pod, "check-config"), container(gov_pod, "governor")
    assert check["image"] == gov["image"] == "llm-governor:1.2.3"
    assert check["securityContext"] == gov["securityContext"]
    assert pod["securityContext"] == gov_pod["securityContext"]
    assert pod["imagePullSecrets"] == gov_pod["imagePullSecrets"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    selector = one(objs, "Service", FULLNAME)["spec"]["selector"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not set(selector.items()) <= set(labels.items())


def test_the_hook_can_be_turned_off() -> None:
    objs = render(values(configCheck={"enabled": False}))
    assert not find(objs, "Job") and not find(objs, "ConfigMap", CHECK)
    assert one(objs, "ConfigMap", f"{FULLNAME}-config")
