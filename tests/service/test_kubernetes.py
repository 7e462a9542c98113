"""The Kubernetes actuator, the ConfigMap store and Lease election, with the real
`kubernetes` client against `FakeKubeAPI`, a fake of the published API contract
(resourceVersion conflicts -> 409, scale subresource, Lease renewals), including
injected 409/500/timeouts. Fake clocks; backoff sleeps are recorded, not slept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from actuators.kubeapi import KubeCallError, api_client, call_with_retries
from actuators.kubernetes import MAX_RETRY_DELAY_S, KubernetesScaleActuator, ScaleReason
from controller.targets import config_to_targets
from controller.types import Decision, Knobs, Reason
from service.cmstore import ConfigMapStore
from service.core import ServiceCore
from service.errors import AdminError
from service.leader import LeaseElector
from service.store import (
    ConflictError,
    MemoryStore,
    StoreError,
    TargetsInvalidError,
)
from tests.service.fake_kube import FakeKubeAPI
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger

NS = "llm"
REQUEST_TIMEOUT_S = 30.0
"""The clients' request timeout where no test injects a timeout: the fake API answers in
milliseconds, but on a loaded machine a request through its in-process server has taken
more than a short timeout, and a lost renew or save under a fake clock broke tests that
believed it had happened (a Lease "renewed" at t that the follower saw last at t - 2 s)."""
INJECTED_TIMEOUT_S = 1.0
"""The clients' timeout in the tests that inject one; the fake holds those requests
`HELD_S`, and answers every other request well within it."""
HELD_S = 1.5


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(timeout_delay_s=HELD_S) as fake:
        yield fake


def _decision(model: str, replicas: int, valid: bool = True) -> Decision:
    return Decision(model, 0.0, valid, replicas, Knobs(8, 256), (), Reason.KNOBS_STATIC)


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, s: float) -> None:
        self.calls.append(s)


def _actuator(api: FakeKubeAPI, sleeps: Sleeps, **kw: Any) -> KubernetesScaleActuator:
    targets = {"demo": (NS, "demo"), "other": (NS, "other")}
    return KubernetesScaleActuator(
        api_client(api.url),
        lambda: targets,
        background=kw.pop("background", False),
        sleep=sleeps,
        request_timeout_s=kw.pop("request_timeout_s", REQUEST_TIMEOUT_S),
        backoff_s=0.1,
        logger=quiet_logger(),
        **kw,
    )


# ---------------------------------------------------------------------- actuator
def test_scales_and_is_a_no_op_when_equal(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: scale subresource GET + merge PATCH."""
    api.add_deployment(NS, "demo", 2)
    act = _actuator(api, Sleeps())
    act.apply([_decision("demo", 5)])
    assert api.replicas(NS, "demo") == 5
    assert act.status()["demo"].reason == ScaleReason.SCALED
    assert act.status()["demo"].observed == 2
    patches = api.count("PATCH")
    act.apply([_decision("demo", 5)])
    assert api.count("PATCH") == patches  # equal: no write
    assert act.status()["demo"].reason == ScaleReason.UNCHANGED
    act.apply([_decision("demo", 1, valid=False)])  # "no decision" never acts
    assert api.replicas(NS, "demo") == 5


