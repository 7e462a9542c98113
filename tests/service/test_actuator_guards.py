"""The Kubernetes actuators' guards, with the real `kubernetes` client against
`FakeKubeAPI` (tests/service/fake_kube.py), a faithful fake of the published API
contract (resourceVersion conflicts -> 409, injected 5xx, and a 200 whose body is no API
object, as a misrouting proxy answers):

- only a leader writes: after `stand_down()` or `close()`, or once the write check (the
  elector's `is_leader`, wired by the service) says no, no read or patch starts, a
  write in hand included (409 re-reads and 5xx retries ask first), and the service
  stops its actuators before it releases the lease;
- one model's malformed answer or surprise fails that model only, reported and counted.

Backoff sleeps are recorded (or used as the moment something happens), not slept; the
retry clock is a fake monotonic clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from actuators import kubeapi
from actuators.drain import DrainBeforeScaleDown, PodDrainer
from actuators.kubeapi import KubeCallError, api_client, call_with_retries
from actuators.kubernetes import KubernetesScaleActuator, ScaleReason
from actuators.rollout import KnobRolloutActuator, RolloutReason
from controller.loop import ControlLoop
from controller.types import Decision, Knobs, Reason
from service.core import ServiceCore
from service.leader import AlwaysLeader, LeaseElector
from service.store import MemoryStore
from tests.service.fake_kube import FakeKubeAPI
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger

NS = "llm"
REQUEST_TIMEOUT_S = 30.0  # the fake answers in ms; generous for a loaded machine


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(timeout_delay_s=0.5) as fake:
        yield fake


def _decision(model: str, replicas: int, **kw: Any) -> Decision:
    return Decision(model, 0.0, True, replicas, Knobs(8, 256), (), Reason.KNOBS_STATIC, **kw)


class Sleeps:
    """Records each backoff (seconds) and runs `then` at the first one."""

    def __init__(self, then: Callable[[], None] | None = None) -> None:
        self.calls: list[float] = []
        self.then = then

    def __call__(self, s: float) -> None:
        self.calls.append(s)
        if len(self.calls) == 1 and self.then is not None:
            self.then()


def _scaler(api: FakeKubeAPI, sleeps: Sleeps, errors: list[str], **kw: Any) -> Any:
    return KubernetesScaleActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo"), "other": (NS, "other")},
        background=False,
        sleep=sleeps,
        request_timeout_s=REQUEST_TIMEOUT_S,
        backoff_s=0.1,
        logger=quiet_logger(),
        on_error=errors.append,
        **kw,
    )


# ---------------------------------------------------------------------- only a leader
def test_a_leader_demoted_during_a_conflict_backoff_does_not_write(api: FakeKubeAPI) -> None:
    """The PATCH gets 409; during its backoff the lease is lost and the new leader sets
    10. The old leader must not re-read and patch its 3 over it."""
    api.add_deployment(NS, "demo", 8)
    api.inject("PATCH", "/deployments/demo/scale", 409)
    errors: list[str] = []

    def demoted() -> None:
        act.stand_down()
        api.scale_to(NS, "demo", 10)  # the new leader's write

    act = _scaler(api, Sleeps(demoted), errors)
    act.apply([_decision("demo", 3)])
    assert api.replicas(NS, "demo") == 10
    assert api.count("PATCH", "/deployments/demo/scale") == 1
    st = act.status()["demo"]
    assert st.reason == ScaleReason.ABANDONED and "not the leader" in st.detail
    assert errors == [] and act.pending() == {}


def test_a_leader_demoted_during_5xx_retries_stops_retrying(api: FakeKubeAPI) -> None:
    api.add_deployment(NS, "demo", 8)
    api.inject("PATCH", "/deployments/demo/scale", 503, times=100)
    errors: list[str] = []
    act = _scaler(api, Sleeps(lambda: act.stand_down()), errors)
    act.apply([_decision("demo", 3)])
    assert api.count("PATCH", "/deployments/demo/scale") == 1  # no retry after it
    assert act.status()["demo"].reason == ScaleReason.ABANDONED
    assert errors == [] and act.pending() == {}
    assert api.replicas(NS, "demo") == 8


def test_close_abandons_the_write_in_hand_and_the_rest_of_the_batch(api: FakeKubeAPI) -> None:
    api.add_deployment(NS, "demo", 8)
    api.add_deployment(NS, "other", 8)
    api.inject("GET", "/deployments/demo/scale", 503)
    errors: list[str] = []
    act = _scaler(api, Sleeps(lambda: act.close()), errors)
    act.apply([_decision("demo", 3), _decision("other", 3)])
    assert api.count("GET", "/deployments/other/") == 0
    assert api.count("PATCH") == 0 and errors == []
    st = act.status()["demo"]
    assert st.reason == ScaleReason.ABANDONED and "stopped" in st.detail


def test_a_rollout_in_hand_is_abandoned_when_the_leader_stands_down(api: FakeKubeAPI) -> None:
    api.add_deployment(NS, "demo", 2)
    api.inject("PATCH", "/deployments/demo", 409)
    errors: list[str] = []
    act = KnobRolloutActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo")},
        lambda model: 0.0,
        background=False,
        sleep=Sleeps(lambda: act.stand_down()),
        request_timeout_s=REQUEST_TIMEOUT_S,
        on_error=errors.append,
    )
    act.apply([_decision("demo", 2, rollout=True)])
    assert api.count("PATCH", "/deployments/demo") == 1
    assert api.template_annotations(NS, "demo") == {} and errors == []
    assert act.status()["demo"].reason == RolloutReason.ABANDONED


# ---------------------------------------------------------------------- a paused model
def test_pausing_a_model_drops_the_writes_its_actuators_still_had_queued(
    api: FakeKubeAPI,
) -> None:
    """Shadow mode means nothing reaches the model's Deployment. Before the pause the
    model decided 9 replicas (the PATCH got 503: queued for its retry) and a knob
    roll-out (waiting for a roll-out in progress). After `ControlLoop.pause` the API
    recovers and the roll-out ends; the loop's ticks (the other model's decisions wake
    the actuators) must write neither. After `resume` its decisions are written again."""
    api.add_deployment(NS, "demo", 4)
    api.add_deployment(NS, "other", 2)
    api.inject("PATCH", "/deployments/demo/scale", 503)
    api.start_rollout(NS, "demo")
    now = [0.0]
    targets = lambda: {"demo": (NS, "demo"), "other": (NS, "other")}  # noqa: E731
    scaler = _scaler(api, Sleeps(), [], retries=0, monotonic=lambda: now[0])
    roller = KnobRolloutActuator(
        api_client(api.url), targets, lambda model: 0.0, background=False,
        sleep=Sleeps(), request_timeout_s=REQUEST_TIMEOUT_S, monotonic=lambda: now[0],
    )  # fmt: skip
    before = [_decision("demo", 9, rollout=True)]
    scaler.apply(before)
    roller.apply(before)
    assert scaler.pending() == {"demo": 9} and roller.pending() == {"demo": Knobs(8, 256)}
    clock = FakeClock()
    loop = ControlLoop(
        make_config(model_entry("demo"), model_entry("other")),
        FakeSource(rates={"demo": 5.0, "other": 5.0}),
        [scaler, roller],
        clock=clock,
        logger=quiet_logger(),
    )
    loop.pause("demo")
    assert scaler.pending() == {} and roller.pending() == {}
    api.finish_rollout(NS, "demo")
    for _ in range(3):
        clock.advance(15.0)
        now[0] += 100.0  # every retry due
        loop.tick()
    assert api.replicas(NS, "demo") == 4
    assert api.count("PATCH", "/deployments/demo/scale") == 1  # the 503, nothing since
    assert api.template_annotations(NS, "demo") == {}
    assert "other" in scaler.status()
    loop.resume("demo")
    clock.advance(15.0)
    decided = next(d for d in loop.tick() if d.model == "demo")
    assert decided.replicas != 4 and api.replicas(NS, "demo") == decided.replicas


class _Recorder:
    """An elector and an actuator that write what the service does to them, in order."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def apply(self, decisions: Any) -> None:
        return None

    def stand_down(self) -> int:
        self.events.append("stand_down")
        return 0

    def close(self) -> None:
        self.events.append("close")


