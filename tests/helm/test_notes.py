"""NOTES.txt prints admin commands that work for the values given: none when the admin API
is off (no adminToken.existingSecret) but how to turn it on; else the token fetched from
the Secret and passed with --token-file, the port the admin API is on (governor.adminListen
moves it off the gRPC port and out of the Service), and the TLS flags when TLS is on.

The commands are checked against the rendered objects (the Secret names and keys, the
Service's ports, the pods' labels and mounts), parsed by the real CLI, and two of them
run against a real `governor run` started with the rendered Deployment's flags (kubectl's
part, copying a Secret key to a file and forwarding a port to the same port, played by
the test)."""

from __future__ import annotations

import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli import build_parser
from tests.helm.chart import (
    FULLNAME,
    MODEL_8B,
    NAMESPACE,
    ROOT,
    container,
    one,
    parse,
    render_files,
    values,
)
from tests.integration.promserver import free_port

GRPC_HOST = f"{FULLNAME}.{NAMESPACE}.svc.cluster.local"
ADMIN = {"existingSecret": "governor-admin", "key": "admin.token"}


def _notes(vals: dict[str, Any], ns: str = NAMESPACE) -> tuple[str, list[dict[str, Any]]]:
    files = render_files(vals, namespace=ns)
    return files["llm-governor/templates/NOTES.txt"], parse(files)


def _lines(notes: str, prefix: str) -> list[list[str]]:
    """The indented command lines of `notes` that start with `prefix`, shell-split."""
    return [
        shlex.split(line)
        for line in notes.splitlines()
        if line.startswith("  ") and line.strip().startswith(prefix)
    ]


def _secret_files(notes: str) -> dict[str, tuple[str, str]]:
    """file -> (Secret, key) for each `kubectl get secret S -o jsonpath=... > FILE` line."""
    out = {}
    for line in notes.splitlines():
        m = re.fullmatch(
            r"  kubectl -n \S+ get secret (\S+) -o jsonpath='\{\.data\.(.+)\}' "
            r"\| base64 -d > (\S+)",
            line,
        )
        if m:
            out[m.group(3)] = (m.group(1), m.group(2).replace("\\.", "."))
    return out


def test_admin_api_off_prints_how_to_turn_it_on_and_no_admin_command() -> None:
    notes, _ = _notes(values())
    assert not _lines(notes, "governor "), notes
    assert "port-forward" not in notes
    assert "Admin API: off (adminToken.existingSecret is empty)" in notes
    (create,) = _lines(notes, "kubectl -n llm-system create secret generic")
    (upgrade,) = _lines(notes, "helm upgrade")
    secret = create[create.index("generic") + 1]
    assert f"adminToken.existingSecret={secret}" in upgrade
    assert create[-1].startswith("--from-literal=token=")  # the chart's default key
    assert "gRPC (KEDA external scaler, engines): " in notes


# id -> (values, release namespace, port-forward target or None for kubectl exec,
#        the port the admin API listens on in the pod)
CASES: dict[str, tuple[dict[str, Any], str, str | None, int]] = {
    "grpc-port": (values(adminToken=ADMIN), NAMESPACE, f"svc/{FULLNAME}", 50051),
    "grpc-port-tls": (
        values(adminToken=ADMIN, tls={"existingSecret": "governor-tls"}, ports={"grpc": 7000}),
        NAMESPACE,
        f"svc/{FULLNAME}",
        7000,
    ),
    "admin-listen-loopback-mtls": (
        values(
            adminToken=ADMIN,
            governor={"adminListen": "127.0.0.1:50052"},
            tls={"existingSecret": "governor-tls", "clientCA": True},
        ),
        NAMESPACE,
        f"deploy/{FULLNAME}",
        50052,
    ),
    "admin-listen-wildcard": (
        values(adminToken=ADMIN, governor={"adminListen": "0.0.0.0:50060"}),
        NAMESPACE,
        f"deploy/{FULLNAME}",
        50060,
    ),
    "admin-listen-pod-ip": (
        values(
            adminToken=ADMIN,
            governor={"adminListen": "10.1.2.3:50052"},
            tls={"existingSecret": "governor-tls"},
        ),
        NAMESPACE,
        None,
        50052,
    ),
    "sidecar-admin-listen": (
        values(
            mode="sidecar",
            models=[MODEL_8B],
            exampleEngine={"enabled": True},
            adminToken=ADMIN,
            governor={"adminListen": "[::1]:50052"},
        ),
        "llm",
        "pod",
        50052,
    ),
}


