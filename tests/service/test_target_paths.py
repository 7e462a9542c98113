"""One target validator on every path an SLA edit takes, and JSON views with zero values.

A bad edit is refused with the same message by the `governor target set` CLI (before it
sends anything), the Admin API, the targets ConfigMap (through the fake Kubernetes API
server of tests/service/fake_kube.py: a fake, since no API server can run here) and
`governor check-config`, and it changes nothing. Real gRPC on loopback; ticks driven
by the test on a fake clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from kubernetes import client as k8s

from actuators.kubeapi import api_client
from controller.targets import TargetError, validate_target
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.cli import main as cli_main
from service.cmstore import ConfigMapStore
from service.core import ServiceCore
from service.store import MemoryStore
from tests.service.fake_kube import FakeKubeAPI
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread

BAD_SLA = {"ttft_p95_ms": -5.0, "itl_p95_ms": 50.0}


def _expected_problem() -> str:
    with pytest.raises(TargetError) as ei:
        validate_target(model_entry("demo", sla=BAD_SLA))
    (problem,) = ei.value.problems
    assert problem.startswith("models[demo].sla.ttft_p95_ms: ")
    assert "(got -5.0)" in problem
    return problem


@pytest.fixture
def served() -> Iterator[tuple[ServiceCore, str]]:
    core = ServiceCore(
        make_config(model_entry("demo")),
        FakeSource({"demo": 0.0}),
        MemoryStore(),
        clock=FakeClock(),
        logger=quiet_logger(),
    )
    with ServerThread(core, logger=quiet_logger()) as server:
        yield core, server.address


def test_bad_edit_same_message_on_admin_api_and_cli(
    served: tuple[ServiceCore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    core, address = served
    problem = _expected_problem()
    before = (core.config, core.targets, core.targets_revision)

    channel = grpc.insecure_channel(address)
    admin = pb_grpc.AdminServiceStub(channel)
    target = admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5).target
    target.sla.ttft_p95_ms = -5.0
    with pytest.raises(grpc.RpcError) as ei:
        admin.SetTarget(pb.SetTargetRequest(target=target), timeout=5)
    channel.close()
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ei.value.details() == problem

    code = cli_main(["target", "set", "demo", "--ttft-p95-ms", "-5", "--server", address])
    assert code == 2
    assert f"governor target set: {problem}" in capsys.readouterr().err
    assert (core.config, core.targets, core.targets_revision) == before


def test_profile_path_refused_alike_by_admin_api_and_cli(
    served: tuple[ServiceCore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A remote caller may not make the server read a file: one check, one message."""
    core, address = served
    before = core.targets_revision
    code = cli_main(["target", "set", "demo", "--profile", "/etc/passwd", "--server", address])
    err = capsys.readouterr().err
    assert code == 2
    assert "models[demo].profile: must be the name of a shipped profile, not a path" in err
    assert core.targets_revision == before


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-replicas", "4294967296"], "max_replicas: Input should be less than or equal"),
        (["--attainment-goal-frac", "1"], "attainment_goal_frac: Input should be less than 1"),
        (["--file", "BINARY"], "not UTF-8 text (byte 0xff at offset 0)"),
        (["--file", "TWICE"], "duplicate key 'sla'"),
        (["--policy", "tolerance_frac=.nan"], "tolerance_frac must be a finite number (got nan)"),
        # an empty value read as YAML null: "never release", and a dry run passed it
        (["--policy", "falling_release_after_s=", "--dry-run"], "falling_release_after_s=: no"),
        (["--policy", "falling_release_after_s= "], "falling_release_after_s=: no value"),
        (["--policy", " =1"], "--policy ' =1': the key is empty"),
    ],
)
def test_target_set_refuses_what_the_governor_cannot_run_on(
    served: tuple[ServiceCore, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    """Values past the API's int32 fields (a traceback before), a goal of every request
    (accepted before: every tick then raised in decide), a file not UTF-8 (a traceback)
    and a key given twice (the last silently won): exit 2, a message, nothing changed."""
    core, address = served
    (tmp_path / "BINARY").write_bytes(b"\xff\xfe")
    (tmp_path / "TWICE").write_text(
        "sla: {ttft_p95_ms: 500, itl_p95_ms: 50}\nsla: {ttft_p95_ms: 9, itl_p95_ms: 9}\n"
    )
    args = [str(tmp_path / a) if a in ("BINARY", "TWICE") else a for a in args]
    before = core.targets_revision
    assert cli_main(["target", "set", "demo", *args, "--server", address]) == 2
    assert needle in capsys.readouterr().err
    assert core.targets_revision == before


def test_target_set_refuses_a_file_of_another_model(
    served: tuple[ServiceCore, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`target set demo --file F` where F says `name: other` set demo from F, F's name
    silently replaced (F's target renamed): now exit 2 naming both, nothing changed."""
    core, address = served
    target = tmp_path / "other.yaml"
    entry = model_entry("other")
    target.write_text(yaml.safe_dump(entry))
    before = core.targets_revision
    argv = ["target", "set", "demo", "--file", str(target), "--server", address]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"--file {target} is the target of 'other', not of 'demo'" in err
    assert core.targets_revision == before
    target.write_text(yaml.safe_dump({**entry, "name": "demo"}))
    assert cli_main(argv) == 0  # the same name: set


def test_target_set_keeps_a_policy_override_to_null(capsys: pytest.CaptureFixture[str]) -> None:
    """`falling_release_after_s: null` (never release) is a per-model setting: the CLI's
    read-modify-write sends it back with the edit (it was dropped as an unset field, and
    the model silently took the global 600 s)."""
    entry = model_entry("demo", policy={"falling_release_after_s": None})
    core = ServiceCore(
        make_config(entry),
        FakeSource({"demo": 0.0}),
        MemoryStore(),
        clock=FakeClock(),
        logger=quiet_logger(),
    )
    with ServerThread(core, logger=quiet_logger()) as server:
        args = ["target", "set", "demo", "--max-replicas", "15", "--server", server.address]
        assert cli_main(args) == 0
        got = cli_main(["target", "get", "demo", "--server", server.address])
    assert got == 0 and "falling_release_after_s: null" in capsys.readouterr().out
    model = core.config.model("demo")
    assert model.replicas.max_replicas == 15
    assert model.policy == {"falling_release_after_s": None}
    assert core.config.policy_for(model).falling_release_after_s is None


def test_bad_edit_same_message_in_configmap_and_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ConfigMap path against FakeKubeAPI, a fake of the published API contract."""
    problem = _expected_problem()
    with FakeKubeAPI() as api:
        store = ConfigMapStore(k8s.CoreV1Api(api_client(api.url)), "ns", "governor-targets")
        core = ServiceCore(
            make_config(model_entry("demo")),
            FakeSource({"demo": 1.0}),
            store,
            clock=FakeClock(),
            logger=quiet_logger(),
        )
        before = (core.config, core.targets, core.targets_revision)
        bad = {"models": [model_entry("demo", sla=BAD_SLA)]}
        api.edit_configmap("ns", "governor-targets", {"targets.yaml": yaml.safe_dump(bad)})
        core.poll_targets()
        assert problem in core.targets_problem
        assert (core.config, core.targets, core.targets_revision) == before

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert cli_main(["check-config", str(path)]) == 2
    assert f"  - {problem}" in capsys.readouterr().err.splitlines()


def test_check_config_refuses_a_profile_that_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    entry = model_entry("demo") | {"profile": "no-such-profile"}
    path.write_text(yaml.safe_dump({"models": [entry]}))
    assert cli_main(["check-config", str(path)]) == 2
    assert "models[demo].profile: " in capsys.readouterr().err


def test_status_json_shows_zero_values_of_an_idle_model(
    served: tuple[ServiceCore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An idle model (arrival rate 0) reads as 0 in `governor status -o json`, not as a
    missing field; fields with presence stay absent when there is no data."""
    core, address = served
    core.tick(5.0)
    assert cli_main(["status", "demo", "-o", "json", "--server", address]) == 0
    doc = json.loads(capsys.readouterr().out)
    (model,) = doc["models"]
    obs = model["observation"]
    assert obs["present"] is True
    assert obs["arrival_rate_rps"] == 0.0
    assert model["paused"] is False
    assert "ready_replicas" not in obs or obs["ready_replicas"] >= 0


def test_status_json_shows_no_zero_for_what_does_not_exist(
    served: tuple[ServiceCore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Missing metrics never read as zero, in `-o json` too: before the first decision
    there are no published replicas and no decision time, and a model without data has
    no arrival rate, staleness or observation time (`jq .arrival_rate_rps` read 0)."""
    core, address = served
    assert cli_main(["status", "demo", "-o", "json", "--server", address]) == 0
    (model,) = json.loads(capsys.readouterr().out)["models"]
    assert model["published"]["has_replicas"] is False
    assert "replicas" not in model["published"]
    assert "decided_at_unix_s" not in model["published"]
    assert isinstance(core.source, FakeSource)
    core.source.set("demo", None)  # no data
    core.tick(5.0)
    assert cli_main(["status", "demo", "-o", "json", "--server", address]) == 0
    (model,) = json.loads(capsys.readouterr().out)["models"]
    obs = model["observation"]
    assert obs["present"] is False and obs["no_data"]
    for absent in ("arrival_rate_rps", "staleness_s", "observed_at_s"):
        assert absent not in obs, absent


@pytest.mark.parametrize(
    "args",
    [
        ["engine-args", "--model", "demo", "--default-max-num-seqs", "-5"],
        ["engine-args", "--model", "demo", "--live", "--max-num-seqs-ceiling", "0"],
        ["explain", "demo", "--last", "99999999999"],
    ],
)
def test_counts_out_of_range_are_usage_errors(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`engine-args --default-max-num-seqs -5` printed `--max-num-seqs -5` for an
    engine's start command; `explain --last 99999999999` raised past the API's uint32."""
    with pytest.raises(SystemExit) as exc:
        cli_main(args)
    assert exc.value.code == 2
    assert "must be in [" in capsys.readouterr().err


def test_pause_resume_and_delete_print_the_api_messages_in_json(
    served: tuple[ServiceCore, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`-o json` (the API's messages) was accepted and ignored by pause, resume and
    target delete, which printed their text lines into a script's JSON parser."""
    _core, address = served
    server = ["--server", address, "-o", "json"]
    assert cli_main(["pause", "demo", *server]) == 0
    assert json.loads(capsys.readouterr().out) == {"model": "demo", "paused": True}
    assert cli_main(["resume", "demo", *server]) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is False
    new = ["target", "set", "other", "--deployment", "other", "--ttft-p95-ms", "500"]
    assert cli_main([*new, "--itl-p95-ms", "50", "--server", address]) == 0
    capsys.readouterr()
    assert cli_main(["target", "delete", "other", *server]) == 0
    assert "revision" in json.loads(capsys.readouterr().out)


def test_an_empty_server_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--server "" (or an empty $GOVERNOR_SERVER as the default) reached gRPC's resolver,
    which logged its own errors before the channel failed."""
    with pytest.raises(SystemExit) as ei:
        cli_main(["status", "--server", " "])
    assert ei.value.code == 2 and "--server: must be HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("server", "needle"),
    [
        ("127.0.0.1:116087", "port must be 1-65535 (got '116087'"),
        ("127.0.0.1:notaport", "port must be 1-65535 (got 'notaport'"),
        ("127.0.0.1:0", "port must be 1-65535 (got '0'"),
        ("localhost", "must be HOST:PORT (got 'localhost')"),
        ("dns:///127.0.0.1:99999", "port must be 1-65535 (got '99999'"),
        ("ipv4:127.0.0.1:1,127.0.0.1:70000", "port must be 1-65535 (got '70000'"),
        ("unix:", "names no address"),
    ],
)
def test_a_server_address_past_the_port_range_is_a_usage_error(
    server: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """gRPC takes a port past 65535 modulo 65536: `--server 127.0.0.1:116087` reached
    port 50551, the admin token with the call; a port that is not a number exited 1
    "cannot reach". Refused before any channel opens (exit 2, naming the port)."""
    for command in (["target", "list"], ["engine-args", "--model", "demo"]):
        with pytest.raises(SystemExit) as ei:
            cli_main([*command, "--server", server])
        err = capsys.readouterr().err
        assert ei.value.code == 2 and needle in err, (command, err)


def test_governor_server_is_checked_like_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """$GOVERNOR_SERVER is --server's default: the same check, and the message says
    where the value came from; gRPC's own target schemes pass."""
    from service.admin_cli import _server_address

    monkeypatch.setenv("GOVERNOR_SERVER", "127.0.0.1:116087")
    for command in (["status"], ["engine-args", "--model", "demo"]):
        with pytest.raises(SystemExit) as ei:
            cli_main(command)
        err = capsys.readouterr().err
        assert ei.value.code == 2 and "(the value of $GOVERNOR_SERVER)" in err, err
    for ok in ("unix:/run/governor.sock", "dns:///governor.ns:50051", "[::1]:50051", "h:1"):
        assert _server_address(ok) == ok


def test_tls_server_name_without_tls_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--tls-server-name` without --tls was ignored: the call, the admin token with it,
    went in plaintext to an operator who believed the certificate was checked."""
    monkeypatch.delenv("GOVERNOR_TLS_CA_FILE", raising=False)
    server = ["--server", "127.0.0.1:1", "--tls-server-name", "governor.example"]
    for command in (["target", "list"], ["status"], ["engine-args", "--model", "demo"]):
        assert cli_main([*command, *server]) == 2, command
        out, err = capsys.readouterr()
        assert out == "" and "--tls-server-name needs TLS" in err, err


def test_a_reader_that_goes_away_ends_the_cli_quietly() -> None:
    """`governor ... | head -c 1`: the pipe closed before the output was written gave a
    BrokenPipeError traceback; now exit 1 and nothing on stderr."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "check-config", str(root / "examples/governor.yaml")],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has started, so before any write
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1 and "Traceback" not in err, err
