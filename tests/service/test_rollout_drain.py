"""Knob roll-outs and drain-aware scale-in against the fake Kubernetes API server
(tests/service/fake_kube.py: no API server can run here; the fake follows the published
contract, including the ReplicaSet's pod-deletion-cost order) with the real client.
Clocks are injected; nothing sleeps."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from actuators.drain import (
    DELETION_COST,
    DrainBeforeScaleDown,
    PodDrainer,
    prometheus_running_by_pod,
)
from actuators.kubeapi import api_client
from actuators.kubernetes import KubernetesScaleActuator
from actuators.rollout import (
    ROLLOUT_ANNOTATION,
    WAITING_SECONDS,
    KnobRolloutActuator,
    RolloutReason,
)
from controller.types import Decision, Knobs, Reason
from tests.service.fake_kube import FakeKubeAPI
from tests.service.fakes import quiet_logger
from tests.service.harness import wait_until

NS = "llm"
REQUEST_TIMEOUT_S = 30.0  # the fake answers in ms; generous for a loaded machine
HOLD_WAIT_S = 10.0
"""The longest a test waits for a worker thread to reach a point, seconds (a bound on
a failure, never a timing assumption: each wait ends as soon as its event happens)."""
K1, K2, K3 = Knobs(64, 4096), Knobs(128, 8192), Knobs(32, 2048)


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(timeout_delay_s=0.6) as fake:
        fake.add_deployment(NS, "demo", 4)
        yield fake


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _decision(
    knobs: Knobs,
    *,
    rollout: bool = True,
    panic: bool = False,
    replicas: int = 4,
    raw: float | None = 2.0,
) -> Decision:
    """A decision for "demo"; `raw`: the replicas its load needs (None: none computed)."""
    return Decision(
        "demo",
        0.0,
        True,
        replicas,
        knobs,
        (),
        Reason.KNOBS_CHANGED,
        raw_replicas=raw,
        panic=panic,
        rollout=rollout,
    )


def _rollouts(
    api: FakeKubeAPI, clock: Clock, interval_s: float = 600.0, wall: Clock | None = None
) -> KnobRolloutActuator:
    return KnobRolloutActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo")},
        lambda model: interval_s,
        background=False,
        sleep=lambda s: None,
        monotonic=clock,
        wall=wall or Clock(),
        request_timeout_s=REQUEST_TIMEOUT_S,
        backoff_s=0.01,
    )


def _reason(act: KnobRolloutActuator) -> RolloutReason:
    return act.status()["demo"].reason


# ---------------------------------------------------------------------- roll-outs
def test_a_rollout_patches_the_template_and_never_overlaps_another(api: FakeKubeAPI) -> None:
    clock = Clock()
    act = _rollouts(api, clock, interval_s=0.0)
    act.apply([_decision(K1)])
    assert _reason(act) == RolloutReason.STARTED
    assert api.template_annotations(NS, "demo") == {ROLLOUT_ANNOTATION: "seqs=64,tokens=4096"}
    assert api.rollout_in_progress(NS, "demo")
    # a second knob change while ours is rolling out waits, and keeps waiting each tick
    act.apply([_decision(K2)])
    act.apply([_decision(K2, rollout=False)])
    assert _reason(act) == RolloutReason.WAITING_ROLLOUT
    assert api.template_annotations(NS, "demo")[ROLLOUT_ANNOTATION] == "seqs=64,tokens=4096"
    assert act.pending() == {"demo": K2}
    api.finish_rollout(NS, "demo")
    act.apply([_decision(K2, rollout=False)])  # the next tick starts the waiting one
    assert _reason(act) == RolloutReason.STARTED and act.pending() == {}
    assert api.template_annotations(NS, "demo")[ROLLOUT_ANNOTATION] == "seqs=128,tokens=8192"
    assert api.count("PATCH", "/deployments/demo") == 2
    assert api.count("PATCH", "/scale") == 0  # never touches replicas (KEDA mode too)


def test_someone_elses_rollout_in_progress_is_waited_for(api: FakeKubeAPI) -> None:
    api.start_rollout(NS, "demo")  # e.g. kubectl rollout restart, or a new image
    act = _rollouts(api, Clock())
    act.apply([_decision(K1)])
    assert _reason(act) == RolloutReason.WAITING_ROLLOUT
    assert api.count("PATCH", "/deployments/demo") == 0


def test_a_scale_ups_pods_still_starting_hold_the_rollout(api: FakeKubeAPI) -> None:
    """kubectl rollout status's last test: updated replicas that are not all available
    (a fresh scale-up's pods still loading the model) are a roll-out in progress; a
    template patch now would replace pods minutes from serving."""
    api.scale_to(NS, "demo", 8)
    api.finish_rollout(NS, "demo")  # every pod of the current template, 4 not ready yet
    api.set_available(NS, "demo", 4)
    act = _rollouts(api, Clock())
    act.apply([_decision(K1)])
    assert _reason(act) == RolloutReason.WAITING_ROLLOUT
    assert api.count("PATCH", "/deployments/demo") == 0
    api.set_available(NS, "demo", None)
    act.apply([_decision(K1, rollout=False)])
    assert _reason(act) == RolloutReason.STARTED


def test_rollouts_are_rate_limited_per_model(api: FakeKubeAPI) -> None:
    clock = Clock()
    act = _rollouts(api, clock, interval_s=600.0)
    act.apply([_decision(K1)])
    api.finish_rollout(NS, "demo")
    clock.t += 599.0
    act.apply([_decision(K2)])
    st = act.status()["demo"]
    assert st.reason == RolloutReason.RATE_LIMITED and "at most one per 600 s" in st.detail
    clock.t += 1.0
    act.apply([_decision(K2, rollout=False)])
    assert _reason(act) == RolloutReason.STARTED


def test_never_during_panic(api: FakeKubeAPI) -> None:
    act = _rollouts(api, Clock())
    act.apply([_decision(K1, panic=True)])
    assert _reason(act) == RolloutReason.WAITING_PANIC
    assert api.template_annotations(NS, "demo") == {}
    act.apply([_decision(K1, rollout=False, panic=True)])
    assert _reason(act) == RolloutReason.WAITING_PANIC
    act.apply([_decision(K1, rollout=False, panic=False)])
    assert _reason(act) == RolloutReason.STARTED


ROLLING_NO_SURGE = {
    "type": "RollingUpdate",
    "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
}  # the chart's example engine: no surge pod that may not fit on the GPUs


def test_a_rollout_that_would_leave_too_few_ready_waits_for_room(api: FakeKubeAPI) -> None:
    """maxSurge 0, maxUnavailable 1 on one replica: the roll-out would stop the only
    replica for a whole cold start while it serves load. It waits (nothing patched)
    until a second replica makes room, then starts."""
    api.set_strategy(NS, "demo", ROLLING_NO_SURGE)
    api.scale_to(NS, "demo", 1)
    act = _rollouts(api, Clock())
    act.apply([_decision(K1, replicas=1, raw=0.4)])
    st = act.status()["demo"]
    assert st.reason == RolloutReason.WAITING_CAPACITY
    assert st.detail == (
        "its strategy takes 1 of 1 replicas down at a time, leaving 0 ready; the load needs 0.40"
    )
    assert act.pending() == {"demo": K1} and api.count("PATCH", "/deployments/demo") == 0
    api.scale_to(NS, "demo", 2)  # the load rose: a second replica, now ready
    api.finish_rollout(NS, "demo")
    act.apply([_decision(K1, rollout=False, replicas=2, raw=1.0)])
    assert _reason(act) == RolloutReason.STARTED  # one of two down leaves the 1.0 needed
    assert api.template_annotations(NS, "demo")[ROLLOUT_ANNOTATION] == "seqs=64,tokens=4096"


def test_a_waiting_rollout_exports_how_long_it_has_waited(api: FakeKubeAPI) -> None:
    """/metrics carries `governor_knob_rollout_waiting_seconds{model, reason}` while a
    roll-out waits (from its first wait, on the wall clock), and no series once it
    starts: an alert on it catches a roll-out that never gets its room."""
    api.set_strategy(NS, "demo", ROLLING_NO_SURGE)
    api.scale_to(NS, "demo", 1)
    wall, registry = Clock(), CollectorRegistry()
    act = _rollouts(api, Clock(), interval_s=0.0, wall=wall)
    act.register_metrics(registry)
    labels = {"model": "demo", "reason": "ROLLOUT_WAITING_CAPACITY"}
    assert registry.get_sample_value(WAITING_SECONDS, labels) is None
    act.apply([_decision(K1, replicas=1, raw=0.4)])
    wall.t += 90.0
    act.apply([_decision(K1, rollout=False, replicas=1, raw=0.5)])
    assert registry.get_sample_value(WAITING_SECONDS, labels) == 90.0
    wall.t += 30.0  # a scrape between ticks reads the time up to now
    assert registry.get_sample_value(WAITING_SECONDS, labels) == 120.0
    api.scale_to(NS, "demo", 2)
    api.finish_rollout(NS, "demo")
    act.apply([_decision(K1, rollout=False, replicas=2, raw=1.0)])
    assert _reason(act) == RolloutReason.STARTED
    assert registry.get_sample_value(WAITING_SECONDS, labels) is None
    assert "# HELP " + WAITING_SECONDS in generate_latest(registry).decode()
    # a waiting request dropped (leadership lost) waits no more
    api.finish_rollout(NS, "demo")
    api.scale_to(NS, "demo", 1)
    act.apply([_decision(K2, replicas=1, raw=0.4)])
    assert _reason(act) == RolloutReason.WAITING_CAPACITY
    assert registry.get_sample_value(WAITING_SECONDS, labels) == 0.0
    act.stand_down()
    assert registry.get_sample_value(WAITING_SECONDS, labels) is None
    wall.t += 50.0
    act.apply([_decision(K3, replicas=1, raw=0.4)])  # leading again: a new request
    assert registry.get_sample_value(WAITING_SECONDS, labels) == 0.0


def test_a_request_that_replaces_one_that_started_waits_from_its_own_first_wait(
    api: FakeKubeAPI,
) -> None:
    """A newer knob change lands while the worker's try of a waiting request starts it
    (the newest wins, the race `run_pending` allows): the newer request's wait counts
    from its own first wait, not from the started one's."""
    api.set_strategy(NS, "demo", ROLLING_NO_SURGE)
    api.scale_to(NS, "demo", 1)
    wall, registry = Clock(), CollectorRegistry()
    act = _rollouts(api, Clock(), interval_s=0.0, wall=wall)
    act.register_metrics(registry)
    act.apply([_decision(K1, replicas=1, raw=0.4)])  # waits from wall 100
    api.scale_to(NS, "demo", 2)
    api.finish_rollout(NS, "demo")
    wall.t += 60.0
    try_once = act._try

    def newer_lands_during_the_try(*args: Any, **kw: Any) -> Any:
        out = try_once(*args, **kw)
        act._pending["demo"] = K2  # an apply on the loop's thread, mid-run
        return out

    act._try = newer_lands_during_the_try  # type: ignore[method-assign]
    act.run_pending()
    act._try = try_once  # type: ignore[method-assign]
    assert _reason(act) == RolloutReason.STARTED and act.pending() == {"demo": K2}
    wall.t += 10.0
    act.run_pending()  # K1 still rolling out: K2 waits from now
    assert _reason(act) == RolloutReason.WAITING_ROLLOUT
    wall.t += 5.0
    labels = {"model": "demo", "reason": "ROLLOUT_WAITING_IN_PROGRESS"}
    assert registry.get_sample_value(WAITING_SECONDS, labels) == 5.0


@pytest.mark.parametrize(
    ("strategy", "replicas", "raw", "starts"),
    [
        (None, 4, 3.0, True),  # the API's default 25 %/25 %: 1 of 4 down, 3 stay
        (None, 4, 3.2, False),
        (None, 3, 2.9, True),  # 25 % of 3 rounds down to 0 and maxSurge up to 1: a surge
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            1,
            3.0,
            True,
        ),  # a surge never serves with fewer than it has, even short of the need
        (
            {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "50%", "maxUnavailable": "50%"},
            },
            4,
            2.5,
            False,
        ),
        (
            {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "25%"}},
            3,
            2.5,
            False,
        ),  # both fenceposts come to 0 for 3 replicas: Kubernetes takes 1 down
        ({"type": "Recreate"}, 2, 0.5, False),  # every replica down at once
        ({"type": "Recreate"}, 2, 0.0, True),  # an idle fleet may restart whole
        (ROLLING_NO_SURGE, 1, None, False),  # no raw count: the decision's replicas (1)
    ],
)
def test_the_replicas_a_strategy_keeps_ready_must_serve_the_load(
    api: FakeKubeAPI,
    strategy: dict[str, Any] | None,
    replicas: int,
    raw: float | None,
    starts: bool,
) -> None:
    if strategy is not None:
        api.set_strategy(NS, "demo", strategy)
    api.scale_to(NS, "demo", replicas)
    api.finish_rollout(NS, "demo")
    act = _rollouts(api, Clock())
    act.apply([_decision(K1, replicas=replicas, raw=raw)])
    want = RolloutReason.STARTED if starts else RolloutReason.WAITING_CAPACITY
    assert _reason(act) == want
    assert api.count("PATCH", "/deployments/demo") == (1 if starts else 0)


