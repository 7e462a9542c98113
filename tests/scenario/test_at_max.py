"""A fleet capped below its load, on the simulated plant: the knobs for throughput at
the max replicas (controller.batching.throughput_knobs, KNOBS_THROUGHPUT) against the
`slo` knobs the governor kept there before (docs/decider-history.md, "A fleet at its
max replicas"). Seeded: the first 10 minutes of conversation x4 on at most one replica
(`governor simulate --trace azure:conv --rate-scale 4 --duration 600 --max-replicas 1`)."""

from __future__ import annotations

import pytest

from controller.config import SLA
from controller.knobstep import KnobSteps
from simulator.scenario import Scenario, run_policy
from simulator.traces import load_trace


def _capped() -> Scenario:
    trace = load_trace("azure:conv", rate_multiplier=4.0, duration_s=600.0, seed=0)
    return Scenario(trace=trace, sla=SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0), max_replicas=1)


def test_throughput_knobs_drain_a_capped_fleets_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """One replica for a load that needs two: a queue stands from the first minute. On
    the knobs for throughput 35.80 % of the requests meet the SLA (peak queue 359); on
    the slo knobs 18.93 % (818)."""
    on = run_policy("governor", _capped())
    monkeypatch.setattr(KnobSteps, "_short_at_max", lambda self, state: False)
    off = run_policy("governor", _capped())
    assert 100.0 * on.slo_attainment == pytest.approx(35.80, abs=0.01)
    assert 100.0 * off.slo_attainment == pytest.approx(18.93, abs=0.01)
    assert on.peak_queue < off.peak_queue
