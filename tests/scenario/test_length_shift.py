"""Request lengths that shift, on the simulated plant: outputs 4x longer at minute 10 of
a steady 40 req/s (`governor simulate --trace synthetic:length-shift:rate=40`, seed 0,
start at one replica, 15 s scrape). The output histogram counts requests as they finish
and reads the short ones for minutes; the outputs in flight (controller.knobstep.
inflight_output_tokens) show the long ones within 15 s (docs/decider-history.md,
"Request lengths that shift")."""

from __future__ import annotations

import pytest

from controller.config import SLA
from controller.knobstep import KnobSteps
from simulator.scenario import Scenario, run_policy
from simulator.traces import load_trace


def _shift() -> Scenario:
    trace = load_trace("synthetic:length-shift:rate=40", seed=0)
    return Scenario(trace=trace, sla=SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0))


def test_outputs_in_flight_keep_a_fleet_from_stepping_down_into_longer_outputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the outputs in flight: 94.55 % within the SLA, no flap (the misses are the
    start-up's first minute). With the smoothed histogram alone the belief reached 184
    tokens of 676 by 660 s, the fleet stepped down 6 -> 4 there as the cooldown ended,
    and back up: 87.00 %, one flap, more GPU-hours."""
    on = run_policy("governor", _shift())
    monkeypatch.setattr(
        KnobSteps, "_inflight", lambda self, obs, state, now_s, smoothed: (smoothed, None)
    )
    off = run_policy("governor", _shift())
    assert 100.0 * on.slo_attainment == pytest.approx(94.55, abs=0.01)
    assert 100.0 * off.slo_attainment == pytest.approx(87.00, abs=0.01)
    assert (on.flaps, off.flaps) == (0, 1)
    assert on.gpu_hours < off.gpu_hours