def test_a_strategy_that_cannot_be_read_holds_the_rollout_and_says_why(api: FakeKubeAPI) -> None:
    api.set_strategy(
        NS, "demo", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "one"}}
    )
    act = _rollouts(api, Clock())
    act.apply([_decision(K1)])
    st = act.status()["demo"]
    assert st.reason == RolloutReason.WAITING_CAPACITY
    assert "maxUnavailable must be a count or a percentage, got 'one'" in st.detail
    assert api.count("PATCH", "/deployments/demo") == 0


def test_conflicts_are_retried_then_kept_for_the_next_tick(api: FakeKubeAPI) -> None:
    act = _rollouts(api, Clock())
    api.inject("PATCH", "/deployments/demo", 409, times=1)
    act.apply([_decision(K1)])
    assert _reason(act) == RolloutReason.STARTED  # re-read and retried under the new rv
    api.finish_rollout(NS, "demo")
    act2 = _rollouts(api, Clock())
    api.inject("PATCH", "/deployments/demo", 409, times=10)
    act2.apply([_decision(K3)])
    assert _reason(act2) == RolloutReason.FAILED and act2.pending() == {"demo": K3}
    api.faults.clear()
    act2.apply([_decision(K3, rollout=False)])
    assert _reason(act2) == RolloutReason.STARTED
    assert api.template_annotations(NS, "demo")[ROLLOUT_ANNOTATION] == "seqs=32,tokens=2048"


