"""Kubernetes API faults against the real `kubernetes` client and a fake API server
(tests/service/fake_kube.py, a fake of the published API contract): bursts of 409,
500, 429 and timeouts (also timeouts after the write landed), 403/404/HPA refusals, a
ConfigMap store under 5xx bursts, and a targets ConfigMap without its key.

What must hold: retries with backoff and jitter; no lost scaling intent (a failed one
is retried on its own, also when later ticks hold); no duplicated intent (every
applied write is a new decision, in decision order); the final scale equals the last
decision; failures counted in governor_actuation_errors_total by reason. Backoff sleeps
are recorded, not slept; the retry clock is a fake monotonic clock."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from actuators.kubeapi import api_client
from actuators.kubernetes import KubernetesScaleActuator, ScaleReason
from controller.targets import config_to_targets
from controller.types import Decision, Knobs, Reason
from service.cmstore import ConfigMapStore
from service.core import ServiceCore
from tests.faults.helpers import FaultyKubeAPI, sample
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger

NS = "llm"
BACKOFF_S = 0.1
RETRIES = 4


@pytest.fixture
def api() -> Iterator[FaultyKubeAPI]:
    with FaultyKubeAPI(timeout_delay_s=0.5) as fake:
        yield fake


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, s: float) -> None:
        self.calls.append(s)


class Mono:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _decision(replicas: int, valid: bool = True) -> Decision:
    return Decision("demo", 0.0, valid, replicas, Knobs(8, 256), (), Reason.KNOBS_STATIC)


def _actuator(api: FaultyKubeAPI, sleeps: Sleeps, mono: Mono, **kw: Any) -> Any:
    errors: list[str] = []
    act = KubernetesScaleActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo")},
        background=False,
        sleep=sleeps,
        monotonic=mono,
        request_timeout_s=0.25,
        backoff_s=BACKOFF_S,
        retries=RETRIES,
        logger=quiet_logger(),
        on_error=errors.append,
        **kw,
    )
    return act, errors


def _is_subsequence(sub: list[int], seq: list[int]) -> bool:
    it = iter(seq)
    return all(any(x == y for y in it) for x in sub)


BURSTS = [
    ("PATCH", 409),
    ("GET", 500),
    ("PATCH", 429),
    ("PATCH", 503),
    ("GET", "timeout"),
    ("PATCH", "timeout"),
    ("PATCH", "lost"),
]


@pytest.mark.fault_case(
    "Kubernetes API",
    "bursts of 409 / 500 / 429 / 503 / timeouts / lost replies on the scale subresource",
    "30 decisions, each under a random burst of 1-7 failures (some past the 4 retries) and "
    "followed by 0-3 ticks without data; backoff doubles with +-10 % jitter; every applied "
    "write is a new decision in decision order (none lost, none twice); final scale = last "
    "decision; failures counted by reason",
)
def test_bursts_final_scale_is_the_last_decision(api: FaultyKubeAPI, fault_note: Any) -> None:
    rng = random.Random(6)
    api.add_deployment(NS, "demo", 2)
    sleeps, mono = Sleeps(), Mono()
    act, errors = _actuator(api, sleeps, mono)
    decided: list[int] = []
    failed_attempts = 0
    faults = 0
    for _ in range(30):
        value = rng.choice([v for v in range(1, 21) if not decided or v != decided[-1]])
        method, status = rng.choice(BURSTS)
        times = rng.randint(1, 7) if status not in ("timeout", "lost") else rng.randint(1, 2)
        faults += times
        if status == "lost":
            api.lose_replies(method, "/deployments/demo/scale", times)
        else:
            api.inject(method, "/deployments/demo/scale", status, times)
        decided.append(value)
        mono.t += 5
        act.apply([_decision(value)])  # the tick that decided it
        if act.status()["demo"].reason is ScaleReason.FAILED:
            failed_attempts += 1
        for _ in range(rng.randint(0, 3)):  # then ticks without data: invalid decisions
            mono.t += 5
            act.apply([_decision(0, valid=False)])
    api.faults.clear()
    api._lost.clear()
    for _ in range(20):  # the worker keeps retrying on its own
        if not act.pending():
            break
        mono.t += 40
        act.run_pending()
    assert act.pending() == {}
    assert api.replicas(NS, "demo") == decided[-1]
    writes = [r for ns, name, r in api.writes if name == "demo"]
    # no duplicated intent: consecutive writes differ; no reordering: decision order
    assert all(a != b for a, b in itertools.pairwise(writes)), writes
    assert _is_subsequence(writes, decided), (writes, decided)
    assert len(writes) <= len(decided)
    # backoff with jitter: each sleep is backoff * 2^k within +-10 %, and not exactly
    assert sleeps.calls
    for s in sleeps.calls:
        k = min(range(8), key=lambda k: abs(s - BACKOFF_S * 2**k))
        assert 0.9 * BACKOFF_S * 2**k <= s <= 1.1 * BACKOFF_S * 2**k, s
    assert any(min(abs(s - BACKOFF_S * 2**k) for k in range(8)) > 1e-9 for s in sleeps.calls)
    assert len({round(s, 6) for s in sleeps.calls}) > 5  # jittered, not a fixed ladder
    # failures past the retries were reported by reason, and retried on their own
    assert failed_attempts > 0
    assert set(errors) <= {"conflict", "retries_exhausted"}
    assert {"conflict", "retries_exhausted"} & set(errors)
    fault_note(
        f"{len(decided)} decisions, {faults} injected failures, {len(sleeps.calls)} jittered "
        f"backoffs, {len(errors)} attempts failed past the retries and were retried; "
        f"{len(writes)} writes, 0 lost, 0 duplicated, final {api.replicas(NS, 'demo')} = last"
    )


@pytest.mark.fault_case(
    "Kubernetes API",
    "timeout after the write landed (lost reply), then retried",
    "the retry reads the scale back as equal (UNCHANGED): one write, not two",
)
def test_lost_reply_is_not_applied_twice(api: FaultyKubeAPI) -> None:
    api.add_deployment(NS, "demo", 2)
    sleeps, mono = Sleeps(), Mono()
    act, _ = _actuator(api, sleeps, mono)
    api.lose_replies("PATCH", "/deployments/demo/scale", 1)
    act.apply([_decision(7)])
    assert api.replicas(NS, "demo") == 7
    assert [w[2] for w in api.writes] == [7]
    assert act.status()["demo"].reason in (ScaleReason.UNCHANGED, ScaleReason.SCALED)


@pytest.mark.fault_case(
    "Kubernetes API",
    "background worker (production mode) under a 500 burst longer than its retries",
    "the worker retries the intent by itself after a jittered per-model backoff while "
    "later ticks have no decision; the Deployment reaches the decided replicas",
)
def test_background_worker_retries_failed_intent_on_its_own(api: FaultyKubeAPI) -> None:
    from tests.service.harness import wait_until

    api.add_deployment(NS, "demo", 1)
    api.inject("PATCH", "/deployments/demo/scale", 500, times=12)  # 3 attempts of 4 calls
    act = KubernetesScaleActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo")},
        background=True,
        request_timeout_s=0.25,
        backoff_s=0.02,
        retries=3,
        logger=quiet_logger(),
    )
    try:
        act.apply([_decision(6)])  # one tick decides; nothing else is ever sent
        wait_until(lambda: api.replicas(NS, "demo") == 6, 20, "the worker's own retries")
        assert api.count("PATCH", "/deployments/demo/scale") == 13
        assert act.pending() == {}
    finally:
        act.close()


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("forbidden", "forbidden"),
        ("missing", "not_found"),
        ("hpa", "hpa_conflict"),
        ("exhausted", "retries_exhausted"),
        ("conflict", "conflict"),
        ("invalid", "rejected"),
    ],
)
@pytest.mark.fault_case(
    "Kubernetes API",
    "403 / 404 / HPA conflict / 5xx past retries / 409 past retries / 422",
    "each refused or failed scale increments governor_actuation_errors_total"
    "{actuator=KubernetesScaleActuator, reason} through ServiceCore; the Deployment is "
    "untouched; status names the reason",
)
def test_actuation_errors_are_counted_by_reason(
    api: FaultyKubeAPI, setup: str, reason: str
) -> None:
    if setup != "missing":
        api.add_deployment(NS, "demo", 1)
    if setup == "forbidden":
        api.inject("PATCH", "/deployments/demo/scale", 403, times=10)
    elif setup == "hpa":
        api.add_hpa(NS, "demo-hpa", "demo")
    elif setup == "exhausted":
        api.inject("PATCH", "/deployments/demo/scale", 500, times=10)
    elif setup == "conflict":
        api.inject("PATCH", "/deployments/demo/scale", 409, times=10)
    elif setup == "invalid":
        api.inject("PATCH", "/deployments/demo/scale", 422, times=10)
    clock = FakeClock()
    act = KubernetesScaleActuator(
        api_client(api.url),
        lambda: {"demo": (NS, "demo")},
        background=False,
        sleep=Sleeps(),
        request_timeout_s=0.25,
        backoff_s=0.01,
        retries=2,
        logger=quiet_logger(),
    )
    core = ServiceCore(
        make_config(model_entry("demo", namespace=NS)),
        FakeSource({"demo": 60.0}),
        clock=clock,
        actuators=[act],
        logger=quiet_logger(),
    )
    core.tick(clock.advance(5))
    labels = {"actuator": "KubernetesScaleActuator", "reason": reason}
    assert sample(core.metrics.registry, "governor_actuation_errors_total", **labels) == 1.0
    others = [
        r
        for r in ("forbidden", "not_found", "hpa_conflict", "retries_exhausted", "conflict")
        if r != reason
    ]
    for r in others:
        got = sample(
            core.metrics.registry,
            "governor_actuation_errors_total",
            actuator="KubernetesScaleActuator",
            reason=r,
        )
        assert not got, (r, got)
    if setup != "missing":
        assert api.replicas(NS, "demo") == 1
    status = core.status().models[0].actuation
    expected = {"forbidden": "403", "not_found": "NOT_FOUND", "hpa_conflict": "HPA_CONFLICT"}
    assert expected.get(reason, "FAILED") in status


# ---------------------------------------------------------------------- ConfigMap store
def _store(api: FaultyKubeAPI) -> ConfigMapStore:
    return ConfigMapStore(
        k8s.CoreV1Api(api_client(api.url)),
        NS,
        "governor-targets",
        request_timeout_s=0.25,
        backoff_s=0.01,
        sleep=Sleeps(),
    )


@pytest.mark.fault_case(
    "Kubernetes API",
    "targets ConfigMap exists without the targets.yaml key (review gap a)",
    "start-up seeds the key under the ConfigMap's resourceVersion, keeping its other keys "
    "and labels; a later admin write succeeds; a write racing an edit gets a conflict, "
    "not a silent overwrite",
)
def test_configmap_without_key_is_seeded_and_writable(api: FaultyKubeAPI) -> None:
    rv0 = api.edit_configmap(NS, "governor-targets", {"notes": "created by hand"})
    api.configmaps[(NS, "governor-targets")]["metadata"]["labels"] = {"team": "ml"}
    clock = FakeClock()
    cfg = make_config(model_entry("demo", namespace=NS))
    core = ServiceCore(cfg, FakeSource({"demo": 10.0}), _store(api), clock=clock,
                       logger=quiet_logger())  # fmt: skip
    core.seed_targets()  # the start-up (GovernorServer.start, once bound)
    cm = api.configmaps[(NS, "governor-targets")]
    assert "targets.yaml" in cm["data"], cm
    assert cm["data"]["notes"] == "created by hand" and cm["metadata"]["labels"] == {"team": "ml"}
    assert cm["metadata"]["resourceVersion"] != rv0
    assert core.targets_revision == cm["metadata"]["resourceVersion"]
    seeded = yaml.safe_load(cm["data"]["targets.yaml"])
    assert [m["name"] for m in seeded["models"]] == ["demo"]
    # the CLI path (admin set_target) works afterwards, with optimistic concurrency
    core.set_target(model_entry("demo", namespace=NS, sla={"ttft_p95_ms": 800, "itl_p95_ms": 40}))
    stored = yaml.safe_load(api.configmaps[(NS, "governor-targets")]["data"]["targets.yaml"])
    assert stored["models"][0]["sla"]["itl_p95_ms"] == 40
    core.tick(clock.advance(5))
    assert core.config.model("demo").sla.itl_p95_ms == 40
    # seeding that races another writer is a conflict, not an overwrite
    api.edit_configmap(NS, "other-targets", {"notes": "x"})
    store = ConfigMapStore(k8s.CoreV1Api(api_client(api.url)), NS, "other-targets", sleep=Sleeps())
    api.inject("PUT", "/configmaps/other-targets", 409)
    from service.store import ConflictError

    with pytest.raises(ConflictError):
        store.save_targets(config_to_targets(cfg), "")
    assert store.save_targets(config_to_targets(cfg), "")  # retried: seeds
    assert "targets.yaml" in api.configmaps[(NS, "other-targets")]["data"]


@pytest.mark.fault_case(
    "Kubernetes API",
    "ConfigMap store: bursts of 500/503/timeouts on reads and writes",
    "ticks continue and keep deciding; failures counted in governor_store_errors_total; "
    "the state is saved again after the burst; the targets never change",
)
def test_configmap_store_bursts_keep_the_loop_running(api: FaultyKubeAPI) -> None:
    clock = FakeClock()
    core = ServiceCore(
        make_config(model_entry("demo", namespace=NS)),
        FakeSource({"demo": 50.0}),
        _store(api),
        clock=clock,
        logger=quiet_logger(),
    )
    core.seed_targets()  # the start-up (GovernorServer.start, once bound)
    targets_before = api.configmaps[(NS, "governor-targets")]["data"]["targets.yaml"]
    core.tick(clock.advance(5))
    api.inject("PUT", "/configmaps/governor-targets-state", 500, times=12)
    api.inject("GET", "/configmaps/governor-targets", 503, times=12)
    api.inject("GET", "/configmaps/governor-targets-state", "timeout", times=2)
    decided = []
    for _ in range(6):
        d = core.tick(clock.advance(5))
        decided.append(d[0].valid)
    assert all(decided)  # the loop decided on every tick despite the store
    reg = core.metrics.registry
    assert (sample(reg, "governor_store_errors_total", op="save_state") or 0) >= 1
    assert (sample(reg, "governor_store_errors_total", op="load_targets") or 0) >= 1
    api.faults.clear()
    core.tick(clock.advance(5))
    state = ConfigMapStore(k8s.CoreV1Api(api_client(api.url)), NS).load_state()
    assert state is not None and state.saved_at_unix_s == pytest.approx(clock.wall())
    assert api.configmaps[(NS, "governor-targets")]["data"]["targets.yaml"] == targets_before