def test_a_deployment_at_zero_reads_as_zero_not_unknown(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: autoscaling/v1 ScaleSpec.replicas is
    `omitempty`, so the scale of a Deployment at 0 comes back as `"spec": {}`. That is
    0 replicas: no write per tick for an idle model, and "was 0" when it scales up."""
    api.add_deployment(NS, "demo", 0)
    act = _actuator(api, Sleeps())
    for _ in range(3):
        act.apply([_decision("demo", 0)])
        assert act.status()["demo"].reason == ScaleReason.UNCHANGED
        assert act.status()["demo"].observed == 0
    assert api.count("PATCH") == 0
    act.apply([_decision("demo", 2)])
    assert act.status()["demo"].describe() == "SCALED: desired 2, was 0"
    assert api.replicas(NS, "demo") == 2


def test_a_model_failing_for_hours_keeps_a_capped_retry_and_the_others_scale(
    api: FakeKubeAPI,
) -> None:
    """Against FakeKubeAPI, a fake of the published API contract. A Deployment whose
    writes fail for hours (a broken admission webhook) has failed thousands of times in
    a row: its retry delay stays capped at MAX_RETRY_DELAY_S (2 ** n past 1,023 does not
    fit a float), it stays queued, and the other models of the same pass are written."""
    api.add_deployment(NS, "demo", 1)
    api.add_deployment(NS, "other", 1)
    api.inject("PATCH", "/deployments/demo/scale", 500, times=10)
    now = [0.0]
    act = _actuator(api, Sleeps(), retries=0, monotonic=lambda: now[0])
    act._failures["demo"] = 5000  # about 40 hours of 30 s retries
    act.apply([_decision("demo", 3), _decision("other", 4)])
    assert act.status()["demo"].reason == ScaleReason.FAILED
    assert act.pending() == {"demo": 3}
    assert 0 < act._retry_at["demo"] <= MAX_RETRY_DELAY_S * 1.1
    assert api.replicas(NS, "other") == 4


def test_conflict_is_retried_after_rereading(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: a PATCH carrying a stale resourceVersion
    gets 409; the actuator re-reads and patches again."""
    api.add_deployment(NS, "demo", 2)
    api.inject("PATCH", "/deployments/demo/scale", 409, times=2)
    sleeps = Sleeps()
    act = _actuator(api, sleeps)
    act.apply([_decision("demo", 4)])
    assert api.replicas(NS, "demo") == 4
    assert api.count("GET", "/deployments/demo/scale") == 3  # read again after each 409
    # backoff doubles, with +-10 % jitter
    assert len(sleeps.calls) == 2
    assert 0.09 <= sleeps.calls[0] <= 0.11 and 0.18 <= sleeps.calls[1] <= 0.22


def test_real_conflict_from_a_concurrent_writer(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: the precondition really is the
    resourceVersion read (another writer in between -> 409)."""
    api.add_deployment(NS, "demo", 2)
    apps = k8s.AppsV1Api(api_client(api.url))
    scale = apps.read_namespaced_deployment_scale("demo", NS)
    api.add_deployment(NS, "demo", 3)  # someone else wrote it
    rv = scale.metadata.resource_version
    body = {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 9}}
    with pytest.raises(KubeCallError) as ei:
        call_with_retries(
            lambda: apps.patch_namespaced_deployment_scale(
                "demo", NS, body, _content_type="application/merge-patch+json"
            ),
            retries=0,
        )
    assert ei.value.status == 409
    assert api.replicas(NS, "demo") == 3


def test_5xx_and_timeouts_are_retried_with_backoff(api: FakeKubeAPI) -> None:
    """Fake of the published API contract, with injected 500/503 and a timeout."""
    api.add_deployment(NS, "demo", 1)
    api.inject("GET", "/deployments/demo/scale", 500)
    api.inject("PATCH", "/deployments/demo/scale", "timeout")
    api.inject("PATCH", "/deployments/demo/scale", 503)
    sleeps = Sleeps()
    act = _actuator(api, sleeps, request_timeout_s=INJECTED_TIMEOUT_S)
    act.apply([_decision("demo", 3)])
    assert api.replicas(NS, "demo") == 3
    assert act.status()["demo"].reason == ScaleReason.SCALED
    assert len(sleeps.calls) == 3


def test_persistent_failure_is_reported_not_raised(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    api.add_deployment(NS, "demo", 1)
    api.inject("PATCH", "/deployments/demo/scale", 500, times=100)
    sleeps = Sleeps()
    act = _actuator(api, sleeps, retries=2)
    act.apply([_decision("demo", 3)])
    st = act.status()["demo"]
    assert st.reason == ScaleReason.FAILED and "HTTP 500" in st.detail
    assert api.replicas(NS, "demo") == 1
    assert len(sleeps.calls) == 2


def test_a_demoted_leader_never_writes_what_it_still_had_queued(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract. The leader decides 7,
    the PATCH fails (503: the API server in trouble, when leases are lost too) and waits
    for its retry; the leadership goes; the new leader holds the Deployment at 1. The
    old leader's retry must not write 7 over it once the API answers again."""
    api.add_deployment(NS, "demo", 1)
    api.inject("PATCH", "/deployments/demo/scale", 503)
    now = [0.0]
    act = _actuator(api, Sleeps(), retries=0, monotonic=lambda: now[0])
    act.apply([_decision("demo", 7)])
    assert act.status()["demo"].reason == ScaleReason.FAILED
    assert act.pending() == {"demo": 7}  # queued for its retry; the API answers again
    now[0] += 100.0  # the retry is due
    assert act.stand_down() == 1
    assert act.pending() == {}
    act.run_pending()
    assert api.replicas(NS, "demo") == 1
    act.apply([_decision("demo", 3)])  # leader again: its new decisions are written
    assert api.replicas(NS, "demo") == 3


def test_missing_deployment_is_not_found(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    act = _actuator(api, Sleeps())
    act.apply([_decision("demo", 3)])
    st = act.status()["demo"]
    assert st.reason == ScaleReason.NOT_FOUND and "not found" in st.detail


def test_refuses_a_deployment_an_hpa_also_scales(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: autoscaling/v2 HPA list."""
    api.add_deployment(NS, "demo", 2)
    api.add_deployment(NS, "other", 2)
    api.add_hpa(NS, "keda-hpa-demo", "demo")
    api.add_hpa(NS, "web", "frontend")
    act = _actuator(api, Sleeps())
    act.apply([_decision("demo", 6), _decision("other", 4)])
    st = act.status()["demo"]
    assert st.reason == ScaleReason.HPA_CONFLICT
    assert "keda-hpa-demo" in st.detail
    assert api.replicas(NS, "demo") == 2  # untouched
    assert api.count("PATCH", "/deployments/demo/") == 0
    assert api.replicas(NS, "other") == 4  # an HPA on another Deployment is no conflict
    assert "HPA_CONFLICT" in st.describe()


def test_an_hpa_list_refused_is_not_asked_again_within_the_interval(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: a service account without `list` on HPAs
    gets 403 (the chart's rbac.hpaConflictCheck: false). The scale goes ahead, and the
    list is asked once per `hpa_check_interval_s`, not on every scale."""
    api.add_deployment(NS, "demo", 2)
    api.add_hpa(NS, "keda-hpa-demo", "demo")
    api.inject("GET", "/horizontalpodautoscalers", 403, times=100)
    clock = [0.0]
    act = _actuator(api, Sleeps(), monotonic=lambda: clock[0], hpa_check_interval_s=60.0)
    for n in (3, 4, 5):
        act.apply([_decision("demo", n)])
        clock[0] += 10.0
    assert api.replicas(NS, "demo") == 5
    assert api.count("GET", "/horizontalpodautoscalers") == 1
    clock[0] += 60.0
    act.apply([_decision("demo", 6)])
    assert api.count("GET", "/horizontalpodautoscalers") == 2


def test_without_the_hpa_check_no_hpa_is_listed(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: `--hpa-conflict-check off` never lists (and
    so cannot refuse; the operator took that on)."""
    api.add_deployment(NS, "demo", 2)
    api.add_hpa(NS, "keda-hpa-demo", "demo")
    act = _actuator(api, Sleeps(), hpa_check=False)
    act.apply([_decision("demo", 6)])
    assert api.count("GET", "/horizontalpodautoscalers") == 0
    assert api.replicas(NS, "demo") == 6


def test_background_worker_applies_without_blocking(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    from tests.service.harness import wait_until

    api.add_deployment(NS, "demo", 1)
    act = _actuator(api, Sleeps(), background=True)
    try:
        act.apply([_decision("demo", 7)])
        wait_until(lambda: api.replicas(NS, "demo") == 7, 10, "the worker to scale")
    finally:
        act.close()


# ---------------------------------------------------------------------- ConfigMap store
def _store(
    api: FakeKubeAPI, sleeps: Sleeps | None = None, timeout_s: float = REQUEST_TIMEOUT_S
) -> ConfigMapStore:
    return ConfigMapStore(
        k8s.CoreV1Api(api_client(api.url)),
        NS,
        "governor-targets",
        request_timeout_s=timeout_s,
        backoff_s=0.05,
        sleep=sleeps or Sleeps(),
    )


def test_configmap_targets_optimistic_concurrency(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: configmaps with resourceVersion."""
    store = _store(api)
    assert store.load_targets() is None
    doc = config_to_targets(make_config())
    rev = store.save_targets(doc, "")
    loaded = store.load_targets()
    assert loaded is not None and loaded.revision == rev and loaded.doc == doc
    cm = api.configmaps[(NS, "governor-targets")]
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llm-governor"
    with pytest.raises(ConflictError):
        store.save_targets(doc, "")  # create-only but it exists
    # an operator edits it (kubectl/Helm) between our read and our write
    text = cm["data"]["targets.yaml"]
    api.edit_configmap(NS, "governor-targets", {"targets.yaml": text, "helm-note": "x"})
    with pytest.raises(ConflictError):
        store.save_targets(doc, rev)
    new_rev = store.save_targets(doc, None)
    assert new_rev != rev
    assert api.configmaps[(NS, "governor-targets")]["data"]["helm-note"] == "x"  # kept


def test_configmap_write_race_gets_409(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract: a concurrent write
    between the store's GET and PUT makes the API server answer 409."""
    store = _store(api)
    rev = store.save_targets(config_to_targets(make_config()), "")
    api.inject("PUT", "/configmaps/governor-targets", 409)
    with pytest.raises(ConflictError):
        store.save_targets(config_to_targets(make_config()), rev)


def test_configmap_transient_errors_are_retried(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    sleeps = Sleeps()
    store = _store(api, sleeps, INJECTED_TIMEOUT_S)
    store.save_targets(config_to_targets(make_config()), "")
    api.inject("GET", "/configmaps/governor-targets", 500)
    api.inject("GET", "/configmaps/governor-targets", "timeout")
    assert store.load_targets() is not None
    assert len(sleeps.calls) == 2
    api.inject("GET", "/configmaps/governor-targets", 503, times=10)
    with pytest.raises(StoreError, match="HTTP 503"):
        store.load_targets()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("models: [", "not valid YAML"),
        ("- a\n- b", "must be a mapping"),
        ("models: []", "models"),
        ("models: [{name: x}]\nextra: 1", "extra: unknown key"),
    ],
)
def test_configmap_invalid_content_names_the_problem(
    api: FakeKubeAPI, text: str, problem: str
) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    store = _store(api)
    rev = api.edit_configmap(NS, "governor-targets", {"targets.yaml": text})
    with pytest.raises(TargetsInvalidError) as ei:
        store.load_targets()
    assert ei.value.revision == rev
    assert problem in str(ei.value)


def test_configmap_state_round_trip_and_conflict_retry(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    from service.store import StateDoc

    store = _store(api)
    assert store.load_state() is None
    store.save_state(StateDoc(saved_at_unix_s=1.0, leader="a"))
    api.inject("PUT", "/configmaps/governor-targets-state", 409)
    store.save_state(StateDoc(saved_at_unix_s=2.0, leader="a"))  # re-read and retry once
    got = store.load_state()
    assert got is not None and got.saved_at_unix_s == 2.0


# ---------------------------------------------------------------------- declarative targets
def _core(api: FakeKubeAPI, clock: FakeClock, **kw: Any) -> ServiceCore:
    return ServiceCore(
        make_config(model_entry("demo", namespace=NS)),
        kw.pop("source", FakeSource({"demo": 10.0})),
        _store(api),
        clock=clock,
        logger=quiet_logger(),
        **kw,
    )


def _targets(models: list[dict[str, Any]]) -> dict[str, str]:
    return {"targets.yaml": yaml.safe_dump({"models": models})}


def test_operator_edits_apply_within_one_tick_and_invalid_ones_are_refused(
    api: FakeKubeAPI,
) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    clock = FakeClock()
    core = _core(api, clock)
    assert (NS, "governor-targets") not in api.configmaps  # seeded once it runs:
    core.tick(clock.advance(5))
    assert (NS, "governor-targets") in api.configmaps  # from the config file
    # a valid edit, e.g. `kubectl edit configmap governor-targets`
    edited = model_entry("demo", namespace=NS, sla={"ttft_p95_ms": 700, "itl_p95_ms": 30})
    api.edit_configmap(NS, "governor-targets", _targets([edited]))
    core.tick(clock.advance(5))
    assert core.config.model("demo").sla.itl_p95_ms == 30
    assert core.targets_problem == ""
    # an invalid edit: refused, the last valid targets stay, the reason is reported
    bad = model_entry("demo", namespace=NS, sla={"ttft_p95_ms": 700, "itl_p95_ms": -4})
    api.edit_configmap(NS, "governor-targets", _targets([bad]))
    for _ in range(3):
        core.tick(clock.advance(5))
    assert core.config.model("demo").sla.itl_p95_ms == 30
    assert "itl_p95_ms" in core.targets_problem and "-4" in core.targets_problem
    assert core.counters.targets_refused == 1  # reported once, not every tick
    assert core.status().targets_problem == core.targets_problem
    # unparsable YAML is refused the same way
    api.edit_configmap(NS, "governor-targets", {"targets.yaml": "models: ["})
    core.tick(clock.advance(5))
    assert "not valid YAML" in core.targets_problem
    assert core.config.model("demo").sla.itl_p95_ms == 30
    # fixing it applies and clears the problem
    fixed = model_entry("demo", namespace=NS, sla={"ttft_p95_ms": 700, "itl_p95_ms": 25})
    api.edit_configmap(NS, "governor-targets", _targets([fixed]))
    core.tick(clock.advance(5))
    assert core.config.model("demo").sla.itl_p95_ms == 25
    assert core.targets_problem == ""


def test_restart_with_a_broken_configmap_keeps_the_last_valid_targets(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    clock = FakeClock()
    core = _core(api, clock)
    edited = model_entry("demo", namespace=NS, sla={"ttft_p95_ms": 700, "itl_p95_ms": 33})
    api.edit_configmap(NS, "governor-targets", _targets([edited]))
    core.tick(clock.advance(5))
    api.edit_configmap(NS, "governor-targets", {"targets.yaml": "models: 7"})
    restarted = _core(api, FakeClock(mono=10.0))
    assert restarted.config.model("demo").sla.itl_p95_ms == 33
    assert "models" in restarted.targets_problem


def test_admin_write_goes_through_the_configmap(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    clock = FakeClock()
    core = _core(api, clock)
    core.set_target(model_entry("demo", namespace=NS, sla={"ttft_p95_ms": 600, "itl_p95_ms": 20}))
    stored = yaml.safe_load(api.configmaps[(NS, "governor-targets")]["data"]["targets.yaml"])
    assert stored["models"][0]["sla"]["itl_p95_ms"] == 20
    # a concurrent operator edit makes a write with the old revision fail
    old = core.targets_revision
    api.edit_configmap(NS, "governor-targets", _targets([model_entry("demo", namespace=NS)]))
    with pytest.raises(AdminError) as ei:
        core.set_target(model_entry("demo", namespace=NS), expected_revision=old)
    assert ei.value.code.name == "ABORTED"


# ---------------------------------------------------------------------- Lease election
def _elector(api: FakeKubeAPI, identity: str, clock: FakeClock) -> LeaseElector:
    return LeaseElector(
        api_client(api.url),
        NS,
        "governor-leader",
        identity,
        monotonic=clock.monotonic,
        wall=clock.wall,
        request_timeout_s=REQUEST_TIMEOUT_S,
        logger=quiet_logger(),
    )


def test_lease_acquire_renew_and_failover_within_15s(api: FakeKubeAPI) -> None:
    """Fake of the published API contract: Lease create/renew with resourceVersion."""
    clock = FakeClock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    assert a.step() is True
    assert b.step() is False and b.leader_identity() == "a"
    first_rv = api.lease(NS, "governor-leader")["metadata"]["resourceVersion"]
    last_renew = clock.monotonic()
    for _ in range(5):  # a renews every 2 s, b keeps observing
        clock.advance(2)
        assert a.step() is True
        last_renew = clock.monotonic()
        assert b.step() is False
    assert api.lease(NS, "governor-leader")["metadata"]["resourceVersion"] != first_rv
    # a dies now; b keeps trying every 2 s
    took_over_at = None
    while clock.monotonic() - last_renew < 30:
        clock.advance(2)
        assert not (a.is_leader() and b.is_leader()), "two leaders"
        if b.step():
            took_over_at = clock.monotonic()
            break
    assert took_over_at is not None
    assert 10 <= took_over_at - last_renew <= 15
    lease = api.lease(NS, "governor-leader")["spec"]
    assert lease["holderIdentity"] == "b" and lease["leaseTransitions"] == 1
    assert a.is_leader() is False  # a stopped acting before b could take over
    # a comes back: it follows
    assert a.step() is False and a.leader_identity() == "b"


def test_leader_steps_down_when_it_cannot_renew(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    clock = FakeClock()
    a = _elector(api, "a", clock)
    assert a.step()
    api.inject("PUT", "/leases/governor-leader", 500, times=100)
    clock.advance(2)
    a.step()
    assert a.is_leader()  # within the renew deadline
    clock.advance(6)
    a.step()
    assert not a.is_leader()  # 8 s without a renewal > 7 s deadline < 10 s lease


def test_takeover_race_conflict_means_follower(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    clock = FakeClock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    a.step()
    b.step()
    clock.advance(12)  # a's lease expired from b's point of view
    api.inject("PUT", "/leases/governor-leader", 409)  # someone else won the race
    assert b.step() is False
    clock.advance(2)
    assert b.step() is True


def test_release_hands_over_at_the_next_step(api: FakeKubeAPI) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    clock = FakeClock()
    a, b = _elector(api, "a", clock), _elector(api, "b", clock)
    a.step()
    b.step()
    a.stop(release=True)
    assert not a.is_leader()
    clock.advance(2)
    assert b.step() is True  # no 10 s wait


# ---------------------------------------------------------------------- HA service
def test_follower_serves_the_leaders_decisions_and_takes_over_with_its_memory(
    api: FakeKubeAPI,
) -> None:
    """Against FakeKubeAPI, a fake of the published API contract."""
    clock = FakeClock()
    source = FakeSource({"demo": 120.0})
    cfg_policy = {"scale_down_stabilization_s": 120, "cooldown_after_scale_up_s": 0}
    cfg = make_config(model_entry("demo", namespace=NS), **cfg_policy)

    def core(identity: str) -> ServiceCore:
        return ServiceCore(
            cfg,
            source,
            _store(api),
            clock=clock,
            elector=_elector(api, identity, clock),
            logger=quiet_logger(),
        )

    leader, follower = core("a"), core("b")
    for _ in range(10):
        clock.advance(5)
        leader.elector.step()  # type: ignore[attr-defined]
        follower.elector.step()  # type: ignore[attr-defined]
        leader.tick(clock.monotonic())
        follower.tick(clock.monotonic())
    lp, fp = leader.board.get("demo"), follower.board.get("demo")
    assert lp.replicas is not None and lp.replicas >= 5
    assert (fp.replicas, fp.knobs, fp.generation) == (lp.replicas, lp.knobs, lp.generation)
    assert fp.origin == "leader"
    assert follower.loop.snapshot().at_s is None  # the follower did not decide itself
    high = lp.replicas
    # the leader dies; load drops; the follower takes over within 15 s
    source.set("demo", 1.0)
    died = clock.monotonic()
    while not follower.elector.is_leader():
        clock.advance(2)
        follower.elector.step()  # type: ignore[attr-defined]
        follower.tick(clock.monotonic())
        assert clock.monotonic() - died <= 15
    for _ in range(5):
        clock.advance(5)
        follower.elector.step()  # type: ignore[attr-defined]
        follower.tick(clock.monotonic())
        assert follower.board.get("demo").replicas == high  # the window continues
    assert follower.board.get("demo").generation >= lp.generation


class _Toggle:
    """An elector whose leadership the test sets (the Lease itself is tested above)."""

    identity = "a"

    def __init__(self) -> None:
        self.leader = True

    def is_leader(self) -> bool:
        return self.leader

    def leader_identity(self) -> str:
        return self.identity if self.leader else "b"

    def start(self) -> None:
        return None

    def stop(self, release: bool = True) -> None:
        return None


class _Queued:
    """An actuator that records what the core tells it."""

    def __init__(self) -> None:
        self.applied = 0
        self.stood_down = 0

    def apply(self, decisions: Any) -> None:
        self.applied += 1

    def stand_down(self) -> int:
        self.stood_down += 1
        return 2


def test_losing_the_lease_makes_every_actuator_stand_down() -> None:
    """The tick that finds this instance no longer the leader tells each actuator to
    drop what it still meant to write (once, on the change), and applies nothing."""
    clock, elector, act = FakeClock(), _Toggle(), _Queued()
    core = ServiceCore(
        make_config(model_entry("demo")),
        FakeSource({"demo": 30.0}),
        MemoryStore(),
        actuators=[act],
        clock=clock,
        elector=elector,  # type: ignore[arg-type]
        logger=quiet_logger(),
    )
    core.tick(clock.monotonic())
    assert (act.applied, act.stood_down) == (1, 0)
    elector.leader = False
    for _ in range(3):
        clock.advance(5)
        core.tick(clock.monotonic())
    assert (act.applied, act.stood_down) == (1, 1)
