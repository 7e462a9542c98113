"""Fleet lifecycle: cold start, router queue, draining, GPU-seconds, knobs at start or live."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.types import Knobs
from simulator.fleet import Fleet, ReplicaState
from simulator.traces import Trace, synthetic


def test_cold_start_and_router_queue() -> None:
    fleet = Fleet(initial_replicas=0, cold_start_s=30.0)
    fleet.scale_to(1, 0.0)
    assert fleet.ready_replicas == 0 and fleet.total_replicas == 1
    rid = fleet.submit(5.0, 200, 10)
    fleet.advance_to(29.0)
    assert fleet.router_queue_len == 1 and fleet.peak_router_queue == 1
    fleet.advance_to(31.0)
    assert fleet.ready_replicas == 1 and fleet.router_queue_len == 0
    rec = fleet.records()
    assert rec.dispatch_s[rid] == 30.0
    assert rec.ttft_s[rid] > 25.0  # router wait counts in the per-request truth
    assert fleet.replicas[0].ready_s == 30.0


def test_profile_cold_start_is_default() -> None:
    fleet = Fleet(initial_replicas=1, initial_ready=False)
    assert fleet.replicas[0].ready_s == pytest.approx(45.0)
    fleet.advance_to(44.9)
    assert fleet.ready_replicas == 0
    fleet.advance_to(45.0)
    assert fleet.ready_replicas == 1


def test_cold_start_range_is_seeded() -> None:
    def ready_times(seed: int) -> list[float]:
        f = Fleet(initial_replicas=0, seed=seed, cold_start_s=(30.0, 60.0))
        f.scale_to(5, 0.0)
        return [r.ready_s for r in f.replicas]

    a = ready_times(1)
    assert a == ready_times(1)
    assert a != ready_times(2)
    assert all(30.0 <= t <= 60.0 for t in a)


def test_draining_finishes_in_flight_and_takes_no_new_work() -> None:
    fleet = Fleet(initial_replicas=2, cold_start_s=10.0)
    tr = synthetic("poisson", seed=3, rate=20.0, duration=60.0)
    fleet.submit_trace(tr)
    fleet.advance_to(30.0)
    # drain the least loaded serving replica
    loads = {rid: e.n_out for rid, e in fleet.live_engines()}
    fleet.scale_to(1)
    drained = next(r for r in fleet.replicas if r.state is not ReplicaState.SERVING)
    assert loads[drained.replica_id] == min(loads.values())
    rec = fleet.records()
    before = (rec.arrival_s < 30.0) & (rec.replica == drained.replica_id)
    fleet.run()
    rec = fleet.records()
    after = rec.arrival_s >= 30.0
    assert not np.any(rec.replica[after] == drained.replica_id)
    assert np.all(~np.isnan(rec.finish_s))  # everything finished, the drained one's too
    assert drained.state is ReplicaState.GONE
    assert drained.gone_s == pytest.approx(max(30.0, float(np.max(rec.finish_s[before]))))


def test_gpu_seconds_count_from_request_to_gone() -> None:
    fleet = Fleet(initial_replicas=1, cold_start_s=45.0)
    fleet.scale_to(2, 100.0)  # requested at 100, ready at 145
    fleet.advance_to(120.0)
    assert fleet.ready_replicas == 1 and fleet.total_replicas == 2
    fleet.scale_to(3, 120.0)  # another one, still cold at 130
    fleet.scale_to(2, 130.0)  # cancels the newest not-ready replica (requested at 120)
    assert fleet.replicas[2].state is ReplicaState.GONE and fleet.replicas[2].gone_s == 130.0
    assert fleet.replicas[1].state is ReplicaState.STARTING
    fleet.scale_to(1, 200.0)  # both idle serving: the newest drains, gone at once
    assert fleet.replicas[1].gone_s == 200.0
    fleet.advance_to(300.0)
    # replica 0: 300 s; replica 1: 100 s (45 of them cold); replica 2: 10 s
    assert fleet.gpu_seconds() == pytest.approx(300.0 + 100.0 + 10.0)
    assert fleet.timeline() == [
        (0.0, 1, 1),
        (100.0, 1, 2),
        (120.0, 1, 3),
        (130.0, 1, 2),
        (145.0, 2, 2),
        (200.0, 1, 1),
    ]
    series = fleet.replica_series(50.0)
    assert series[:, 1].tolist() == [1, 1, 1, 2, 1, 1, 1]


def test_knobs_apply_to_replicas_started_afterwards() -> None:
    k1, k2 = Knobs(64, 2048), Knobs(128, 4096)
    fleet = Fleet(knobs=k1, initial_replicas=1, cold_start_s=5.0)
    fleet.set_knobs(k2)
    fleet.scale_to(2, 1.0)
    fleet.advance_to(10.0)
    engines = dict(fleet.live_engines())
    assert (engines[0].mns, engines[0].mnbt) == (64, 2048)
    assert (engines[1].mns, engines[1].mnbt) == (128, 4096)
    with pytest.raises(ValueError, match="max_num_seqs"):
        fleet.set_knobs(Knobs(512, 256))


def test_live_knobs_reach_serving_and_starting_replicas() -> None:
    k1, k2 = Knobs(64, 2048), Knobs(16, 1024)
    fleet = Fleet(knobs=k1, initial_replicas=2, cold_start_s=5.0, live_knobs=True)
    fleet.scale_to(3, 0.0)  # replica 2 starts, requested with k1
    fleet.advance_to(1.0)
    fleet.set_knobs(k2)
    engines = dict(fleet.live_engines())
    assert sorted(engines) == [0, 1]
    assert all((e.mns, e.mnbt) == (16, 1024) for e in engines.values())  # at once
    fleet.advance_to(10.0)
    engines = dict(fleet.live_engines())
    assert sorted(engines) == [0, 1, 2]
    assert (engines[2].mns, engines[2].mnbt) == (16, 1024)  # ready with the new knobs
    assert fleet.outdated_replicas() == 0
    with pytest.raises(ValueError, match="max_num_seqs"):
        fleet.set_knobs(Knobs(512, 256))
    assert all(e.knobs == k2 for e in engines.values())


def test_least_outstanding_routing_balances() -> None:
    fleet = Fleet(initial_replicas=3)
    tr = Trace.from_arrays(np.zeros(30), np.full(30, 500), np.full(30, 200))
    fleet.submit_trace(tr)
    fleet.advance_to(0.0)
    loads = sorted(e.n_out for _, e in fleet.live_engines())
    assert loads == [10, 10, 10]


def _after_a_long_request(router: str, seed: int = 0) -> list[int]:
    """Outstanding requests per replica (in replica order) after one long request on
    replica 0 and then 40 short ones at once, behind `router`."""
    fleet = Fleet(initial_replicas=2, router=router, seed=seed)
    n = 41
    tr = Trace.from_arrays(
        np.r_[0.0, np.full(n - 1, 0.001)], np.full(n, 100), np.r_[4000, np.full(n - 1, 500)]
    )
    fleet.submit_trace(tr)
    fleet.advance_to(0.001)
    return [e.n_out for _, e in fleet.live_engines()]


def test_random_routing_ignores_load_and_least_outstanding_does_not() -> None:
    """kube-proxy's random endpoint: each request lands on any SERVING replica, however
    much the other holds; the least-outstanding router evens the count out (the 41st
    request goes to the replica without the long one). Seeded: the same split twice."""
    assert _after_a_long_request("least-outstanding") == [21, 20]
    split = _after_a_long_request("random")
    assert sum(split) == 41 and split != [21, 20] and min(split) >= 10
    assert _after_a_long_request("random") == split
    assert _after_a_long_request("random", seed=1) != split


def test_an_unknown_router_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="router must be one of least-outstanding, random"):
        Fleet(router="round-robin")


def test_scale_down_drains_while_starting_cancelled_first() -> None:
    fleet = Fleet(initial_replicas=2, cold_start_s=60.0)
    fleet.scale_to(4, 10.0)
    fleet.scale_to(2, 20.0)
    states = [r.state for r in fleet.replicas]
    assert states == [
        ReplicaState.SERVING,
        ReplicaState.SERVING,
        ReplicaState.GONE,
        ReplicaState.GONE,
    ]


def test_simulated_time_cannot_go_back() -> None:
    fleet = Fleet()
    fleet.advance_to(10.0)
    with pytest.raises(ValueError):
        fleet.advance_to(5.0)
    with pytest.raises(ValueError):
        fleet.submit(1.0, 10, 10)


def test_run_to_completion_and_stats() -> None:
    fleet = Fleet(initial_replicas=2)
    tr = synthetic("poisson", seed=1, rate=10.0, duration=30.0)
    ids = fleet.submit_trace(tr)
    fleet.run()
    st = fleet.stats()
    assert st.submitted == st.completed == len(ids) == len(tr)
    assert st.refused == 0 and st.steps > 0
    rec = fleet.records()
    assert np.all(rec.finish_s >= rec.first_token_s)
    assert np.all(rec.first_token_s > rec.arrival_s)
    assert not math.isnan(float(np.nanmean(rec.mean_itl_s)))


def _run(with_source: bool, seed: int = 5) -> np.ndarray:
    from simulator.metrics import SimulatedSource

    fleet = Fleet(initial_replicas=2, cold_start_s=(20.0, 40.0), seed=seed)
    if with_source:
        SimulatedSource(fleet, "m", scrape_interval_s=0.7)
    fleet.submit_trace(synthetic("flash-crowd", seed=seed, base=8.0, duration=300.0))
    for t in (60.0, 120.0, 180.0):
        fleet.advance_to(t)
        fleet.scale_to(int(t // 50), t)
    fleet.run()
    rec = fleet.records()
    return np.column_stack([rec.first_token_s, rec.finish_s, rec.replica, rec.preemptions])


def test_scrapes_do_not_perturb_the_simulation() -> None:
    """Exact syncs (which split decode jumps) change nothing but float rounding."""
    np.testing.assert_allclose(_run(True), _run(False), rtol=1e-9, atol=1e-9)


def test_fleet_is_deterministic_for_a_seed() -> None:
    assert np.array_equal(_run(False, seed=3), _run(False, seed=3))