def test_same_knobs_are_not_rolled_out_twice(api: FakeKubeAPI) -> None:
    act = _rollouts(api, Clock(), interval_s=0.0)
    act.apply([_decision(K1)])
    api.finish_rollout(NS, "demo")
    act.apply([_decision(K1)])
    assert _reason(act) == RolloutReason.UNCHANGED
    assert api.count("PATCH", "/deployments/demo") == 1


def test_a_request_made_during_a_run_is_picked_up_at_once(api: FakeKubeAPI) -> None:
    """The worker thread (production mode) is in the middle of a run, its read of demo's
    Deployment held by the API; meanwhile a decision asks to roll out `other`. That
    request must be looked at as soon as the run ends, not at the next decision (a whole
    tick later): the test makes no further `apply`, so a lost wake-up never rolls it out."""
    api.add_deployment(NS, "other", 2)
    held = api.hold("GET", "/deployments/demo")
    act = KnobRolloutActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo"), "other": (NS, "other")},
        lambda model: 0.0,
        sleep=lambda s: None,
        monotonic=Clock(),
        request_timeout_s=REQUEST_TIMEOUT_S,
    )
    try:
        act.apply([_decision(K1)])
        assert held.arrived.wait(HOLD_WAIT_S), "the worker never read demo's Deployment"
        other = Decision("other", 0.0, True, 2, K2, (), Reason.KNOBS_CHANGED, rollout=True)
        act.apply([other])  # during the run
        held.release.set()
        wait_until(lambda: "other" in act.status(), HOLD_WAIT_S, "other's roll-out")
        assert act.status()["demo"].reason == RolloutReason.STARTED
        assert act.status()["other"].reason == RolloutReason.STARTED
        assert api.template_annotations(NS, "other")[ROLLOUT_ANNOTATION] == "seqs=128,tokens=8192"
    finally:
        act.close()