def _governor_pod(objs: list[dict[str, Any]], sidecar: bool) -> dict[str, Any]:
    name = MODEL_8B["deployment"] if sidecar else FULLNAME
    return one(objs, "Deployment", name)["spec"]["template"]  # type: ignore[no-any-return]


def _governor_container(template: dict[str, Any]) -> dict[str, Any]:
    spec = template["spec"]
    for c in (spec.get("initContainers") or []) + spec["containers"]:
        if c["name"] == "governor":
            return c  # type: ignore[no-any-return]
    raise AssertionError("no governor container")


@pytest.mark.parametrize("case", sorted(CASES))
def test_admin_commands_fit_the_values(case: str) -> None:
    vals, ns, target, port = CASES[case]
    notes, objs = _notes(vals, ns)
    sidecar = vals.get("mode") == "sidecar"
    template = _governor_pod(objs, sidecar)
    gov = _governor_container(template)
    tls = vals.get("tls", {})
    host = f"{FULLNAME}.{ns}.svc.cluster.local"
    commands = _lines(notes, "governor ")
    if target is None:  # kubectl exec into the governor container
        commands = [c[c.index("--") + 1 :] for c in _lines(notes, "kubectl") if "exec" in c]
        for c in _lines(notes, "kubectl"):
            assert c[c.index("exec") + 1] == f"deploy/{FULLNAME}" and c[c.index("-c") + 1] == (
                "governor"
            )
    assert [c[1] for c in commands] == ["status", "explain"], notes
    parsed = [build_parser().parse_args(c[1:]) for c in commands]
    assert parsed[1].model == vals["models"][0]["name"]
    mounts = {m["name"]: m["mountPath"] for m in gov["volumeMounts"]}
    for args in parsed:
        server_host, server_port = args.server.rsplit(":", 1)
        assert int(server_port) == port
        if target is None:
            # in the pod: the listener's own address, the mounted token and CA
            assert args.server == vals["governor"]["adminListen"]
            assert args.token_file == f"{mounts['governor-admin-token']}/token"
            assert args.tls_ca_file == f"{mounts['governor-tls']}/ca.crt"
        else:
            assert server_host == "localhost"
            files = _secret_files(notes)
            assert files[args.token_file] == (ADMIN["existingSecret"], ADMIN["key"])
            if tls:
                assert files[args.tls_ca_file] == (tls["existingSecret"], "ca.crt")
        if tls:
            assert args.tls_server_name == host
            assert bool(args.tls_cert_file and args.tls_key_file) is bool(tls.get("clientCA"))
        else:
            assert not (args.tls_ca_file or args.tls_server_name or args.tls_cert_file)
    # The governor serves the admin API at that port: the Service's gRPC port, or
    # --admin-listen.
    gargs = gov["args"]
    listen = gargs[gargs.index("--admin-listen") + 1] if "--admin-listen" in gargs else None
    grpc_listen = gargs[gargs.index("--grpc-listen") + 1]
    assert int((listen or grpc_listen).rsplit(":", 1)[1]) == port
    assert "--admin-token-file" in gargs
    if target is not None:
        (forward,) = _lines(notes, f"kubectl -n {ns} port-forward")
        assert forward[-1] == str(port)
        if target == "pod":  # sidecar: a pod the selector finds, one of the engine's
            selector = re.search(r"-l (\S+)=(\S+) ", " ".join(forward))
            assert selector and template["metadata"]["labels"][selector[1]] == selector[2]
        else:
            assert forward[-2] == target
        if target.startswith("svc/"):
            svc = one(objs, "Service", FULLNAME)
            assert port in [p["port"] for p in svc["spec"]["ports"]]
            assert listen is None


