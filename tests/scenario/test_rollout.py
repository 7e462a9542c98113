"""Knob rollout on the simulated fleet: a rolling restart with maxSurge 1, maxUnavailable 0
(the default), or maxSurge 0, maxUnavailable 1 (`rollout="unavailable"`), started by a
policy evaluation only once the fleet can spare what the strategy takes down."""

from __future__ import annotations

from dataclasses import replace

from controller.types import Knobs
from simulator.fleet import Fleet, ReplicaState
from simulator.matrix import CONDITIONS, TRACES, MatrixSpec, scenario_for
from simulator.scenario import _apply_policy, _Run, run_policy
from simulator.traces import load_trace

OLD, NEW = Knobs(1024, 8192), Knobs(160, 2560)


def _serving_knobs(f: Fleet) -> list[Knobs]:
    return [r.knobs for r in f.replicas if r.state is ReplicaState.SERVING]


def test_rollout_replaces_one_at_a_time_and_keeps_capacity() -> None:
    f = Fleet(knobs=OLD, initial_replicas=3, cold_start_s=45.0)
    f.set_knobs(NEW)
    f.roll_out(0.0)
    assert f.active_replicas == 3 and f.total_replicas == 4  # one surge
    seen_total = []
    for t in range(5, 200, 5):
        f.advance_to(float(t))
        assert f.ready_replicas >= 3  # maxUnavailable 0
        assert f.active_replicas == 3
        seen_total.append(f.total_replicas)
    assert max(seen_total) <= 4
    assert _serving_knobs(f) == [NEW] * 3 and f.outdated_replicas() == 0
    # 3 replicas for 195 s, plus each surge's 45 s cold start (idle old ones leave at once)
    assert f.gpu_seconds() == 3 * 195 + 3 * 45
    assert len(f.replicas) == 6


def test_rollout_under_load_finishes_in_flight_work() -> None:
    trace = load_trace("synthetic:poisson:rate=20,duration=120", seed=2)
    f = Fleet(knobs=OLD, initial_replicas=2, cold_start_s=30.0)
    f.submit_trace(trace, offset_s=0.0)
    f.advance_to(20.0)
    f.set_knobs(NEW)
    f.roll_out()
    f.run()
    rec = f.records()
    assert rec.done.all()  # drained replicas finished what they held
    assert _serving_knobs(f) == [NEW] * 2


def test_scale_down_during_rollout_does_not_cancel_the_surge() -> None:
    f = Fleet(knobs=OLD, initial_replicas=3, cold_start_s=45.0)
    f.set_knobs(NEW)
    f.roll_out(0.0)
    f.scale_to(2, 10.0)
    assert f.active_replicas == 2
    f.advance_to(300.0)
    assert f.active_replicas == 2 and f.outdated_replicas() == 0
    assert _serving_knobs(f) == [NEW] * 2


def test_scale_up_during_rollout_counts_the_surge_once() -> None:
    f = Fleet(knobs=OLD, initial_replicas=2, cold_start_s=45.0)
    f.set_knobs(NEW)
    f.roll_out(0.0)
    f.scale_to(4, 5.0)
    assert f.active_replicas == 4 and f.total_replicas == 5
    f.advance_to(400.0)
    assert f.active_replicas == 4 and _serving_knobs(f) == [NEW] * 4


def test_scale_up_during_rollout_keeps_the_outdated_replica_until_the_new_one_is_ready() -> None:
    """maxUnavailable 0 (Kubernetes' deployment controller scales the old ReplicaSet down
    only while more pods are available than wanted): the surge is ready at 45 s, the
    replica a scale-up added at 30 s at 75 s; the outdated replica serves until then."""
    f = Fleet(knobs=OLD, initial_replicas=1, cold_start_s=45.0)
    f.set_knobs(NEW)
    f.roll_out(0.0)
    f.scale_to(2, 30.0)
    f.advance_to(50.0)
    assert f.ready_replicas == 2 and f.active_replicas == 2
    assert sorted(_serving_knobs(f), key=str) == sorted([OLD, NEW], key=str)
    f.advance_to(80.0)
    assert f.ready_replicas == 2 and _serving_knobs(f) == [NEW] * 2
    assert f.outdated_replicas() == 0


def test_scale_down_while_the_outdated_replica_is_held_keeps_the_new_one() -> None:
    """A scale-down while a ready surge's outdated replica is held stops other replicas
    first (the starting one, then an outdated one), never the new one; the held
    replica then leaves as the pair's surge is enough."""
    f = Fleet(knobs=OLD, initial_replicas=2, cold_start_s=45.0)
    f.set_knobs(NEW)
    f.roll_out(0.0)
    f.scale_to(3, 30.0)
    f.advance_to(50.0)  # surge ready, the scale-up's replica not yet: outdated one held
    assert f.ready_replicas == 3 and f.outdated_replicas() == 2
    f.scale_to(1, 55.0)
    assert f.active_replicas == 1
    assert _serving_knobs(f) == [NEW] and f.outdated_replicas() == 0
    f.advance_to(400.0)
    assert f.active_replicas == 1 and _serving_knobs(f) == [NEW]