# ---------------------------------------------------------------------- drain
class FakeProm:
    """A Prometheus client double answering the per-pod query (the query's text is
    checked; its evaluation by a real server is covered in tests/integration)."""

    def __init__(self, running: dict[str, float] | None) -> None:
        self.running, self.queries = running, []

    def custom_query(self, query: str, params: Any = None) -> Any:
        self.queries.append(query)
        if self.running is None:
            raise ConnectionError("prometheus down")
        return [{"metric": {"pod": p}, "value": [0, str(v)]} for p, v in self.running.items()]


def _scaler(api: FakeKubeAPI, prom: FakeProm | None) -> KubernetesScaleActuator:
    from kubernetes import client as k8s

    kube = api_client(api.url)
    drain = None
    if prom is not None:
        drainer = PodDrainer(
            k8s.CoreV1Api(kube), k8s.AppsV1Api(kube), prometheus_running_by_pod(prom)
        )
        drain = drainer.prepare
    return KubernetesScaleActuator(
        kube,
        lambda: {"demo": (NS, "demo")},
        background=False,
        sleep=lambda s: None,
        request_timeout_s=REQUEST_TIMEOUT_S,
        logger=quiet_logger(),
        drain=drain,
    )


def _scale_down(api: FakeKubeAPI, prom: FakeProm | None) -> KubernetesScaleActuator:
    act = _scaler(api, prom)
    act.apply([_decision(K1, rollout=False, replicas=2)])
    return act