class _Elector(AlwaysLeader):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def stop(self, release: bool = True) -> None:
        self.events.append("release" if release else "stop")


def test_the_service_stops_its_actuators_before_it_releases_the_lease() -> None:
    """Released first, another instance could lead while a write of ours is in hand."""
    events: list[str] = []
    core = ServiceCore(
        make_config(model_entry("demo")),
        FakeSource({"demo": 30.0}),
        MemoryStore(),
        actuators=[_Recorder(events)],
        clock=FakeClock(),
        elector=_Elector(events),
        logger=quiet_logger(),
    )
    core.close()
    assert events == ["stand_down", "close", "release"]


class _Toggle(AlwaysLeader):
    """An elector whose leadership the test sets."""

    leader = True

    def is_leader(self) -> bool:
        return self.leader


def test_a_lapsed_lease_stops_a_queued_retry_before_the_next_tick(api: FakeKubeAPI) -> None:
    """The scale write fails (503) and waits for its retry; the lease lapses (no renewal
    for 8 s > the 7 s renew deadline: an API brownout, or the elector thread hung). The
    worker's retry comes before the next tick: it must not patch, as another instance
    may lead by now (the tick's `stand_down` alone came up to a tick late)."""
    clock = FakeClock()
    api.add_deployment(NS, "demo", 1)
    elector = LeaseElector(
        api_client(api.url),
        NS,
        "governor-leader",
        "a",
        monotonic=clock.monotonic,
        wall=clock.wall,
        request_timeout_s=REQUEST_TIMEOUT_S,
        logger=quiet_logger(),
    )
    act = _scaler(api, Sleeps(), [], retries=0, monotonic=clock.monotonic)
    core = ServiceCore(
        make_config(model_entry("demo", namespace=NS)),
        FakeSource({"demo": 40.0}),
        MemoryStore(),
        actuators=[act],
        clock=clock,
        elector=elector,
        logger=quiet_logger(),
    )
    assert elector.step() is True
    api.inject("PATCH", "/deployments/demo/scale", 503)
    core.tick(clock.monotonic())
    assert act.status()["demo"].transient and act.pending() == {"demo": 3}  # its retry
    clock.advance(8)
    assert not elector.is_leader()
    act.run_pending()  # what the worker does once the retry is due
    assert api.count("PATCH", "/deployments/demo/scale") == 1
    assert api.replicas(NS, "demo") == 1


