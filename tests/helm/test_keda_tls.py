"""KEDA's side of the governor's TLS (`tls.existingSecret`): every ScaledObject's trigger
names a TriggerAuthentication in the model's namespace that hands KEDA the Secret's
ca.crt as `caCert` (KEDA's external scaler then dials with TLS, verifying the Service's
DNS name in scalerAddress), and nothing else of the Secret (never tls.key). Without TLS:
no TriggerAuthentication, no authenticationRef. Rendered by the chart's real templates
and validated against the CRD schemas."""

from __future__ import annotations

from tests.helm.chart import find, render, validate, values

SECRET = "governor-tls-secret"


def test_each_scaled_object_trusts_the_secrets_ca() -> None:
    objs = render(values(tls={"existingSecret": SECRET}))
    scaled = find(objs, "ScaledObject")
    auths = {(a["metadata"]["namespace"], a["metadata"]["name"]): a for a in find(
        objs, "TriggerAuthentication"
    )}  # fmt: skip
    assert len(scaled) == 2 and len(auths) == 2
    for so in scaled:
        validate(so)
        ns = so["metadata"]["namespace"]
        (trigger,) = so["spec"]["triggers"]
        ref = trigger["authenticationRef"]
        auth = auths[(ns, ref["name"])]  # same namespace: KEDA resolves it there
        validate(auth)
        assert auth["spec"] == {
            "secretTargetRef": [{"parameter": "caCert", "name": SECRET, "key": "ca.crt"}]
        }
        host = trigger["metadata"]["scalerAddress"].rsplit(":", 1)[0]
        assert host.endswith(".svc.cluster.local")  # the name the certificate must carry


def test_without_tls_no_trigger_authentication() -> None:
    objs = render(values())
    assert find(objs, "TriggerAuthentication") == []
    for so in find(objs, "ScaledObject"):
        assert "authenticationRef" not in so["spec"]["triggers"][0]


def test_not_rendered_for_other_scaling_paths() -> None:
    objs = render(values(tls={"existingSecret": SECRET}, scaling={"via": "kubernetes"}))
    assert find(objs, "ScaledObject") == [] and find(objs, "TriggerAuthentication") == []


def test_the_grpc_port_claims_cleartext_http2_only_without_tls() -> None:
    """`appProtocol: kubernetes.io/h2c` tells meshes and gateways the port speaks HTTP/2
    in cleartext: true without TLS, false with it (then no appProtocol: plain TCP)."""
    for tls, want in (({}, "kubernetes.io/h2c"), ({"existingSecret": SECRET}, None)):
        (svc,) = [s for s in find(render(values(tls=tls)), "Service") if "grpc" in str(s)]
        validate(svc)
        grpc = next(p for p in svc["spec"]["ports"] if p["name"] == "grpc")
        assert grpc.get("appProtocol") == want, (tls, grpc)
