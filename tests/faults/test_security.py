"""Security: the admin API's bearer token (in-process gRPC and a real `governor run`
with TLS and mTLS from PEM files made by openssl), no secret in logs or CLI output,
the limits (request size, strings, models, watch streams, metadata entries), and the
Helm chart's Secret mount for the token."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service import security
from service.cli import main as cli_main
from service.core import ServiceCore
from service.security import AdminToken, SecurityConfigError, TlsFiles, TlsReloader
from service.store import MemoryStore
from tests.faults.helpers import sample
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread, ServiceProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cr3t-admin-token-5f1c9a77e0d24b8e"
WRONG = "wrong-admin-token-000000000000000000"

ADMIN_CALLS: list[tuple[str, Any]] = [
    ("SetTarget", pb.SetTargetRequest(target=pb.ModelTarget(name="demo", deployment="demo"))),
    ("GetTarget", pb.GetTargetRequest(model="demo")),
    ("ListTargets", pb.ListTargetsRequest()),
    ("DeleteTarget", pb.DeleteTargetRequest(model="demo")),
    ("GetStatus", pb.GetStatusRequest()),
    ("Explain", pb.ExplainRequest(model="demo")),
    ("PauseActuation", pb.PauseRequest(model="demo")),
    ("ResumeActuation", pb.PauseRequest(model="demo")),
]


def _core() -> tuple[ServiceCore, FakeClock]:
    clock = FakeClock()
    cfg = make_config(model_entry("demo"), model_entry("other"), knob_sustain_s=0)
    core = ServiceCore(
        cfg,
        FakeSource({"demo": 20.0, "other": 5.0}),
        MemoryStore(),
        clock=clock,
        logger=quiet_logger(),
    )
    return core, clock


def _ref(meta: dict[str, str]) -> es.ScaledObjectRef:
    return es.ScaledObjectRef(scalerMetadata=meta)


def _code(fn: Any) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[attr-defined,no-any-return]
    return grpc.StatusCode.OK


@pytest.fixture
def secured() -> Iterator[tuple[ServerThread, ServiceCore]]:
    core, clock = _core()
    core.tick(clock.advance(5))
    with ServerThread(
        core,
        admin_token=AdminToken.from_value(TOKEN),
        allow_unauthenticated_admin=False,
        logger=quiet_logger(),
    ) as s:
        yield s, core


@pytest.mark.fault_case(
    "Security",
    "admin API without / with wrong / with right credentials (all 8 AdminService methods)",
    "no metadata, a wrong token, the right token with the Basic scheme, an empty bearer: "
    "UNAUTHENTICATED with a message saying what to send, and nothing changes; the right "
    "token works; engine, KEDA and health APIs stay open; refusals counted; the token is "
    "compared with hmac.compare_digest",
)
def test_admin_needs_the_bearer_token(
    secured: tuple[ServerThread, ServiceCore], monkeypatch: pytest.MonkeyPatch, fault_note: Any
) -> None:
    s, core = secured
    compared: list[int] = []
    real = security.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append(len(a))
        return real(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    revision = core.targets_revision
    refused = 0
    with grpc.insecure_channel(s.address) as channel:
        admin = pb_grpc.AdminServiceStub(channel)
        bad_metadata: list[tuple[tuple[str, str], ...]] = [
            (),
            (("authorization", f"Bearer {WRONG}"),),
            (("authorization", f"Basic {TOKEN}"),),
            (("authorization", "Bearer "),),
            (("authorization", f"Bearer {TOKEN[:-1]}"),),
        ]
        for method, request in ADMIN_CALLS:
            for md in bad_metadata:
                with pytest.raises(grpc.RpcError) as ei:
                    getattr(admin, method)(request, timeout=5, metadata=md)
                assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, md)
                assert "Bearer" in ei.value.details() or "credentials" in ei.value.details()
                assert TOKEN not in ei.value.details()
                refused += 1
        assert core.targets_revision == revision and len(core.config.models) == 2
        good = (("authorization", f"Bearer {TOKEN}"),)
        assert admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5, metadata=good)
        assert admin.GetStatus(pb.GetStatusRequest(), timeout=5, metadata=good).models
        lower = (("authorization", f"bearer {TOKEN}"),)  # the scheme is case-insensitive
        assert admin.ListTargets(pb.ListTargetsRequest(), timeout=5, metadata=lower).targets
        # read-only APIs need no credentials
        batching = pb_grpc.BatchingServiceStub(channel)
        assert batching.GetBatchingConfig(pb.GetBatchingConfigRequest(model="demo"), timeout=5)
        keda = es_grpc.ExternalScalerStub(channel)
        ref = es.ScaledObjectRef(scalerMetadata={"model": "demo"})
        assert keda.GetMetricSpec(ref, timeout=5).metricSpecs
        health = health_pb2_grpc.HealthStub(channel)
        resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    assert sample(core.metrics.registry, "governor_admin_unauthenticated_total") == refused
    assert compared, "the token was not compared with hmac.compare_digest"
    fault_note(f"{refused} unauthenticated calls refused, 0 changes")


@pytest.mark.fault_case(
    "Security",
    "no admin token configured",
    "the admin API is disabled (UNAUTHENTICATED naming --admin-token-file) while engines "
    "and KEDA are served",
)
def test_admin_is_disabled_without_a_token() -> None:
    core, clock = _core()
    core.tick(clock.advance(5))
    with (
        ServerThread(core, allow_unauthenticated_admin=False, logger=quiet_logger()) as s,
        grpc.insecure_channel(s.address) as channel,
    ):
        admin = pb_grpc.AdminServiceStub(channel)
        with pytest.raises(grpc.RpcError) as ei:
            admin.GetStatus(pb.GetStatusRequest(), timeout=5)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "--admin-token-file" in ei.value.details()
        batching = pb_grpc.BatchingServiceStub(channel)
        assert batching.GetBatchingConfig(pb.GetBatchingConfigRequest(model="demo"), timeout=5)


@pytest.mark.fault_case(
    "Security",
    "admin token files: rotation, empty, short, bad characters, unreadable",
    "a rotated Secret file is picked up after the reload interval (old token refused); an "
    "unusable file is refused at start with a message naming the file, never its content; "
    "a file that turns bad later keeps the last good token",
)
def test_token_file_rotation_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    now = [0.0]
    tok = AdminToken(path, reload_interval_s=10, monotonic=lambda: now[0])
    assert tok.matches(f"Bearer {TOKEN}") and not tok.matches(f"Bearer {WRONG}")
    path.write_text(WRONG)
    now[0] = 5
    assert tok.matches(f"Bearer {TOKEN}")  # not re-read yet
    now[0] = 11
    assert tok.matches(f"Bearer {WRONG}") and not tok.matches(f"Bearer {TOKEN}")
    path.write_text("short")
    now[0] = 30
    assert tok.matches(f"Bearer {WRONG}") and "at least" in tok.reload_error
    assert TOKEN not in repr(tok) and WRONG not in repr(tok)
    cases = {
        "": "is empty",
        "   \n": "is empty",
        "tooshort": "at least 16",
        "has spaces inside the token value": "characters",
        "x" * 5000: "longer than",
        "tøken-with-non-ascii-characters": "characters",
    }
    for content, text in cases.items():
        path.write_text(content)
        with pytest.raises(SecurityConfigError) as ei:
            AdminToken(path)
        assert text in str(ei.value) and str(path) in str(ei.value)
        if content.strip():
            assert content.strip() not in str(ei.value)
    with pytest.raises(SecurityConfigError, match="cannot read"):
        AdminToken(tmp_path / "missing")


@pytest.mark.fault_case(
    "Security",
    "a separate admin listener (--admin-listen)",
    "the AdminService is served only on the admin listener (with its token); the main "
    "listener answers admin calls UNIMPLEMENTED and serves engines, KEDA and health; the "
    "admin listener serves no engine API",
)
@pytest.mark.parametrize("serving", ["inline", "process"])
def test_admin_on_its_own_listener(serving: str) -> None:
    """Inline and with the listeners in the serving process (service.serving): the
    same listeners, interceptors and answers."""
    core, clock = _core()
    core.tick(clock.advance(5))
    good = (("authorization", f"Bearer {TOKEN}"),)
    with ServerThread(
        core,
        admin_token=AdminToken.from_value(TOKEN),
        allow_unauthenticated_admin=False,
        admin_listen="127.0.0.1:0",
        logger=quiet_logger(),
        serving=serving,
        log_level="warning",
    ) as s:
        admin_addr = f"127.0.0.1:{s.server.admin_port}"
        assert s.server.admin_port not in (None, s.server.port)
        with grpc.insecure_channel(s.address) as main, grpc.insecure_channel(admin_addr) as adm:
            on_main = pb_grpc.AdminServiceStub(main)
            code = _code(lambda: on_main.GetStatus(pb.GetStatusRequest(), timeout=5, metadata=good))
            assert code == grpc.StatusCode.UNIMPLEMENTED
            batching = pb_grpc.BatchingServiceStub(main)
            assert batching.GetBatchingConfig(pb.GetBatchingConfigRequest(model="demo"), timeout=5)
            on_admin = pb_grpc.AdminServiceStub(adm)
            assert on_admin.GetStatus(pb.GetStatusRequest(), timeout=5, metadata=good).models
            code = _code(lambda: on_admin.GetStatus(pb.GetStatusRequest(), timeout=5))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            other = pb_grpc.BatchingServiceStub(adm)
            req = pb.GetBatchingConfigRequest(model="demo")
            assert _code(lambda: other.GetBatchingConfig(req, timeout=5)) == (
                grpc.StatusCode.UNIMPLEMENTED
            )
            for channel in (main, adm):
                health = health_pb2_grpc.HealthStub(channel)
                resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert resp.status == health_pb2.HealthCheckResponse.SERVING


# ---------------------------------------------------------------------- real process, TLS
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests need the openssl command (apt-get install openssl)")
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=governor-test-ca",
        cwd=d,
    )
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        _openssl(
            "req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}", cwd=d
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{who}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{who}.crt",
            "-days",
            "2",
            "-extfile",
            f"{who}.ext",
            cwd=d,
        )
    return d


def _server_pair(d: Path, ca: str, name: str) -> None:
    """`name`.crt/.key in `d`: a server certificate for 127.0.0.1 signed by `ca`.crt."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=s", cwd=d)
    ext = d / "san.ext"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", str(ext), cwd=d,
    )  # fmt: skip