def test_scale_down_removes_the_pods_with_the_fewest_running_requests(api: FakeKubeAPI) -> None:
    assert api.pods_of(NS, "demo") == ["demo-1", "demo-2", "demo-3", "demo-4"]
    prom = FakeProm({"demo-1": 5, "demo-2": 0, "demo-3": 2, "demo-4": 7})
    act = _scale_down(api, prom)
    assert sorted(api.deleted_pods) == ["demo-2", "demo-3"]
    assert api.pods_of(NS, "demo") == ["demo-1", "demo-4"]
    assert len(prom.queries) == 1 and "sum by (pod)" in prom.queries[0]
    assert 'model_name="demo",namespace="llm"' in prom.queries[0]
    assert "demo-2=0, demo-3=2" in act.status()["demo"].detail


def test_without_drain_the_replicaset_removes_the_newest(api: FakeKubeAPI) -> None:
    _scale_down(api, None)
    assert sorted(api.deleted_pods) == ["demo-3", "demo-4"]  # long generations included


def test_no_prometheus_data_writes_no_cost_and_still_scales(api: FakeKubeAPI) -> None:
    act = _scale_down(api, FakeProm(None))
    assert api.replicas(NS, "demo") == 2
    assert all(DELETION_COST not in p["metadata"]["annotations"] for p in api.pods.values())
    assert "default pod order" in act.status()["demo"].detail


def test_a_scale_up_sets_no_deletion_cost(api: FakeKubeAPI) -> None:
    prom = FakeProm({"demo-1": 5})
    act = _scaler(api, prom)
    act.apply([_decision(K1, rollout=False, replicas=6)])
    assert api.replicas(NS, "demo") == 6 and prom.queries == []


def test_keda_mode_sets_costs_when_a_decision_lowers_replicas(api: FakeKubeAPI) -> None:
    """KEDA's HPA scales; the governor only prepares the pods when its decision drops."""
    from kubernetes import client as k8s

    from actuators.drain import DrainBeforeScaleDown

    kube = api_client(api.url)
    prom = FakeProm({"demo-1": 5, "demo-2": 0, "demo-3": 2, "demo-4": 7})
    drainer = PodDrainer(k8s.CoreV1Api(kube), k8s.AppsV1Api(kube), prometheus_running_by_pod(prom))
    act = DrainBeforeScaleDown(drainer.prepare, lambda: {"demo": (NS, "demo")}, background=False)
    act.apply([_decision(K1, rollout=False, replicas=4)])
    act.apply([_decision(K1, rollout=False, replicas=5)])
    assert prom.queries == []  # first decision and a raise: nothing to prepare
    act.apply([_decision(K1, rollout=False, replicas=2)])
    assert len(prom.queries) == 1
    costs = {n: p["metadata"]["annotations"][DELETION_COST] for (_, n), p in api.pods.items()}
    assert costs == {"demo-1": "5", "demo-2": "0", "demo-3": "2", "demo-4": "7"}
    assert "demo-2=0" in act.status()["demo"]
    api.scale_to(NS, "demo", 2)  # what KEDA's HPA does next
    assert sorted(api.deleted_pods) == ["demo-2", "demo-3"]


class Overlaps:
    """Wraps a drain; records each call's model and, per model, the most drains of it
    running at once."""

    def __init__(self, drain: Callable[[str, str, str], str]) -> None:
        self.drain = drain
        self.calls: list[str] = []
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, model: str, namespace: str, deployment: str) -> str:
        with self._lock:
            self.calls.append(model)
            self.running[model] = self.running.get(model, 0) + 1
            self.most[model] = max(self.most.get(model, 0), self.running[model])
        try:
            return self.drain(model, namespace, deployment)
        finally:
            with self._lock:
                self.running[model] -= 1


def _keda_drainer(
    api: FakeKubeAPI, prom: FakeProm, targets: dict[str, tuple[str, str]]
) -> tuple[DrainBeforeScaleDown, Overlaps]:
    """The KEDA-mode drainer over the fake API and `prom`'s running requests, its drains
    counted (`Overlaps`)."""
    from kubernetes import client as k8s

    kube = api_client(api.url)
    drainer = PodDrainer(
        k8s.CoreV1Api(kube),
        k8s.AppsV1Api(kube),
        prometheus_running_by_pod(prom),
        request_timeout_s=REQUEST_TIMEOUT_S,
    )
    drain = Overlaps(drainer.prepare)
    return DrainBeforeScaleDown(drain, lambda: targets), drain


