"""Bad input from the stores, the Kubernetes API and the TLS files (a session-55 review):
each is a clear error naming what is wrong, and it changes nothing. Before, a targets
ConfigMap edit raised out of every tick (ValueError, RecursionError), a state file that
was not UTF-8 was a traceback, a state 30 years ahead pinned its model, a Deployment
answer without metadata stopped every queued roll-out, and a client CA file that only
named CERTIFICATE passed. (A corrupt state ConfigMap and a gzip bomb in it:
tests/service/test_cmstore.py.) The Kubernetes API is the project's
fake of its published contract (tests/service/fake_kube.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actuators.kubeapi import api_client
from actuators.rollout import KnobRolloutActuator, RolloutReason
from controller.types import Decision, Knobs, Reason
from service.security import MAX_PEM_BYTES, SecurityConfigError, TlsFiles, TlsReloader
from service.store import (
    MAX_AHEAD_S,
    MAX_STATE_BYTES,
    FileStore,
    StoreError,
    TargetsInvalidError,
    from_wall,
    parse_targets_yaml,
)
from tests.service.fake_kube import FakeKubeAPI

NS = "llm"
DEEP = "models: " + "[" * 5000 + "]" * 5000 + "\n"
"""Nesting past Python's recursion limit (it raised RecursionError out of the parser)."""
LONG_INT = "models:\n- name: m\n  deployment: m\n  replicas: {max_replicas: " + "9" * 5000 + "}\n"
"""An integer past Python's 4,300-digit limit (it raised ValueError out of the parser)."""


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as fake:
        yield fake


@pytest.mark.parametrize(
    ("text", "needle"), [(DEEP, "nested too deeply"), (LONG_INT, "a value it cannot read")]
)
def test_a_targets_document_past_the_parsers_limits_is_invalid_not_a_crash(
    text: str, needle: str
) -> None:
    with pytest.raises(TargetsInvalidError) as err:
        parse_targets_yaml(text, "configmap llm/governor-targets", "10")
    assert "not valid YAML" in str(err.value) and needle in str(err.value)


@pytest.mark.parametrize(
    ("data", "needle"),
    [(b"\xff\xfe{}", "utf-8"), (b"[" * 100_000, "nested too deeply"), (b"{not json", "not JSON")],
)
def test_a_corrupt_state_file_is_a_store_error_naming_it(
    tmp_path: Path, data: bytes, needle: str
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(data)
    with pytest.raises(StoreError) as err:
        FileStore(path).load_state()
    assert str(path) in str(err.value) and needle in str(err.value)
    assert "move it away to start fresh" in str(err.value)


def test_a_state_file_past_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b" " * (MAX_STATE_BYTES + 1))
    with pytest.raises(StoreError, match=f"larger than {MAX_STATE_BYTES} bytes"):
        FileStore(path).load_state()


SAVED_AT = 1_800_000_000.0
BASE = {"replicas": 20, "knobs": {"max_num_seqs": 64, "max_num_batched_tokens": 4096}}


def test_a_stored_time_past_a_day_after_the_save_is_refused() -> None:
    """A panic hold stored 30 years ahead held its model at 20 replicas, in panic, with no
    error. A time up to MAX_AHEAD_S after the save loads (a hold still running)."""
    ahead = BASE | {"panic_until_s": SAVED_AT + MAX_AHEAD_S}
    assert from_wall(ahead, 0.0, "demo", SAVED_AT).windows.panic_until_s == SAVED_AT + MAX_AHEAD_S
    for field in ("panic_until_s", "last_scale_up_s"):
        with pytest.raises(StoreError, match=f"demo: {field}: .* after the save"):
            from_wall(BASE | {field: SAVED_AT + MAX_AHEAD_S + 1}, 0.0, "demo", SAVED_AT)
    far = BASE | {"recommendations": [[SAVED_AT + 1e9, 3]]}
    with pytest.raises(StoreError, match=r"recommendations: .* after the save"):
        from_wall(far, 0.0, "demo", SAVED_AT)
    # without a usable save time there is nothing to judge by
    assert from_wall(ahead | {"panic_until_s": SAVED_AT + 1e9}, 0.0, "demo").replicas == 20


def test_a_time_pair_that_is_no_pair_is_named() -> None:
    with pytest.raises(StoreError, match=r"demo: recommendations: must be a list of \[time, value"):
        from_wall(BASE | {"recommendations": [1, 2]}, 0.0, "demo", SAVED_AT)


def _decision(model: str) -> Decision:
    knobs = Knobs(64, 4096)
    return Decision(model, 0.0, True, 4, knobs, (), Reason.KNOBS_CHANGED, 2.0, rollout=True)


