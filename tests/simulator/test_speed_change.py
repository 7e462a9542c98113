"""A plant that changes under the controller: `Plant.speed_change` (at_s, speed) slows or
speeds every engine's steps from `at_s` on (`Engine.set_profile`, `Fleet.set_profile`),
the oracle sizes each window on the plant in force through it, `--plant-speed-change`
refuses what it cannot read, and the matrix's "slows 1.3x midway" condition puts the
change at half the trace (whole minutes)."""

from __future__ import annotations

import math

import pytest

from controller.config import SLA
from controller.types import Knobs
from estimators.stepmodel import load_profile
from service.cli import main
from simulator.fleet import Fleet
from simulator.matrix import CONDITIONS, Condition, MatrixSpec, midway_s, scenario_for
from simulator.oracle import oracle, scenario_oracle
from simulator.plant import Plant
from simulator.scenario import Scenario, run_policy
from simulator.traces import Trace, load_trace

SLA_STD = SLA(ttft_p95_ms=500, itl_p95_ms=50)


def _two_requests(change: tuple[float, float] | None) -> tuple[float, float]:
    """(finish time of a request decoding across t = 2 s, TTFT of a 2,000-token prompt
    arriving at t = 10 s) on one replica, the plant changed per `change`, seconds."""
    plant = Plant(speed_change=change)
    belief = load_profile()
    fleet = Fleet(plant.profile(belief), initial_replicas=1)
    fleet.submit(0.0, 100, 600)
    fleet.submit(10.0, 2000, 2)
    moved = plant.changed_profile(belief)
    if moved is not None:
        fleet.advance_to(moved[0])
        fleet.set_profile(moved[1], moved[0])
    fleet.run()
    rec = fleet.records()
    return float(rec.finish_s[0]), float(rec.ttft_s[1])


def test_steps_after_the_change_take_the_new_speed() -> None:
    """A 600-token decode from t ~ 0 runs ~6 s; with the plant 1.5x slower from 2 s on,
    its remaining ~4 s take 1.5x (a decode jump in flight is cut at the change), and a
    prompt arriving after the change prefills 1.5x slower."""
    finish, ttft = _two_requests(None)
    assert finish > 4.0  # the request really runs across the change
    slow_finish, slow_ttft = _two_requests((2.0, 1.5))
    assert slow_finish - 2.0 == pytest.approx(1.5 * (finish - 2.0), rel=0.01)
    assert slow_ttft == pytest.approx(1.5 * ttft, rel=0.01)


def test_replicas_started_after_the_change_run_the_new_profile() -> None:
    belief = load_profile()
    slow = Plant(speed_change=(10.0, 1.3)).changed_profile(belief)
    assert slow is not None and slow[0] == 10.0
    fleet = Fleet(belief, initial_replicas=1, cold_start_s=5.0)
    fleet.set_profile(slow[1], 10.0)
    fleet.scale_to(2, 10.0)
    fleet.advance_to(20.0)
    engines = [e for _, e in fleet.live_engines()]
    assert len(engines) == 2 and all(e.profile is slow[1] for e in engines)
    assert slow[1].step_time.per_token_ms == pytest.approx(1.3 * belief.step_time.per_token_ms)


@pytest.mark.parametrize(
    "change",
    [(-1.0, 1.3), (math.nan, 1.3), (10.0, 0.0), (10.0, math.inf)],
    ids=["negative-time", "nan-time", "zero-speed", "inf-speed"],
)
def test_plant_refuses_a_bad_speed_change(change: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="speed_change must be"):
        Plant(speed_change=change)


def test_describe_names_the_change_only_where_there_is_one() -> None:
    belief = load_profile()
    assert "speed_change_at_s" not in Plant().describe(belief)
    d = Plant(speed_change=(60.0, 1.3)).describe(belief)
    assert d["speed_change_at_s"] == 60.0 and d["speed_after"] == 1.3


@pytest.mark.parametrize("text", ["1800", "x:1.3", "-5:1.3", "60:0", "60:nan", "60:"])
def test_simulate_refuses_a_bad_speed_change_flag(
    text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", f"--plant-speed-change={text}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--plant-speed-change must be AT_S:F" in err and text in err


def test_the_oracle_sizes_each_window_on_the_plant_in_force() -> None:
    """60 req/s over three minutes, the plant 1.6x slower from 120 s: the first two
    windows need what the profile's plant needs, the third what the slow plant needs
    (more); a change inside a window sizes it on the faster plant (a lower bound),
    whichever side of the change that is."""
    p, k = load_profile(), Knobs(160, 2560)
    trace = load_trace("synthetic:poisson:rate=60,duration=180", seed=1)
    slow = Plant(speed=1.6).profile(p)
    fast_counts = oracle(trace, p, k, SLA_STD, workers=1).replicas
    slow_counts = oracle(trace, slow, k, SLA_STD, workers=1).replicas
    assert slow_counts[2] > fast_counts[2]
    sc = Scenario(trace=trace, sla=SLA_STD, plant=Plant(speed_change=(120.0, 1.6)))
    assert scenario_oracle(sc, workers=1).replicas == [*fast_counts[:2], slow_counts[2]]
    split = oracle(trace, p, k, SLA_STD, workers=1, change=(150.0, slow)).replicas
    assert split == fast_counts
    sped_up = oracle(trace, slow, k, SLA_STD, workers=1, change=(150.0, p)).replicas
    assert sped_up == [*slow_counts[:2], fast_counts[2]]  # the split minute: the faster


def test_midway_is_half_the_span_in_whole_minutes() -> None:
    def spanning(span_s: float) -> Trace:
        return Trace.from_arrays([0.0, span_s], [10, 10], [5, 5], rebase=False)

    assert midway_s(spanning(1199.7)) == 540.0
    assert midway_s(spanning(3600.0)) == 1800.0
    mid = next(c for c in CONDITIONS if c.speed_midway is not None)
    assert mid.speed_midway == 1.3 and mid.plant_text == "1 -> 1.3"
    diurnal = next(t for t in MatrixSpec().traces if t.key == "diurnal")
    sc = scenario_for(MatrixSpec(), diurnal, mid)
    assert sc.plant.speed_change == (midway_s(sc.trace), 1.3) and sc.plant.speed == 1.0


def test_the_governor_learns_a_plant_that_slows_midway() -> None:
    """Diurnal, the plant 1.3x slower from 540 s: the speed the governor learned after
    the change (median, PolicyResult.learned_speed) is within 5 % of 1.3, and the run
    still meets 99 % of the requests."""
    diurnal = next(t for t in MatrixSpec().traces if t.key == "diurnal")
    cond = Condition("slows 1.3x midway", speed_midway=1.3)
    res = run_policy("governor", scenario_for(MatrixSpec(), diurnal, cond))
    assert res.learned_speed == pytest.approx(1.3, rel=0.05)
    assert res.slo_attainment >= 0.99