def test_keda_mode_drains_a_model_once_at_a_time_and_coalesces_requests(
    api: FakeKubeAPI,
) -> None:
    """A slow API (the drain's read of the Deployment held) and two more lowering
    decisions for the model meanwhile: no second drain of it starts while the first
    runs; the two requests are coalesced into one (the newest target, 1 replica, wins),
    which runs when the first ends and reads the running requests of then. Another
    model is not held up by it."""
    api.add_deployment(NS, "other", 2)
    prom = FakeProm({"demo-1": 5, "demo-2": 0, "demo-3": 2, "demo-4": 7})
    act, drain = _keda_drainer(api, prom, {"demo": (NS, "demo"), "other": (NS, "other")})

    def lower(model: str, replicas: int) -> None:
        act.apply([Decision(model, 0.0, True, replicas, K1, (), Reason.KNOBS_STATIC)])

    lower("demo", 4)
    lower("other", 2)
    held = api.hold("GET", "/deployments/demo")
    lower("demo", 3)
    assert held.arrived.wait(HOLD_WAIT_S), "the first drain never read the Deployment"
    prom.running = {"demo-1": 0, "demo-2": 9, "demo-3": 8, "demo-4": 7, "other-1": 1}
    lower("demo", 2)
    lower("demo", 1)
    lower("other", 1)  # another model: drained at once, beside the held one
    wait_until(lambda: "other" in act.status(), HOLD_WAIT_S, "other's drain")
    assert drain.calls.count("demo") == 1 and act.pending() == {"demo": 1}
    held.release.set()
    wait_until(lambda: "demo-1=0" in act.status().get("demo", ""), HOLD_WAIT_S, "2nd drain")
    assert drain.calls.count("demo") == 2 and drain.most == {"demo": 1, "other": 1}
    assert act.pending() == {} and api.count("GET", "/deployments/demo") == 2
    assert _costs(api) == {
        "demo-1": "0", "demo-2": "9", "demo-3": "8", "demo-4": "7", "other-1": "1", "other-2": "0"
    }  # fmt: skip


def test_keda_mode_stand_down_and_close_start_no_drain_after_them(api: FakeKubeAPI) -> None:
    """Found in review: the KEDA-mode drainer had no stand_down or close, so a drain
    requested while another of the model ran (coalesced) still started after the
    instance lost the leadership or closed (ServiceCore.close releases the lease after
    closing the actuators). stand_down drops it; close waits for the drain in hand and
    starts none after."""
    prom = FakeProm({"demo-1": 5, "demo-2": 0, "demo-3": 2, "demo-4": 7})
    act, drain = _keda_drainer(api, prom, {"demo": (NS, "demo")})

    def lower(replicas: int) -> None:
        act.apply([Decision("demo", 0.0, True, replicas, K1, (), Reason.KNOBS_STATIC)])

    lower(4)
    held = api.hold("GET", "/deployments/demo")
    lower(3)
    assert held.arrived.wait(HOLD_WAIT_S), "the drain never read the Deployment"
    lower(2)  # coalesced behind the drain in hand
    assert act.pending() == {"demo": 2}
    assert act.stand_down() == 1 and act.pending() == {}
    lower(1)  # a leader's decision again: coalesced anew
    assert act.forget("demo") and not act.forget("demo")  # paused: dropped too
    held.release.set()
    act.close(timeout_s=HOLD_WAIT_S)  # waits for the drain in hand
    assert "demo" in act.status() and act.pending() == {}
    lower(3)
    lower(2)  # after close: no drain starts
    assert drain.calls.count("demo") == 1 and api.count("GET", "/deployments/demo") == 1


def _run_args(**over: str) -> argparse.Namespace:
    """`governor run`'s arguments that `_kube_actuators` reads: roll-outs on, `over`."""
    kw: dict[str, Any] = {
        "knob_rollouts": "on",
        "simulated_fleet": None,
        "hpa_conflict_check": "off",
        **over,
    }
    return argparse.Namespace(**kw)