def test_unavailable_rollout_takes_one_replica_down_at_a_time_without_a_surge() -> None:
    """maxSurge 0, maxUnavailable 1: each outdated replica drains first and its
    replacement starts at once, so one replica fewer is ready during each 45 s cold
    start, never two fewer, and no GPU is spent beyond the fleet's own."""
    f = Fleet(knobs=OLD, initial_replicas=3, cold_start_s=45.0, rollout="unavailable")
    f.set_knobs(NEW)
    f.roll_out(0.0)
    assert f.active_replicas == 3 and f.ready_replicas == 2
    ready = []
    for t in range(5, 200, 5):
        f.advance_to(float(t))
        assert f.active_replicas == 3 and f.total_replicas <= 3
        ready.append(f.ready_replicas)
    assert min(ready) == 2 and ready[-1] == 3
    assert _serving_knobs(f) == [NEW] * 3 and f.outdated_replicas() == 0
    assert f.gpu_seconds() == 3 * 195  # idle outdated replicas leave at once


def test_unavailable_rollout_of_one_replica_queues_requests_until_its_replacement() -> None:
    """With one replica and maxSurge 0 nothing serves during the restart: requests wait at
    the router for the replacement's cold start and none is lost."""
    trace = load_trace("synthetic:poisson:rate=5,duration=60", seed=3)
    f = Fleet(knobs=OLD, initial_replicas=1, cold_start_s=30.0, rollout="unavailable")
    f.submit_trace(trace, offset_s=0.0)
    f.advance_to(10.0)
    f.set_knobs(NEW)
    f.roll_out()
    f.advance_to(20.0)
    assert f.ready_replicas == 0 and f.active_replicas == 1
    f.run()
    rec = f.records()
    assert rec.done.all() and f.router_queued_total > 0
    assert _serving_knobs(f) == [NEW]


class _AsksRollout:
    """A policy that adopts NEW and asks for its roll-out on one evaluation
    (`adopt`), needing `need` replicas."""

    name, interval_s, passthrough = "asks-rollout", 5.0, True

    def __init__(self, need: float) -> None:
        self.need, self.current, self.asks, self.held = need, OLD, False, False

    def adopt(self) -> None:
        self.current, self.asks = NEW, True

    def evaluate(self, now_s: float) -> int | None:
        return None

    def knobs(self) -> Knobs | None:
        return self.current

    def rollout(self) -> bool:
        asks, self.asks = self.asks, False
        return asks

    def replicas_needed(self) -> float | None:
        return self.need

    def rollout_held(self, waiting: bool) -> None:
        self.held = waiting

    def scale_down_pending(self) -> bool:
        return False

    def learned_speed(self) -> float | None:
        return None


def test_a_rollout_that_would_stop_the_only_replica_waits_for_a_second() -> None:
    """maxSurge 0 on one replica under load: the roll-out the policy asks for waits (as
    actuators.rollout holds it) until a second replica is ready, then replaces one at a
    time, so a replica serves throughout."""
    f = Fleet(knobs=OLD, initial_replicas=1, cold_start_s=30.0, rollout="unavailable")
    policy, run = _AsksRollout(need=0.6), _Run()
    policy.adopt()
    _apply_policy(run, policy, f, 0.0)
    assert run.rollout_waiting and f.outdated_replicas() == 1 and f.ready_replicas == 1
    f.advance_to(5.0)
    _apply_policy(run, policy, f, 5.0)  # asked once; still waiting, nothing stopped
    assert run.rollout_waiting and policy.held and f.ready_replicas == 1
    f.scale_to(2, 5.0)
    for t in range(10, 200, 5):
        f.advance_to(float(t))
        _apply_policy(run, policy, f, float(t))
        assert f.ready_replicas >= 1
    assert not run.rollout_waiting and not policy.held and _serving_knobs(f) == [NEW, NEW]


def test_a_surge_rollout_never_waits_for_room() -> None:
    f = Fleet(knobs=OLD, initial_replicas=1, cold_start_s=30.0)
    policy, run = _AsksRollout(need=3.0), _Run()  # more than the fleet has
    policy.adopt()
    _apply_policy(run, policy, f, 0.0)
    assert not run.rollout_waiting and f.total_replicas == 2  # the surge replica starts


def test_the_governor_on_a_maxsurge_0_engine_never_stops_its_only_replica() -> None:
    """The matrix's diurnal trace (trace seed 0) with every knob roll-out as a Deployment
    with maxSurge 0, maxUnavailable 1: the governor rolls its knobs out only once a
    second replica is ready, so no HPA sync sees an empty fleet and the smooth-trace
    attainment goal holds (97.69 % with 3 empty syncs when roll-outs did not wait)."""
    trace = next(t for t in TRACES if t.key == "diurnal")
    default = next(c for c in CONDITIONS if c.name == "default")
    sc = scenario_for(MatrixSpec(), trace, default)
    sc = replace(sc, plant=replace(sc.plant, rollout="unavailable"))
    empty: list[float] = []

    def on_sync(t: float, fleet: Fleet, policy: object) -> None:
        if fleet.ready_replicas == 0:
            empty.append(t)

    res = run_policy("governor", sc, on_sync=on_sync)
    assert res.knob_changes >= 1  # it did change knobs
    assert empty == [] and res.slo_attainment >= 0.99