def _handshakes(address: str, ca_file: Path) -> bool:
    """Whether a new connection trusting only `ca_file` is served (a health check)."""
    creds = grpc.ssl_channel_credentials(root_certificates=ca_file.read_bytes())
    # A channel of its own subchannels: no connection reused from an earlier channel.
    options = [("grpc.use_local_subchannel_pool", 1)]
    with grpc.secure_channel(address, creds, options=options) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError:
            return False
    return True


@pytest.mark.fault_case(
    "Security",
    "TLS certificate renewed in its mounted Secret (cert-manager)",
    "new connections get the renewed certificate without a restart (a client trusting only "
    "the new CA is served, one trusting only the old is refused); files checked at most "
    "every reload interval; a half-written or mismatched pair keeps the last good one and "
    "says why",
)
def test_a_renewed_tls_certificate_is_served_without_a_restart(tmp_path: Path, pki: Path) -> None:
    for f in ("ca.crt", "ca.key", "server.crt", "server.key"):
        shutil.copy(pki / f, tmp_path / f)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca2.key", "-out", "ca2.crt", "-days", "2", "-subj", "/CN=renewed-ca",
        cwd=tmp_path,
    )  # fmt: skip
    _server_pair(tmp_path, "ca2", "renewed")
    live = tmp_path / "live"
    live.mkdir()

    def mount(cert: str, key: str) -> None:  # as the kubelet swaps a Secret's files
        for src, dst in ((cert, "tls.crt"), (key, "tls.key")):
            shutil.copy(tmp_path / src, live / f"{dst}.new")
            os.replace(live / f"{dst}.new", live / dst)

    mount("server.crt", "server.key")
    tls = TlsFiles(str(live / "tls.crt"), str(live / "tls.key"), reload_interval_s=0.0)
    core, _clock = _core()
    with ServerThread(core, logger=quiet_logger(), tls=tls) as server:
        assert _handshakes(server.address, tmp_path / "ca.crt")
        assert not _handshakes(server.address, tmp_path / "ca2.crt")
        mount("renewed.crt", "renewed.key")
        assert _handshakes(server.address, tmp_path / "ca2.crt")
        assert not _handshakes(server.address, tmp_path / "ca.crt")

    # The reloader itself: the interval, and a change that is not a usable pair.
    now = [0.0]
    reloader = TlsReloader(
        TlsFiles(str(live / "tls.crt"), str(live / "tls.key")),
        reload_interval_s=10.0,
        monotonic=lambda: now[0],
    )
    assert reloader.fetch() is None  # within the interval: not even checked
    mount("server.crt", "renewed.key")  # a certificate with another certificate's key
    now[0] = 11.0
    assert reloader.fetch() is None and reloader.reloads == 0
    assert "not a usable pair" in reloader.reload_error
    assert str(live / "tls.key") in reloader.reload_error
    mount("server.crt", "server.key")
    now[0] = 15.0
    assert reloader.fetch() is None  # checked 4 s ago
    now[0] = 22.0
    assert reloader.fetch() is not None and reloader.reloads == 1
    assert reloader.reload_error == ""
    assert reloader.fetch() is None  # unchanged since