def test_governor_run_wires_the_engine_actuators_and_status_shows_each(api: FakeKubeAPI) -> None:
    from actuators.drain import DrainBeforeScaleDown
    from service.core import ServiceCore
    from service.run import _kube_actuators, register_actuator_metrics
    from service.store import MemoryStore
    from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry

    cfg = make_config(model_entry("demo", namespace=NS))
    args = _run_args(scale_via="kubernetes", drain_scale_in="on")
    core_ref: list[ServiceCore] = []
    acts = _kube_actuators(args, api_client(api.url), cfg, core_ref)
    try:
        assert [type(a).__name__ for a in acts] == [
            "KubernetesScaleActuator",
            "KnobRolloutActuator",
        ]
        assert acts[0].drain is not None
        assert acts[0].hpa_check is False  # --hpa-conflict-check off
        args.scale_via = "keda"
        keda = _kube_actuators(args, api_client(api.url), cfg, core_ref)
        assert isinstance(keda[0], DrainBeforeScaleDown)
        keda[1].close()
        args.knob_rollouts = args.drain_scale_in = "off"
        assert _kube_actuators(args, None, cfg, core_ref) == []
        # status: every actuator's outcome for the model, joined
        drain = DrainBeforeScaleDown(lambda m, ns, d: "drain: ok", lambda: {"demo": (NS, "demo")})
        drain.background = False
        core = ServiceCore(
            cfg, FakeSource({"demo": 10.0}), MemoryStore(), clock=FakeClock(),
            actuators=[acts[1], drain], logger=quiet_logger(),
        )  # fmt: skip
        core_ref.append(core)
        register_actuator_metrics(core.metrics.registry, [acts[1], drain])
        assert "# HELP " + WAITING_SECONDS in generate_latest(core.metrics.registry).decode()
        drain.apply([_decision(K1, rollout=False, replicas=4)])
        drain.apply([_decision(K1, rollout=False, replicas=3)])
        acts[1].apply([_decision(K1)])
        wait_until(lambda: "demo" in acts[1].status())  # the roll-out worker thread
        line = core.status(["demo"]).models[0].actuation
        assert "ROLLOUT_STARTED" in line and "drain: ok" in line
    finally:
        for a in acts:
            a.close()


@pytest.mark.parametrize("live", [False, True])
def test_a_take_over_rolls_out_no_engines_that_follow_knobs_live(live: bool) -> None:
    """`governor run`'s roll-out threshold for a new leader's catch-up (`worth`): a big
    change is worth a restart, unless the model's engines follow knobs live."""
    from service.core import ServiceCore
    from service.run import _kube_actuators
    from service.store import MemoryStore
    from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry

    cfg = make_config(model_entry("demo", namespace=NS, policy={"knobs_live": live}))
    args = _run_args(scale_via="keda", drain_scale_in="off")
    core_ref: list[ServiceCore] = []
    (act,) = _kube_actuators(args, None, cfg, core_ref)
    try:
        core = ServiceCore(
            cfg, FakeSource({"demo": 10.0}), MemoryStore(), clock=FakeClock(),
            actuators=[], logger=quiet_logger(),
        )  # fmt: skip
        core_ref.append(core)
        assert act.worth is not None
        assert act.worth("demo", K2, K1) is not live  # 64 -> 128 seqs: +100 %
        assert not act.worth("demo", K1, K1)
    finally:
        act.close()


def test_a_new_leader_rolls_out_what_its_predecessor_left_pending(api: FakeKubeAPI) -> None:
    """The old leader rolled out K1 then decided K2 (worth a restart) and died before
    applying it; the new leader's actuator compares the template with its first decision."""
    old = _rollouts(api, Clock(), interval_s=0.0)
    old.apply([_decision(K1)])
    api.finish_rollout(NS, "demo")

    def worth(model: str, decided: Knobs, annotated: Knobs) -> bool:
        return decided.differs_by(annotated, 0.25)

    def new_leader() -> KnobRolloutActuator:
        act = _rollouts(api, Clock())
        act.worth = worth
        return act

    same = new_leader()
    same.apply([_decision(Knobs(70, 4096), rollout=False)])  # +9 %: not worth a restart
    assert _reason(same) == RolloutReason.UNCHANGED
    assert "seqs=64,tokens=4096" in same.status()["demo"].detail
    taker = new_leader()
    taker.apply([_decision(K2, rollout=False)])
    assert _reason(taker) == RolloutReason.STARTED
    assert api.template_annotations(NS, "demo")[ROLLOUT_ANNOTATION] == "seqs=128,tokens=8192"
    taker.apply([_decision(K3, rollout=False)])  # only the first decision is checked
    assert taker.pending() == {}
    assert api.count("PATCH", "/deployments/demo") == 2


