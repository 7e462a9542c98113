"""Online calibration, closed loop: the speed the governor learns of the simulated plant
(controller.plant, reported per run as `PolicyResult.learned_speed`) against the plant's
own. On the diurnal trace (Poisson arrivals, lognormal lengths: what the step model's
speed sample assumes) the median learned over the run is within 5 % of the plant at
every speed of the matrix. The code and long-context traces are not held to it (their
learned speeds are in the README's matrix table, off by up to 42 %: see "Robustness
matrix")."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.matrix import CONDITIONS, Condition, MatrixSpec, scenario_for
from simulator.scenario import run_policy

DIURNAL = next(t for t in MatrixSpec().traces if t.key == "diurnal")
LONG = next(t for t in MatrixSpec().traces if t.key == "long-context")
DEFAULT = CONDITIONS[0]
COLD_2X = next(c for c in CONDITIONS if c.cold_start_factor == 2.0)


@pytest.mark.parametrize("speed", [0.7, 1.0, 1.3])
def test_the_governor_learns_the_plant_speed_on_diurnal(speed: float) -> None:
    cond = dataclasses.replace(DEFAULT, name=f"speed {speed}", plant_speed=speed)
    res = run_policy("governor", scenario_for(MatrixSpec(), DIURNAL, cond))
    assert res.learned_speed is not None
    assert res.learned_speed == pytest.approx(speed, rel=0.05)


@pytest.mark.parametrize("cond", [DEFAULT, COLD_2X], ids=lambda c: c.name)
def test_the_governor_learns_the_plant_speed_on_long_context(cond: Condition) -> None:
    res = run_policy("governor", scenario_for(MatrixSpec(), LONG, cond))
    assert res.learned_speed is not None
    assert res.learned_speed == pytest.approx(1.0, rel=0.15)


def test_baselines_learn_no_speed() -> None:
    """A baseline believes no profile: its result says none (the table's "-")."""
    res = run_policy("hpa-queue", scenario_for(MatrixSpec(), DIURNAL, DEFAULT))
    assert res.learned_speed is None and res.summary()["learned_speed"] is None
