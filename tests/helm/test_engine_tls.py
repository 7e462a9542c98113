"""The engines' `governor engine-args` init container against a governor with TLS
(`tls.existingSecret`): it trusts the Secret's ca.crt (`--tls-ca-file`, a flag the
governor CLI accepts), mounted read-only where the flag says; standalone engines get a
volume of ca.crt alone (never the governor's key), optional so that an engine in a
namespace without the Secret still starts; a native sidecar is asked at 127.0.0.1 with
the Service's DNS name as the expected certificate name. Without TLS: no CA flag."""

from __future__ import annotations

import posixpath
from typing import Any

import pytest

from service.cli import build_parser
from tests.helm.chart import MODEL_8B, MODEL_CODE, container, one, render, values

SECRET = "governor-tls-secret"
SERVICE_HOST = "gov-llm-governor.llm-system.svc.cluster.local"
SIDECAR_MODELS = [MODEL_8B, {**MODEL_CODE, "replicas": {"min_replicas": 1, "max_replicas": 8}}]


def _engine_pod(namespace: str = "llm-system", **over: Any) -> dict[str, Any]:
    objs = render(values(exampleEngine={"enabled": True}, **over), namespace=namespace)
    return one(objs, "Deployment", "llama-8b")["spec"]["template"]["spec"]


def _commands(init: dict[str, Any]) -> list[Any]:
    """Every `governor engine-args` line of the init script, parsed by the real CLI."""
    env = {e["name"]: e.get("value") for e in init["env"]}
    lines = [
        line.split(">", 1)[0]
        .replace('"$GOVERNOR_MODEL"', env["GOVERNOR_MODEL"])
        .replace('"$GOVERNOR_SERVER"', env["GOVERNOR_SERVER"])
        .split()
        for line in init["args"][0].splitlines()
        if line.strip().startswith("governor ")
    ]
    assert lines, init["args"][0]
    return [build_parser().parse_args(argv[1:]) for argv in lines]


def _mounted(pod: dict[str, Any], init: dict[str, Any], path: str) -> dict[str, Any]:
    """The pod volume that holds `path` in the init container."""
    mount = next(m for m in init["volumeMounts"] if m["mountPath"] == posixpath.dirname(path))
    assert mount.get("readOnly") is True
    return next(v for v in pod["volumes"] if v["name"] == mount["name"])


@pytest.mark.parametrize("live", [True, False])
def test_standalone_engines_trust_the_ca_only(live: bool) -> None:
    pod = _engine_pod(tls={"existingSecret": SECRET}, engine={"liveKnobs": live})
    init = container(pod, "governor-engine-args", init=True)
    for args in _commands(init):  # the live command and its start-only fallback alike
        assert args.tls_ca_file == "/etc/governor-tls/ca.crt"
        assert args.tls_server_name is None  # the Service's name is the one dialled
        volume = _mounted(pod, init, args.tls_ca_file)
        secret = volume["secret"]
        assert secret["secretName"] == SECRET and secret["optional"] is True
        assert secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # not tls.key
    assert {e["name"]: e["value"] for e in init["env"] if "value" in e}["GOVERNOR_SERVER"] == (
        f"{SERVICE_HOST}:50051"
    )


def test_a_native_sidecar_is_asked_with_the_services_certificate_name() -> None:
    pod = _engine_pod("llm", mode="sidecar", models=SIDECAR_MODELS, tls={"existingSecret": SECRET})
    init = container(pod, "governor-engine-args", init=True)
    for args in _commands(init):
        assert args.server == "127.0.0.1:50051"
        assert args.tls_ca_file == "/etc/governor-tls/ca.crt"
        assert args.tls_server_name == "gov-llm-governor.llm.svc.cluster.local"
        assert _mounted(pod, init, args.tls_ca_file)["secret"]["secretName"] == SECRET


def test_without_tls_engine_args_speaks_plaintext() -> None:
    pod = _engine_pod()
    init = container(pod, "governor-engine-args", init=True)
    for args in _commands(init):
        assert args.tls_ca_file is None and not args.tls
    assert not any(v["name"].startswith("governor-tls") for v in pod["volumes"])
