"""Every user-given string reaches the manifests as a string. Names that YAML reads as
something else when written bare (`2024` and `0x10` as numbers, `yes`, `on` and `true` as
booleans, `null` as nothing) are valid Kubernetes names and valid governor config values,
so they must be quoted wherever the templates write them: namespaces, Deployments, the
release's own names, label values, resource names in RBAC, container arguments."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart import container, find, one, render, validate

SLA = {"ttft_p95_ms": 500, "itl_p95_ms": 50}
MODELS = [
    {"name": "2024", "namespace": "2024", "deployment": "yes", "sla": SLA},
    {"name": "0x10", "namespace": "0x10", "deployment": "0x10", "sla": SLA},
    {"name": "on", "namespace": "null", "deployment": "on", "sla": SLA},
]
TRICKY: dict[str, Any] = {
    "models": MODELS,
    "fullnameOverride": "no",
    "nameOverride": "true",
    "leaderElection": {"leaseName": "0x10"},
    "serviceAccount": {"name": "yes"},
    "networkPolicy": {"kedaNamespace": "2024"},
    "standalone": {"priorityClassName": "yes"},
    "adminToken": {"existingSecret": "2024"},
    "tls": {"existingSecret": "on"},
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"namespace": "0x10"},
    },
    "exampleEngine": {"enabled": True, "model": "2024"},
}
SIDECAR_MODELS = [
    {"name": "2024", "deployment": "yes", "sla": SLA},
    {"name": "0x10", "deployment": "on", "sla": SLA},
]

# id -> (values, release namespace)
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "keda": (TRICKY, "2024"),
    "kubernetes": ({**TRICKY, "scaling": {"via": "kubernetes"}}, "2024"),
    "hpa": ({**TRICKY, "scaling": {"via": "hpa"}}, "2024"),
    "sidecar": (
        {
            **TRICKY,
            "mode": "sidecar",
            "models": SIDECAR_MODELS,
            "exampleEngine": {"enabled": True, "model": "0x10"},
        },
        "2024",
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    vals, ns = CASES[request.param]
    return request.param, render(vals, namespace=ns)


def test_every_object_validates(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objs = rendered
    assert len(objs) > 10
    for obj in objs:
        validate(obj)
        assert isinstance(obj["metadata"]["name"], str)
        assert isinstance(obj["metadata"].get("namespace", ""), str)
        labels = obj["metadata"].get("labels") or {}
        assert all(isinstance(v, str) for v in labels.values()), labels


def _scaled(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(namespace, Deployment) of every ScaledObject's or HPA's scale target."""
    return {
        (o["metadata"]["namespace"], o["spec"]["scaleTargetRef"]["name"])
        for o in objs
        if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    }


def test_the_names_arrive_as_written(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    case, objs = rendered
    vals, ns = CASES[case]
    models = vals["models"]
    wanted = {(m.get("namespace", ns), m["deployment"]) for m in models}
    if case != "kubernetes":
        assert _scaled(objs) == wanted
    svc = one(objs, "Service", "no")
    assert svc["metadata"]["namespace"] == "2024"
    assert svc["metadata"]["labels"]["app.kubernetes.io/name"] == "true"
    assert svc["spec"]["selector"] == {"llm-governor.io/instance": "no"}
    for role in find(objs, "Role"):
        for rule in role["rules"]:
            names = rule.get("resourceNames", [])
            assert all(isinstance(n, str) for n in names), rule
    leases = [
        n
        for role in find(objs, "Role")
        for rule in role["rules"]
        if "leases" in rule["resources"]
        for n in rule.get("resourceNames", [])
    ]
    assert leases == ["0x10"]
    if case == "kubernetes":
        scale = {
            (r["metadata"]["namespace"], n)
            for r in find(objs, "Role")
            if r["metadata"]["name"] == "no-scale"
            for rule in r["rules"]
            for n in rule.get("resourceNames", [])
        }
        assert scale == wanted
    # The HPA's recording rule (via=hpa) and the actuation-gap alerts label each model's
    # series with its Deployment and namespace.
    rule = one(objs, "PrometheusRule")
    labels = [r.get("labels") or {} for g in rule["spec"]["groups"] for r in g["rules"]]
    targets = {
        (lb["target_namespace"], lb["target_deployment"])
        for lb in labels
        if "target_namespace" in lb
    }
    assert targets == wanted
    if case != "sidecar":
        pod = one(objs, "Deployment", "no")["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "yes"
        assert pod["priorityClassName"] == "yes"
        args = container(pod, "governor")["args"]
        assert args[args.index("--namespace") + 1] == "2024"
        assert args[args.index("--lease") + 1] == "0x10"
        policy = one(objs, "NetworkPolicy")
        peers = policy["spec"]["ingress"][0]["from"]
        selected = {
            p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for p in peers
            if "namespaceSelector" in p
        }
        assert selected == {"2024", "0x10", "null"}
    engine = next(
        o
        for o in find(objs, "Deployment")
        if o["metadata"]["name"] in {m["deployment"] for m in models}
    )
    assert engine["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] in (
        "yes",
        "on",
    )