def test_a_leader_that_leads_again_catches_up_the_rollout_it_dropped(api: FakeKubeAPI) -> None:
    """K2 (worth a restart) waits out a panic; the lease is lost, which drops it; the
    lease comes back and the decisions keep K2 without a new roll-out flag. The
    take-over check must run again and roll K2 out."""
    act = _rollouts(api, Clock(), interval_s=0.0)
    act.worth = lambda model, decided, annotated: decided.differs_by(annotated, 0.25)
    act.apply([_decision(K1)])
    api.finish_rollout(NS, "demo")
    act.apply([_decision(K2, panic=True)])
    assert _reason(act) == RolloutReason.WAITING_PANIC
    assert act.stand_down() == 1
    act.apply([_decision(K2, rollout=False)])  # leader again
    assert _reason(act) == RolloutReason.STARTED and act.pending() == {}
    assert api.template_annotations(NS, "demo")[ROLLOUT_ANNOTATION] == "seqs=128,tokens=8192"


def _drainer(api: FakeKubeAPI, running: dict[str, float] | None) -> PodDrainer:
    from kubernetes import client as k8s

    kube = api_client(api.url)
    prom = prometheus_running_by_pod(FakeProm(running))
    return PodDrainer(k8s.CoreV1Api(kube), k8s.AppsV1Api(kube), prom)


def _costs(api: FakeKubeAPI) -> dict[str, str]:
    """Every pod's deletion cost annotation in the fake cluster, by pod name."""
    return {
        name: pod["metadata"]["annotations"][DELETION_COST]
        for (_, name), pod in api.pods.items()
        if DELETION_COST in pod["metadata"]["annotations"]
    }


def test_only_the_deployments_own_pods_get_a_deletion_cost(api: FakeKubeAPI) -> None:
    """The Deployment selects with matchExpressions only. Beside its pods the namespace
    holds another Deployment's, a canary Deployment's whose labels match the selector
    too, and a bare pod with the same labels: none of those is annotated."""
    expr = [{"key": "app", "operator": "In", "values": ["llm"]}]
    api.add_deployment(NS, "llm", 2, labels={"app": "llm"}, selector={"matchExpressions": expr})
    api.add_deployment(NS, "llm-canary", 1, labels={"app": "llm", "track": "canary"})
    api.add_pod(NS, "llm-debug", {"app": "llm"})
    drainer = _drainer(api, {"llm-1": 3, "llm-2": 0, "llm-canary-1": 9})
    detail = drainer.prepare("llm", NS, "llm")
    assert _costs(api) == {"llm-1": "3", "llm-2": "0"}
    assert "llm-2=0, llm-1=3" in detail


@pytest.mark.parametrize(
    "selector",
    [{}, {"matchExpressions": [{"key": "app", "operator": "Near", "values": ["llm"]}]}],
    ids=["empty", "unknown-operator"],
)
def test_a_selector_that_cannot_be_written_is_refused(
    api: FakeKubeAPI, selector: dict[str, Any]
) -> None:
    api.add_deployment(NS, "llm", 2, labels={"app": "llm"}, selector=selector)
    detail = _drainer(api, {"llm-1": 3}).prepare("llm", NS, "llm")
    assert "no usable label selector" in detail
    assert _costs(api) == {} and api.count("GET", "/pods") == 0


def test_without_data_the_costs_the_governor_wrote_are_removed(api: FakeKubeAPI) -> None:
    """The module's promise: no per-pod data -> the ReplicaSet's default order (newest
    first), not the costs of an earlier drain. A cost someone else set stays."""
    from kubernetes import client as k8s

    kube = api_client(api.url)
    prom = FakeProm({"demo-1": 0, "demo-2": 9, "demo-3": 8, "demo-4": 7})
    drainer = PodDrainer(k8s.CoreV1Api(kube), k8s.AppsV1Api(kube), prometheus_running_by_pod(prom))
    drainer.prepare("demo", NS, "demo")
    assert _costs(api) == {"demo-1": "0", "demo-2": "9", "demo-3": "8", "demo-4": "7"}
    operator = {"metadata": {"annotations": {DELETION_COST: "100"}}}
    k8s.CoreV1Api(kube).patch_namespaced_pod("demo-4", NS, operator)
    prom.running = None  # Prometheus down at the next scale-down
    detail = drainer.prepare("demo", NS, "demo")
    assert _costs(api) == {"demo-4": "100"}
    assert "default pod order (3 earlier costs removed)" in detail
    api.scale_to(NS, "demo", 2)
    assert sorted(api.deleted_pods) == ["demo-2", "demo-3"]  # the newest of equal cost