# ---------------------------------------------------------------------- a real governor
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _tls_secret(d: Path) -> dict[str, str]:
    """A kubernetes.io/tls Secret's keys: a CA, and a server certificate for the governor
    Service's DNS name (which the chart's docs require it to carry); plus client.crt and
    client.key, a client certificate that CA signed (mTLS)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=governor-test-ca", cwd=d)  # fmt: skip
    (d / "tls.ext").write_text(f"subjectAltName=DNS:{GRPC_HOST}\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("tls", "client"):
        _openssl("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj",
                 f"/CN={who}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{who}.crt", "-days", "2", "-extfile",
                 f"{who}.ext", cwd=d)  # fmt: skip
    return {k: (d / k).read_text() for k in ("tls.crt", "tls.key", "ca.crt")}


def _start(argv: list[str], cwd: Path) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", *argv],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()
    serving: list[bool] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "serving gRPC on port" in line:
                serving.append(True)
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    ready.wait(60)
    assert serving, "governor run did not start:\n" + "".join(lines[-30:])
    return proc, lines


@pytest.fixture
def stop() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.mark.parametrize("mode", ["grpc-port", "admin-listen-mtls"])
def test_printed_commands_work_against_the_rendered_governor(
    mode: str, tmp_path: Path, stop: list[subprocess.Popen[str]]
) -> None:
    grpc_port, metrics_port, admin_port = free_port(), free_port(), free_port()
    over: dict[str, Any] = {
        "ports": {"grpc": grpc_port, "metrics": metrics_port},
        "adminToken": ADMIN,
        "prometheus": {"url": "http://127.0.0.1:9", "timeout_s": 0.5},
    }
    secrets_data: dict[str, dict[str, str]] = {
        ADMIN["existingSecret"]: {ADMIN["key"]: secrets.token_hex(32)}
    }
    if mode == "admin-listen-mtls":
        over["governor"] = {"adminListen": f"127.0.0.1:{admin_port}"}
        over["tls"] = {"existingSecret": "governor-tls", "clientCA": True}
        pki = tmp_path / "pki"
        pki.mkdir()
        secrets_data["governor-tls"] = _tls_secret(pki)
    notes, objs = _notes(values(**over))
    # The pod's files, where the Deployment mounts them.
    pod = one(objs, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    gov = container(pod, "governor")
    volumes = {v["name"]: v for v in pod["volumes"]}
    local: dict[str, Path] = {}
    for m in gov["volumeMounts"]:
        d = tmp_path / "pod" / m["name"]
        d.mkdir(parents=True)
        local[m["mountPath"]] = d
        vol = volumes[m["name"]]
        if "configMap" in vol:
            cm = one(objs, "ConfigMap", vol["configMap"]["name"])
            for k, text in cm["data"].items():
                (d / k).write_text(text)
        elif "secret" in vol:
            data = secrets_data[vol["secret"]["secretName"]]
            for item in vol["secret"].get("items") or [{"key": k, "path": k} for k in data]:
                (d / item["path"]).write_text(data[item["key"]])
    argv = []
    for a in gov["args"]:
        for mount, d in local.items():
            if a.startswith(mount + "/"):
                a = str(d) + a[len(mount) :]
                break
        argv.append(a.replace("0.0.0.0:", "127.0.0.1:"))
    swaps = {"--store": "memory", "--leader-election": "off", "--knob-rollouts": "off"}
    swaps["--drain-scale-in"] = "off"  # no API server here
    for flag, value in swaps.items():
        argv[argv.index(flag) + 1] = value
    proc, log = _start(argv, tmp_path)
    stop.append(proc)
    # The operator's shell: kubectl's part first (Secret keys to files; port-forward P
    # forwards local port P to the pod's P, where this governor listens already).
    shell = tmp_path / "shell"
    shell.mkdir()
    for file, (secret, key) in _secret_files(notes).items():
        (shell / file).write_text(secrets_data[secret][key])
    (forward,) = _lines(notes, f"kubectl -n {NAMESPACE} port-forward")
    assert int(forward[-1]) == (admin_port if mode == "admin-listen-mtls" else grpc_port)
    if mode == "admin-listen-mtls":  # the client certificate the notes ask for
        for k in ("client.crt", "client.key"):
            (shell / k).write_text((tmp_path / "pki" / k).read_text())
    commands = _lines(notes, "governor ")
    assert len(commands) == 2
    for command in commands:
        done = subprocess.run(
            [sys.executable, "-m", "service.cli", *command[1:]],
            cwd=shell,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr, "".join(log[-20:]))
        assert MODEL_8B["name"] in done.stdout
    assert yaml.safe_load(one(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"])
