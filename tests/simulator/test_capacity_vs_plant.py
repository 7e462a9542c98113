"""The decider's capacity model (controller.capacity) against the simulated plant: one
warm replica fed Poisson arrivals at the capacity the decider sizes with (the model x
the default 0.85 target utilization) meets the 99 % goal, and 40 % more misses it. The
fluid model it replaced put this replica at 17.8 x 0.85 = 15.2 req/s, where the plant
meets the SLA for ~95 % of the requests.

On long-context lengths (prompts mean ~12k, p95 ~40k) the model errs the safe way, and
by how much is pinned too: four replicas with the knobs the governor picks (16 / 1,280)
meet the goal at the model's capacity (0.465 req/s per replica at 0.85; 0.547 without)
and up to 1.6x that (0.74, 99.2 %), and miss it at 2x (0.93, 97.3 %). The bound that
binds is the ITL tail's single big prompt (controller.capacity, step 2), which charges a
median-length decode the whole prefill of a ~p99 prompt: a 99th-percentile ITL of 70 ms
at 0.74 req/s per replica where the plant's is 41 ms (halving that bound would put the
model at 0.89). That headroom is part of why the governor holds 7 replicas at the
long-context trace's peak (~3.1 req/s) where a static 4 meets the goal over the trace;
on that trace's own lengths the model reads 0.644 and the plant 0.727 on four replicas
(docs/capacity.md), and the target utilization and the deadband's headroom do the rest.

On short prompts (vLLM's CPU build serving a tiny model: 32-token prompts, engines
shaped as the real-engine test learns them) the model's mean step is the plant's within
5 % and its capacity is where the plant stops keeping up."""

from __future__ import annotations

import numpy as np
import pytest

from controller.capacity import capacity_rps, operating_point
from controller.config import SLA
from controller.plant import scaled_profile
from controller.types import Knobs, Lengths
from estimators.stepmodel import Profile, load_profile
from simulator.fleet import Fleet
from simulator.requests import RequestRecords
from simulator.scenario import Scenario, governor_knobs_for, slo_met, trace_lengths
from simulator.traces import Trace, synthetic

OVERHEAD_S = load_profile().request_overhead_ms / 1000.0
"""The profile's calibrated per-request overhead (the plant's), seconds."""


def _attainment(rate: float, sc: Scenario) -> float:
    tr = synthetic("poisson", seed=1, rate=rate, duration=300.0)
    knobs = governor_knobs_for(tr, sc)
    fleet = Fleet(sc.profile, knobs=knobs, initial_replicas=1, seed=0, overhead_s=OVERHEAD_S)
    fleet.submit_trace(tr, offset_s=0.0)
    fleet.run()
    return float(slo_met(fleet.records(), sc.sla).mean())


def test_one_replica_meets_the_goal_at_the_model_capacity_and_not_far_above() -> None:
    sla = SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0)
    probe = synthetic("poisson", seed=1, rate=10.0, duration=300.0)
    sc = Scenario(trace=probe, sla=sla)
    cap = capacity_rps(governor_knobs_for(probe, sc), trace_lengths(probe), sla, sc.profile, 0.85)
    assert 9.0 < cap < 13.0
    assert _attainment(cap, sc) >= 0.99
    assert _attainment(1.4 * cap, sc) < 0.99


def _long_context(fleet_rps: float) -> Trace:
    """15 minutes of Poisson arrivals (req/s over the fleet) with long-context lengths."""
    return synthetic("long-context", seed=1, mean=fleet_rps, amplitude=0.0, duration=900.0)


def test_four_replicas_meet_the_goal_on_long_prompts_with_the_headroom_pinned() -> None:
    sla = SLA(ttft_p95_ms=15_000.0, itl_p95_ms=50.0)
    probe = _long_context(2.0)
    sc = Scenario(trace=probe, sla=sla)
    knobs = governor_knobs_for(probe, sc)
    cap = capacity_rps(knobs, trace_lengths(probe), sla, sc.profile, 0.85, replicas=4)
    assert 0.40 < cap < 0.55

    def attainment(per_replica_rps: float) -> float:
        tr = _long_context(4 * per_replica_rps)
        fleet = Fleet(sc.profile, knobs=knobs, initial_replicas=4, seed=0, overhead_s=OVERHEAD_S)
        fleet.submit_trace(tr, offset_s=0.0)
        fleet.run()
        return float(slo_met(fleet.records(), sla).mean())

    assert attainment(cap) >= 0.99
    assert attainment(1.6 * cap) >= 0.99  # the model's headroom on long prompts (doc)
    assert attainment(2.0 * cap) < 0.99


# Engines shaped like vLLM's CPU build serving a tiny model (tests/engine): the profile's
# steps x 2.37, its per-sequence costs x 6.11 more (a learned belief of
# docs/real-engine-runs.md), 32-token prompts, 16-token outputs, knobs 32 / 2,048.
SHORT_SLA = SLA(ttft_p95_ms=2_500.0, itl_p95_ms=300.0, attainment_goal_frac=0.95)
SHORT_LENGTHS = Lengths(32.0, 32.0, 16.0, 16.0)
SHORT_KNOBS = Knobs(32, 2048)


def _short_fleet(rate: float) -> RequestRecords:
    """One replica of the CPU-shaped plant fed 120 s of Poisson arrivals at `rate`
    req/s of 32-token prompts and 16-token outputs."""
    rng = np.random.default_rng(1)
    n = int(rate * 120.0)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    trace = Trace(arrivals, np.full(n, 32), np.full(n, 16), "short")
    fleet = Fleet(_cpu_shaped(), knobs=SHORT_KNOBS, initial_replicas=1, seed=0, overhead_s=0.0)
    fleet.submit_trace(trace, offset_s=0.0)
    fleet.run()
    return fleet.records()


def _cpu_shaped() -> Profile:
    return scaled_profile(load_profile(), 2.37, 6.11)


@pytest.mark.parametrize("rate", [20.0, 40.0, 60.0])
def test_short_prompts_step_time_is_the_plants(rate: float) -> None:
    """Prompts whose prefill fits within the step-time floor's slack (32 tokens: 1.7 ms
    of work against 10 ms of slack) leave a chunk step at the floor. The model's mean
    step is the plant's mean ITL within 5 %; when it subtracted the whole slack of every
    chunk step it read 17.3 ms at each of these rates where the plant ran 19.1-22.9."""
    op = operating_point(rate, SHORT_KNOBS, SHORT_LENGTHS, SHORT_SLA, _cpu_shaped())
    assert op is not None
    rec = _short_fleet(rate)
    itl = rec.mean_itl_s[rec.done]
    assert op.step_ms == pytest.approx(float(np.mean(itl)) * 1000.0, rel=0.05)


def test_short_prompts_capacity_is_where_the_plant_stops_keeping_up() -> None:
    """The model's capacity on short prompts (before the 0.85 target utilization) is
    where the plant's 32 slots stop keeping up: one replica meets the goal there and
    misses it 15 % past it. With the whole floor slack subtracted the model said
    93.8 req/s, where the plant had 12 % of requests within the SLA (TTFT p95 20 s)."""
    cap = capacity_rps(SHORT_KNOBS, SHORT_LENGTHS, SHORT_SLA, _cpu_shaped(), 1.0)
    assert 70.0 < cap < 85.0
    goal = SHORT_SLA.attainment_goal_frac
    assert float(slo_met(_short_fleet(cap), SHORT_SLA).mean()) >= goal
    assert float(slo_met(_short_fleet(1.15 * cap), SHORT_SLA).mean()) < goal
