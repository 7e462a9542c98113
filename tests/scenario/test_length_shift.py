"""Request lengths that shift, on the simulated plant: a steady 40 req/s whose outputs
(or prompts) grow at minute 10 (`governor simulate --trace synthetic:length-shift:rate=40`,
seed 0, start at one replica, 15 s scrape). The length histograms count requests as they
finish and the belief smooths them over a 300 s half-life; a window that reads past the
belief for 30 s (controller.knobstep.risen_length) and the outputs in flight
(controller.knobstep.inflight_output_tokens) replace it (docs/decider-history.md,
"Request lengths that shift")."""

from __future__ import annotations

import pytest

from controller.config import SLA
from controller.knobstep import KnobSteps
from controller.types import LengthRises
from simulator.scenario import PolicyResult, Scenario, run_policy
from simulator.traces import load_trace


def _run(spec: str, monkeypatch: pytest.MonkeyPatch, grown: bool) -> PolicyResult:
    """The governor on `spec`; with `grown` False the belief is the smoothed one alone."""
    trace = load_trace(spec, seed=0)
    scenario = Scenario(trace=trace, sla=SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0))
    with monkeypatch.context() as m:
        if not grown:
            m.setattr(
                KnobSteps,
                "_grown",
                lambda self, obs, state, now_s, new, smoothed: (smoothed, LengthRises()),
            )
        return run_policy("governor", scenario)


def test_longer_outputs_keep_a_fleet_from_stepping_down_into_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outputs 4x longer: 94.77 % within the SLA, no flap (the misses are the start-up's
    first minute). With the smoothed histogram alone the belief reached 184 tokens of 676
    by 660 s, the fleet stepped down 6 -> 4 there as the cooldown ended, and back up:
    86.37 %, one flap, more GPU-hours."""
    on = _run("synthetic:length-shift:rate=40", monkeypatch, grown=True)
    off = _run("synthetic:length-shift:rate=40", monkeypatch, grown=False)
    assert 100.0 * on.slo_attainment == pytest.approx(94.77, abs=0.01)
    assert 100.0 * off.slo_attainment == pytest.approx(86.37, abs=0.01)
    assert (on.flaps, off.flaps) == (0, 1)
    assert on.gpu_hours < off.gpu_hours


def test_longer_prompts_are_believed_once_the_windows_read_them_for_30_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prompts 2x longer: smoothed alone, the belief crawled (300 s half-life) while the
    fleet grew on its queue and stepped back (one flap): 93.62 %. The windows read past
    1.5x the belief from 625 s, and it is theirs at 655 s: 93.92 %, no flap, for 16 %
    more GPU-hours (a fleet sized for the prompts it serves)."""
    spec = "synthetic:length-shift:rate=40,prompt_x=2,output_x=1"
    on = _run(spec, monkeypatch, grown=True)
    off = _run(spec, monkeypatch, grown=False)
    assert 100.0 * on.slo_attainment == pytest.approx(93.92, abs=0.01)
    assert 100.0 * off.slo_attainment == pytest.approx(93.62, abs=0.01)
    assert (on.flaps, off.flaps) == (0, 1)


def test_a_shift_takes_back_the_correction_learned_on_the_old_lengths() -> None:
    """An hour at 40 req/s from 4 replicas, outputs 4x longer from 1,800 s: the
    capacity correction grows past 1 on the conversation's lengths (the model shown
    pessimistic) and is brought to 1 on the tick the longer outputs replace the
    belief (controller.knobstep.lengths_replaced). Held through the shift, 1.125 sized
    the recovering fleet and minute 32's TTFT p95 read 2.4 s (96.84 % over the hour);
    brought to 1, 352 ms and 97.33 % (docs/decider-history.md, "A shift takes the
    correction back to 1")."""
    trace = load_trace("synthetic:length-shift:rate=40,duration=3600", seed=0)
    scenario = Scenario(trace=trace, sla=SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0), start_replicas=4)
    corrections: dict[int, float] = {}

    def on_tick(t: float, policy: object) -> None:
        latest = policy.capture.latest  # type: ignore[attr-defined]
        if latest is not None:
            corrections[int(t // 60)] = latest.capacity_correction

    res = run_policy("governor", scenario, on_tick=on_tick)
    assert corrections[29] > 1.1  # learned on the old lengths
    assert corrections[31] == 1.0  # the shift read, the correction taken back
    assert corrections[50] > 1.0  # and grown again on the new lengths' evidence
    assert res.series["ttft_p95_by_minute"][32] < 500.0
    assert 100.0 * res.slo_attainment == pytest.approx(97.33, abs=0.01)
    assert res.flaps == 0