def _config_file(tmp: Path) -> Path:
    path = tmp / "config.yaml"
    cfg = {
        "models": [
            {
                "name": "demo",
                "deployment": "demo",
                "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 50},
            }
        ],
        "policy": {"tick_interval_s": 0.5},
        "prometheus": {"url": "http://127.0.0.1:9", "timeout_s": 0.2},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run_governor(tmp: Path, *extra: str) -> ServiceProcess:
    return ServiceProcess(
        [
            "-m",
            "service.cli",
            "run",
            "--config",
            str(_config_file(tmp)),
            "--store",
            "memory",
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--log-level",
            "debug",
            *extra,
        ],
        cwd=str(ROOT),
    )


def _cli(*argv: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "service.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.fault_case(
    "Security",
    "`governor run` with --admin-token-file, TLS and mTLS; the operator CLI",
    "CLI with --token-file over TLS: exit 0; no token / wrong token: exit 2 saying what to "
    "send / that the token was refused; plaintext client to the TLS port: exit 1; mTLS "
    "without a client certificate: refused, with one: served; neither token nor wrong "
    "token ever appears in the server's debug log or the CLI's output",
)
def test_governor_run_with_token_tls_and_mtls(tmp_path: Path, pki: Path, fault_note: Any) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    wrong_file = tmp_path / "wrong"
    wrong_file.write_text(WRONG)
    tls = ["--tls-cert-file", str(pki / "server.crt"), "--tls-key-file", str(pki / "server.key")]
    svc = _run_governor(tmp_path, "--admin-token-file", str(token_file), *tls)
    outputs: list[str] = []
    try:
        port = svc.port()
        server = f"127.0.0.1:{port}"
        ca = ["--tls-ca-file", str(pki / "ca.crt")]
        code, out = _cli("status", "--server", server, *ca, "--token-file", str(token_file))
        outputs.append(out)
        assert code == 0, out
        assert "instance" in out
        code, out = _cli("status", "--server", server, *ca)
        outputs.append(out)
        assert code == 2 and "needs credentials" in out and "--token-file" in out, out
        code, out = _cli("target", "list", "--server", server, *ca, "--token-file", str(wrong_file))
        outputs.append(out)
        assert code == 2 and "refused the credentials" in out, out
        code, out = _cli(
            "status", "--server", server, "--token-file", str(token_file), "--timeout-s", "3"
        )  # plaintext to a TLS port
        outputs.append(out)
        assert code == 1, out
        code, out = _cli("engine-args", "--model", "demo", "--server", server, *ca)
        outputs.append(out)
        assert code == 0 and "--max-num-seqs" in out
    finally:
        svc.proc.send_signal(signal.SIGTERM)
        svc.proc.wait(15)
        svc.kill()
    log = svc.output()
    assert '"tls": "tls"' in log and '"admin_api": "token from' in log, log[-2000:]
    for text in [log, *outputs]:
        assert TOKEN not in text and WRONG not in text

    # mTLS: client certificates required
    mtls = _run_governor(
        tmp_path,
        "--admin-token-file",
        str(token_file),
        *tls,
        "--tls-client-ca-file",
        str(pki / "ca.crt"),
    )
    try:
        server = f"127.0.0.1:{mtls.port()}"
        ca = ["--tls-ca-file", str(pki / "ca.crt")]
        code, out = _cli(
            "status", "--server", server, *ca, "--token-file", str(token_file), "--timeout-s", "3"
        )
        assert code == 1, out  # the handshake fails without a client certificate
        client = [
            "--tls-cert-file",
            str(pki / "client.crt"),
            "--tls-key-file",
            str(pki / "client.key"),
        ]
        code, out = _cli(
            "status", "--server", server, *ca, *client, "--token-file", str(token_file)
        )
        assert code == 0, out
        code, out = _cli("status", "--server", server, *ca, *client)
        assert code == 2, out  # mTLS does not replace the token
    finally:
        mtls.proc.send_signal(signal.SIGTERM)
        mtls.proc.wait(15)
        mtls.kill()
    assert TOKEN not in mtls.output()
    fault_note("TLS and mTLS handshakes checked; token absent from every log and output")


@pytest.mark.fault_case(
    "Security",
    "`governor run` with bad security flags",
    "exit 2 and a message naming the flag or file (never a token's content) for: a missing, "
    "empty or short token file, --insecure-admin on a non-loopback listener, TLS cert "
    "without key, a non-PEM certificate, a client CA without a server certificate, "
    "--max-watch-streams not below --max-concurrent-rpcs, --max-watch-streams-per-client "
    "outside [1, --max-watch-streams], a limit past a C int",
)
def test_bad_security_flags_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config_file(tmp_path)
    short = tmp_path / "short"
    short.write_text("abc123")
    empty = tmp_path / "empty"
    empty.write_text("")
    notpem = tmp_path / "cert.txt"
    notpem.write_text("hello")
    base = ["run", "--config", str(cfg), "--grpc-listen", "127.0.0.1:0"]
    cases = [
        (["--admin-token-file", str(tmp_path / "none")], "cannot read"),
        (["--admin-token-file", str(empty)], "is empty"),
        (["--admin-token-file", str(short)], "at least 16"),
        (["--insecure-admin", "--grpc-listen", "0.0.0.0:0"], "loopback"),
        (["--insecure-admin", "--admin-listen", "0.0.0.0:0"], "loopback --admin-listen"),
        (["--admin-listen", "nowhere"], "--admin-listen"),
        (["--tls-cert-file", str(notpem)], "both --tls-cert-file and --tls-key-file"),
        (["--tls-cert-file", str(notpem), "--tls-key-file", str(notpem)], "not a PEM"),
        (["--tls-client-ca-file", str(notpem)], "needs --tls-cert-file"),
        (["--max-concurrent-rpcs", "10", "--max-watch-streams", "10"], "--max-watch-streams"),
        (
            ["--max-watch-streams", "8", "--max-watch-streams-per-client", "9"],
            "--max-watch-streams-per-client must be within [1, --max-watch-streams (8)] (got 9)",
        ),
        (
            ["--max-watch-streams-per-client", "0"],
            "--max-watch-streams-per-client must be within [1, 2147483647] (got 0)",
        ),
        (["--max-models", "0"], "--max-models"),
        # past gRPC's C int: the server failed to build after the store was opened
        (["--max-concurrent-rpcs", "2147483648"], "--max-concurrent-rpcs must be within"),
        (["--max-models", "2147483648"], "--max-models must be within"),
        (["--sim-speed", "3"], "--sim-speed is read only with --simulated-fleet"),
        (["--simulated-fleet", "azure:conv", "--sim-speed", "1e6"], "--sim-speed must be <= 100"),
        (
            ["--grpc-listen", "127.0.0.1:50773", "--metrics-listen", "127.0.0.1:50773"],
            "--grpc-listen and --metrics-listen are both 127.0.0.1:50773",
        ),
    ]
    for extra, text in cases:
        assert cli_main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert text in err, (extra, err)
        assert "abc123" not in err


# ---------------------------------------------------------------------- limits
@pytest.mark.fault_case(
    "Security",
    "limits: request size, string lengths, models, watch streams, metadata entries",
    "a 2 MiB request: RESOURCE_EXHAUSTED; 100,000-character names: INVALID_ARGUMENT with a "
    "message clipped to <= 1,024 characters; GetStatus with more names than --max-models: "
    "INVALID_ARGUMENT; adding a model past --max-models: FAILED_PRECONDITION; the 4th watch "
    "stream past a limit of 3: RESOURCE_EXHAUSTED (counted), freed slots reusable; 300 "
    "scalerMetadata entries: INVALID_ARGUMENT; the server stays up and nothing changes",
)
def test_limits(fault_note: Any) -> None:
    clock = FakeClock()
    cfg = make_config(model_entry("demo"), model_entry("other"), knob_sustain_s=0)
    log = quiet_logger()
    core = ServiceCore(
        cfg,
        FakeSource({"demo": 20.0, "other": 5.0}),
        MemoryStore(),
        clock=clock,
        logger=log,
        max_models=2,
    )
    core.tick(clock.advance(5))
    revision = core.targets_revision
    with (
        ServerThread(core, logger=log, max_watch_streams=3, max_watch_streams_per_client=3) as s,
        grpc.insecure_channel(s.address) as channel,
    ):
        admin = pb_grpc.AdminServiceStub(channel)
        batching = pb_grpc.BatchingServiceStub(channel)
        keda = es_grpc.ExternalScalerStub(channel)
        big = pb.ModelTarget(name="x" * (2 * 1024 * 1024), deployment="x")
        assert _code(lambda: admin.SetTarget(pb.SetTargetRequest(target=big), timeout=10)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED
        )
        long = "m" * 100_000
        for call in (
            lambda: batching.GetBatchingConfig(pb.GetBatchingConfigRequest(model=long), timeout=5),
            lambda: admin.GetTarget(pb.GetTargetRequest(model=long), timeout=5),
            lambda: keda.GetMetricSpec(_ref({"model": long}), timeout=5),
            lambda: admin.SetTarget(
                pb.SetTargetRequest(target=pb.ModelTarget(name=long, deployment="d")), timeout=5
            ),
        ):
            with pytest.raises(grpc.RpcError) as ei:
                call()
            assert ei.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
            assert 0 < len(ei.value.details()) <= 1024, len(ei.value.details())
        names = [f"n{i}" for i in range(3)]
        assert _code(lambda: admin.GetStatus(pb.GetStatusRequest(models=names), timeout=5)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
        third = pb.ModelTarget(
            name="third", deployment="third", sla=pb.Sla(ttft_p95_ms=1000, itl_p95_ms=50)
        )
        with pytest.raises(grpc.RpcError) as ei:
            admin.SetTarget(pb.SetTargetRequest(target=third), timeout=5)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--max-models 2" in ei.value.details()
        meta = {f"k{i}": "v" for i in range(300)} | {"model": "demo"}
        assert (
            _code(lambda: keda.GetMetricSpec(_ref(meta), timeout=5))
            == grpc.StatusCode.INVALID_ARGUMENT
        )
        # watch streams: 3 allowed (engines and KEDA together), the 4th refused
        req = pb.GetBatchingConfigRequest(model="demo")
        streams = [batching.WatchBatchingConfig(req, timeout=30) for _ in range(2)]
        ref = es.ScaledObjectRef(scalerMetadata={"model": "demo"})
        streams.append(keda.StreamIsActive(ref, timeout=30))
        for st in streams:
            next(iter(st))
        wait_until(lambda: s.server.streams.active == 3, 10, "3 open streams")
        extra = batching.WatchBatchingConfig(req, timeout=10)
        with pytest.raises(grpc.RpcError) as ei:
            next(iter(extra))
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit 3" in ei.value.details()
        assert sample(core.metrics.registry, "governor_watch_streams_refused_total") == 1.0
        assert sample(core.metrics.registry, "governor_watch_streams") == 3.0
        streams[0].cancel()
        wait_until(lambda: s.server.streams.active == 2, 10, "a slot freed")
        again = batching.WatchBatchingConfig(req, timeout=10)
        assert next(iter(again)).model == "demo"
        again.cancel()
        for st in streams[1:]:
            st.cancel()
        health = health_pb2_grpc.HealthStub(channel)
        resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    assert core.targets_revision == revision
    assert [m.name for m in core.config.models] == ["demo", "other"]
    fault_note("every limit refused with a clear code; 0 changes; server up")


# ---------------------------------------------------------------------- helm
@pytest.mark.fault_case(
    "Security",
    "Helm chart: admin token from a Secret",
    "adminToken.existingSecret mounts only that key (as /etc/governor-admin/token, "
    "read-only) into the governor container and passes --admin-token-file pointing at it "
    "(accepted by the real CLI parser), in standalone and sidecar mode; without it no "
    "flag and no Secret volume (admin API disabled); a bad Secret name fails at install",
)
def test_helm_mounts_the_admin_token_secret() -> None:
    from service.cli import build_parser
    from tests.helm.chart import MODEL_8B, container, render, validate, values

    def governor_pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
        for o in objs:
            if o["kind"] == "Deployment":
                spec = o["spec"]["template"]["spec"]
                names = [c["name"] for c in spec.get("containers", [])]
                inits = [c["name"] for c in spec.get("initContainers", [])]
                if "governor" in names or "governor" in inits:
                    return spec  # type: ignore[no-any-return]
        raise AssertionError("no governor pod")

    for mode in ("standalone", "sidecar"):
        extra = {"exampleEngine": {"enabled": True}} if mode == "sidecar" else {}
        secret = {"existingSecret": "gov-admin", "key": "tok"}
        vals = values(mode=mode, models=[MODEL_8B], adminToken=secret, **extra)
        objs = render(vals, namespace="llm" if mode == "sidecar" else "llm-system")
        for obj in objs:
            validate(obj)  # Kubernetes schemas: the volume and mount are well-formed
        pod = governor_pod(objs)
        gov = container(pod, "governor", init=mode == "sidecar")
        args = build_parser().parse_args(gov["args"])
        assert args.admin_token_file == "/etc/governor-admin/token"
        mount = next(m for m in gov["volumeMounts"] if m["name"] == "governor-admin-token")
        assert mount["mountPath"] == "/etc/governor-admin" and mount["readOnly"] is True
        vol = next(v for v in pod["volumes"] if v["name"] == "governor-admin-token")
        assert vol["secret"]["secretName"] == "gov-admin"
        assert vol["secret"]["items"] == [{"key": "tok", "path": "token"}]
        others = [
            c
            for c in pod.get("containers", []) + pod.get("initContainers", [])
            if c["name"] != "governor"
        ]
        for c in others:
            assert all(m["name"] != "governor-admin-token" for m in c.get("volumeMounts", []))
    pod = governor_pod(render(values()))
    gov = container(pod, "governor")
    assert "--admin-token-file" not in gov["args"]
    assert all(v["name"] != "governor-admin-token" for v in pod["volumes"])
    with pytest.raises(Exception, match=r"existingSecret|pattern"):
        render(values(adminToken={"existingSecret": "Not_A_Name"}))


@pytest.mark.fault_case(
    "Security",
    "health-check and reflection streams opened by a client without credentials",
    "they hold watch-stream slots (the 4th past a limit of 3: RESOURCE_EXHAUSTED), so no "
    "client fills every RPC slot with them: Health.Check, GetBatchingConfig and KEDA's "
    "GetMetrics are still answered; freed slots are reusable",
)
def test_health_watch_streams_cannot_take_every_rpc_slot(fault_note: Any) -> None:
    """grpc.health.v1 Health/Watch is a long-lived stream that needs no credentials: it
    took an RPC slot (--max-concurrent-rpcs) outside the watch-stream limit, so one client
    holding them refused every unary call, the kubelet's gRPC probes included."""
    core, clock = _core()
    core.tick(clock.advance(5))  # a decision: KEDA's GetMetrics has a value to answer
    with (
        ServerThread(
            core,
            logger=quiet_logger(),
            max_concurrent_rpcs=8,
            max_watch_streams=3,
            max_watch_streams_per_client=3,  # one client here: the total is tested
        ) as s,
        grpc.insecure_channel(s.address) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        watches = [health.Watch(health_pb2.HealthCheckRequest(), timeout=30) for _ in range(3)]
        for w in watches:
            next(iter(w))
        wait_until(lambda: s.server.streams.active == 3, 10, "3 open health streams")
        extra = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        with pytest.raises(grpc.RpcError) as ei:
            next(iter(extra))
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        check = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        batching = pb_grpc.BatchingServiceStub(channel)
        got = batching.GetBatchingConfig(pb.GetBatchingConfigRequest(model="demo"), timeout=5)
        assert got.model == "demo"
        keda = es_grpc.ExternalScalerStub(channel)
        ref = es.ScaledObjectRef(name="so", namespace="default", scalerMetadata={"model": "demo"})
        metrics = keda.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=5)
        assert metrics.metricValues
        watches[0].cancel()
        wait_until(lambda: s.server.streams.active == 2, 10, "a slot freed")
        again = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(iter(again)).status == health_pb2.HealthCheckResponse.SERVING
        again.cancel()
        for w in watches[1:]:
            w.cancel()
    fault_note("4th health stream refused; unary calls answered throughout")