def test_a_write_check_that_says_no_mid_write_stops_the_reread(api: FakeKubeAPI) -> None:
    """No stand-down at all: the check alone stops the 409 re-read and patch."""
    api.add_deployment(NS, "demo", 8)
    api.inject("PATCH", "/deployments/demo/scale", 409)
    leading = [True]
    errors: list[str] = []
    act = _scaler(api, Sleeps(lambda: leading.__setitem__(0, False)), errors)
    act.set_write_check(lambda: leading[0])
    act.apply([_decision("demo", 3)])
    assert api.count("GET", "/deployments/demo/scale") == 1
    assert api.count("PATCH", "/deployments/demo/scale") == 1
    st = act.status()["demo"]
    assert st.reason == ScaleReason.ABANDONED and "not the leader" in st.detail
    assert errors == [] and api.replicas(NS, "demo") == 8


def test_a_raising_write_check_counts_as_no(api: FakeKubeAPI) -> None:
    api.add_deployment(NS, "demo", 8)
    act = _scaler(api, Sleeps(), [])

    def broken() -> bool:
        raise RuntimeError("elector gone")

    act.set_write_check(broken)
    act.apply([_decision("demo", 3)])
    assert api.count("GET") == 0 and api.replicas(NS, "demo") == 8


def test_a_rollout_waits_while_the_write_check_says_no(api: FakeKubeAPI) -> None:
    api.add_deployment(NS, "demo", 2)
    leading = [False]
    act = KnobRolloutActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo")},
        lambda model: 0.0,
        background=False,
        sleep=Sleeps(),
        request_timeout_s=REQUEST_TIMEOUT_S,
    )
    act.set_write_check(lambda: leading[0])
    act.apply([_decision("demo", 2, rollout=True)])
    assert api.count("GET", "/deployments/demo") == 0 and "demo" in act.pending()
    leading[0] = True
    act.run_pending()
    assert act.status()["demo"].reason == RolloutReason.STARTED