def _rollouts_of_a_and_b(api: FakeKubeAPI, errors: list[str]) -> KnobRolloutActuator:
    """A roll-out actuator of models a and b (Deployments a and b in NS), errors counted
    into `errors`, no rate limit."""
    return KnobRolloutActuator(
        api_client(api.url),
        lambda: {"a": (NS, "a"), "b": (NS, "b")},
        lambda model: 0.0,
        background=False,
        sleep=lambda s: None,
        request_timeout_s=5.0,
        on_error=errors.append,
    )


def test_a_deployment_read_without_metadata_fails_its_model_only(api: FakeKubeAPI) -> None:
    """Model a's Deployment answers without metadata: a is FAILED (malformed answer, not
    patched, counted), and b, queued behind it, still rolls out (an AttributeError out of
    a's attempt had stopped the queue)."""
    api.add_deployment(NS, "a", 4)
    api.add_deployment(NS, "b", 4)
    real = api._deployment

    def without_metadata(method: str, ns: str, name: str, *rest: Any) -> Any:
        code, obj = real(method, ns, name, *rest)
        if method == "GET" and name == "a":
            obj.pop("metadata")
        return code, obj

    api._deployment = without_metadata  # type: ignore[method-assign]
    errors: list[str] = []
    act = _rollouts_of_a_and_b(api, errors)
    act.apply([_decision("a"), _decision("b")])
    status = act.status()
    assert status["a"].reason == RolloutReason.FAILED
    assert "malformed answer: no metadata.resourceVersion" in status["a"].detail
    assert status["b"].reason == RolloutReason.STARTED
    assert api.count("PATCH", "/deployments/a") == 0 and errors


def test_anything_one_models_rollout_raises_stays_with_that_model(api: FakeKubeAPI) -> None:
    """Whatever `_try` raises for model a (a bug, an answer of a shape not foreseen) is
    a's FAILED status, counted as `exception`; b still rolls out."""
    api.add_deployment(NS, "a", 4)
    api.add_deployment(NS, "b", 4)
    errors: list[str] = []
    act = _rollouts_of_a_and_b(api, errors)
    real = act._try

    def broken(model: str, *args: Any) -> Any:
        if model == "a":
            raise AttributeError("'NoneType' object has no attribute 'generation'")
        return real(model, *args)

    act._try = broken  # type: ignore[method-assign]
    act.apply([_decision("a"), _decision("b")])
    status = act.status()
    assert status["a"].reason == RolloutReason.FAILED and "unexpected error" in status["a"].detail
    assert status["b"].reason == RolloutReason.STARTED and errors == ["exception"]


# ---------------------------------------------------------------------- TLS files
@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate (usable as its own CA) and its key."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests need the openssl command (apt-get install openssl)")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=t"],
        cwd=d, check=True, capture_output=True,
    )  # fmt: skip
    return d


MARKER_ONLY = b"-----BEGIN CERTIFICATE-----\nTUlJQm9nVXM=\n-----END CERTIFICATE-----\n"


def test_a_client_ca_that_holds_no_certificate_is_refused_naming_it(pair: Path) -> None:
    """It passed the marker check, and `governor run` then failed to listen with an error
    about the address (exit 1)."""
    bad = pair / "bad-ca.pem"
    bad.write_bytes(MARKER_ONLY)
    cert, key = str(pair / "cert.pem"), str(pair / "key.pem")
    TlsReloader(TlsFiles(cert, key, cert))  # a real CA (the certificate itself) loads
    with pytest.raises(SecurityConfigError, match=f"TLS client CA file {bad}: not a usable CA"):
        TlsReloader(TlsFiles(cert, key, str(bad)))


def test_a_ca_broken_on_reload_keeps_the_last_and_says_why(pair: Path, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    shutil.copy(pair / "cert.pem", ca)
    now = [0.0]
    reloader = TlsReloader(
        TlsFiles(str(pair / "cert.pem"), str(pair / "key.pem"), str(ca)),
        reload_interval_s=1.0,
        monotonic=lambda: now[0],
    )
    ca.write_bytes(MARKER_ONLY)
    now[0] = 5.0
    assert reloader.fetch() is None and reloader.reloads == 0
    assert "not a usable CA certificate" in reloader.reload_error


def test_a_tls_file_past_the_size_bound_is_refused_unread(pair: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.pem"
    big.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + b"A" * MAX_PEM_BYTES)
    for cert in (str(big), "/dev/zero"):
        with pytest.raises(SecurityConfigError, match=f"larger than {MAX_PEM_BYTES} bytes"):
            TlsReloader(TlsFiles(cert, str(pair / "key.pem")))