def test_the_keda_mode_drain_runs_only_while_leading() -> None:
    """DrainBeforeScaleDown (no stand-down of its own) asks the service's elector."""
    drained: list[str] = []

    def drain(model: str, namespace: str, deployment: str) -> str:
        drained.append(model)
        return "drain: ok"

    act = DrainBeforeScaleDown(drain, lambda: {"demo": (NS, "demo")}, background=False)
    elector = _Toggle()
    ServiceCore(
        make_config(model_entry("demo")),
        FakeSource({"demo": 30.0}),
        MemoryStore(),
        actuators=[act],
        clock=FakeClock(),
        elector=elector,
        logger=quiet_logger(),
    )
    elector.leader = False
    act.apply([_decision("demo", 5)])
    act.apply([_decision("demo", 3)])  # a scale-down
    assert drained == []
    elector.leader = True
    act.apply([_decision("demo", 2)])
    assert drained == ["demo"]


def test_a_drain_that_raises_does_not_keep_its_model_from_the_next_drain() -> None:
    """A drain claims its model until it ends (one drain per model at a time): one that
    raises must still let the model go, or no later scale-down would be prepared."""
    drained: list[str] = []

    def drain(model: str, namespace: str, deployment: str) -> str:
        drained.append(model)
        if len(drained) == 1:
            raise RuntimeError("drain broke its word")
        return "drain: ok"

    act = DrainBeforeScaleDown(drain, lambda: {"demo": (NS, "demo")}, background=False)
    act.apply([_decision("demo", 5)])
    with pytest.raises(RuntimeError):
        act.apply([_decision("demo", 3)])
    act.apply([_decision("demo", 2)])
    assert drained == ["demo", "demo"] and act.status() == {"demo": "drain: ok"}
    assert act.pending() == {}


# ---------------------------------------------------------------------- one model's trouble
def test_call_with_retries_reads_a_malformed_answer_as_a_failure_once() -> None:
    calls: list[int] = []

    def unreadable() -> None:
        calls.append(1)
        raise ValueError("Input should be a valid dictionary")

    with pytest.raises(KubeCallError) as ei:
        call_with_retries(unreadable, retries=3, sleep=lambda s: None, what="read x")
    assert ei.value.malformed and not ei.value.retryable and calls == [1]
    assert "malformed answer" in str(ei.value)
    with pytest.raises(kubeapi.CallAbandoned):
        call_with_retries(lambda: calls.append(2), abandon=lambda: True)
    assert calls == [1]


def test_the_clients_own_status_0_for_an_unreadable_answer_is_malformed() -> None:
    """The client raises ApiException(status=0) itself for a 200 it cannot read (a
    content type neither JSON nor text, a date it cannot parse): a malformed answer, not
    retried. Its other status-0 raises (a TLS failure) are no answer of the server's."""
    from kubernetes.client.exceptions import ApiException

    for reason in ("Unsupported content type: application/xml", "Failed to parse `x`"):
        calls: list[int] = []

        def unreadable(reason: str = reason, calls: list[int] = calls) -> None:
            calls.append(1)
            raise ApiException(status=0, reason=reason)

        with pytest.raises(KubeCallError) as ei:
            call_with_retries(unreadable, retries=3, sleep=lambda s: None, what="read x")
        assert ei.value.malformed and calls == [1] and reason in str(ei.value)

    def tls() -> None:
        raise ApiException(status=0, reason="SSLError\ncertificate verify failed")

    with pytest.raises(KubeCallError) as ei:
        call_with_retries(tls, retries=0, what="read x")
    assert not ei.value.malformed


@pytest.mark.parametrize(
    "content_type", ["text/html", "application/xhtml+xml", "application/octet-stream", ""]
)
def test_a_malformed_answer_fails_that_model_only(api: FakeKubeAPI, content_type: str) -> None:
    """A 200 with an HTML body for one Deployment: that model FAILED (counted, not
    retried on its own: the next decision asks again); the other model is written.
    Whatever its content type: one the client reads as text fails as the model is
    built; any other (neither JSON nor text) fails in the client as an ApiException of
    status 0, which is no HTTP status and is counted `malformed_answer` too, never
    `rejected`."""
    api.add_deployment(NS, "demo", 2)
    api.add_deployment(NS, "other", 2)
    api.inject("GET", "/deployments/demo/scale", "garbage", content_type=content_type)
    errors: list[str] = []
    act = _scaler(api, Sleeps(), errors)
    act.apply([_decision("demo", 5), _decision("other", 5)])
    assert errors == ["malformed_answer"] and act.pending() == {}
    st = act.status()["demo"]
    assert st.reason == ScaleReason.FAILED and "malformed answer" in st.detail
    assert api.count("GET", "/deployments/demo/scale") == 1
    assert api.replicas(NS, "other") == 5
    act.apply([_decision("demo", 5)])  # the next tick
    assert api.replicas(NS, "demo") == 5


def test_anything_one_model_raises_is_confined_to_it_and_queued_again(
    api: FakeKubeAPI,
) -> None:
    api.add_deployment(NS, "demo", 4)
    api.add_deployment(NS, "other", 2)
    broken = [True]

    def drain(model: str, namespace: str, deployment: str) -> str:
        if broken[0]:
            raise RuntimeError("drain broke its word")
        return "drain: ok"

    errors: list[str] = []
    now = [0.0]
    act = _scaler(api, Sleeps(), errors, drain=drain, monotonic=lambda: now[0])
    act.apply([_decision("demo", 2), _decision("other", 3)])
    st = act.status()["demo"]
    assert st.reason == ScaleReason.FAILED and "drain broke its word" in st.detail
    assert errors == ["exception"] and act.pending() == {"demo": 2}
    assert api.replicas(NS, "other") == 3 and api.replicas(NS, "demo") == 4
    broken[0] = False
    now[0] += 100.0  # its retry is due
    act.run_pending()
    assert api.replicas(NS, "demo") == 2 and act.status()["demo"].detail == "drain: ok"


@pytest.mark.parametrize("content_type", ["text/html", "application/xml"])
def test_a_malformed_deployment_answer_fails_the_rollout_and_keeps_it(
    api: FakeKubeAPI, content_type: str
) -> None:
    api.add_deployment(NS, "demo", 2)
    api.inject("GET", "/deployments/demo", "garbage", content_type=content_type)
    errors: list[str] = []
    act = KnobRolloutActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo")},
        lambda model: 0.0,
        background=False,
        sleep=Sleeps(),
        request_timeout_s=REQUEST_TIMEOUT_S,
        on_error=errors.append,
    )
    act.apply([_decision("demo", 2, rollout=True)])
    assert errors == ["malformed_answer"] and "demo" in act.pending()
    st = act.status()["demo"]
    assert st.reason == RolloutReason.FAILED and "malformed answer" in st.detail


def test_a_malformed_pod_list_leaves_the_default_order_and_still_scales(
    api: FakeKubeAPI,
) -> None:
    api.add_deployment(NS, "demo", 4)
    api.inject("GET", "/pods", "garbage")
    kube = api_client(api.url)
    drainer = PodDrainer(k8s.CoreV1Api(kube), k8s.AppsV1Api(kube), lambda m, ns: {"demo-1": 1.0})
    act = _scaler(api, Sleeps(), [], drain=drainer.prepare)
    act.apply([_decision("demo", 2)])
    st = act.status()["demo"]
    assert st.reason == ScaleReason.SCALED and api.replicas(NS, "demo") == 2
    assert "could not set deletion costs" in st.detail and "malformed answer" in st.detail
