"""The capacity correction past 1 (controller.feedback.next_correction): a model shown
pessimistic by a loaded fleet that meets the SLA with margin spends the target
utilization's headroom, slowly, and no more."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controller.decider import Decider
from controller.feedback import (
    CORRECTION_DECAY_PER_S,
    CORRECTION_GAIN_PER_S,
    CORRECTION_MAX,
    CORRECTION_RECOVERY_PER_S,
    correction_ceiling,
    next_correction,
)
from controller.types import PlantBelief, Reason
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import long_history
from tests.unit.test_decider import run

HEALTHY = {"ttft_attainment_frac": 1.0, "itl_attainment_frac": 1.0}


def test_the_ceiling_is_the_uncorrected_models_capacity_at_the_sla() -> None:
    assert correction_ceiling(0.85) == pytest.approx(1 / 0.85)
    assert correction_ceiling(1.0) == 1.0  # no headroom kept, none to spend
    assert correction_ceiling(0.2) == CORRECTION_MAX


def test_past_one_it_grows_at_a_quarter_of_the_recovery_pace() -> None:
    ceiling = correction_ceiling(0.85)
    # (c, dt, violated, healthy, judge, loaded, ceiling, complete)
    assert next_correction(0.9, 100.0, False, True, True, True, ceiling, True) == pytest.approx(
        0.9 + 100 * CORRECTION_RECOVERY_PER_S
    )
    assert next_correction(0.99, 600.0, False, True, True, True, ceiling, True) == 1.0
    assert next_correction(1.0, 600.0, False, True, True, True, ceiling, True) == pytest.approx(
        1.0 + 600 * CORRECTION_RECOVERY_PER_S / 4
    )
    assert next_correction(1.17, 600.0, False, True, True, True, ceiling, True) == ceiling
    # healthy but lightly loaded: proves nothing about the limit
    assert next_correction(1.1, 600.0, False, True, True, False, ceiling, True) == 1.1
    # past 1 only where a cut could be judged too, on complete data; below 1 as before
    assert next_correction(1.0, 600.0, False, True, False, True, ceiling, True) == 1.0
    assert next_correction(1.0, 600.0, False, True, True, True, ceiling, False) == 1.0
    assert next_correction(0.9, 100.0, False, True, False, True, ceiling, False) > 0.9
    # a violation takes it back at the usual pace
    assert next_correction(1.15, 60.0, True, False, True, True, ceiling, True) == pytest.approx(
        1.15 * math.exp(-60 * CORRECTION_DECAY_PER_S)
    )


def test_a_lowered_ceiling_holds_at_once() -> None:
    """An operator who raises the target utilization to 1 keeps no headroom to spend:
    a correction learned past 1 is brought to 1 on the next tick, evidence or not."""
    assert next_correction(1.15, 5.0, False, False, True, False, 1.0, True) == 1.0
    assert next_correction(1.15, 5.0, False, True, True, True, 1.0, True) == 1.0


def test_a_pessimistic_model_spends_the_headroom_slowly_and_no_more() -> None:
    """Through the decider: 10 loaded, healthy minutes grow the correction by about
    600 x CORRECTION_GAIN_PER_S; 30 more reach 1 / the target utilization and stop
    there; one violated minute takes it back below 1."""
    policy = make_policy()
    d = Decider(make_model(), policy)
    s = replace(d.initial_state(4), health=long_history())
    # 60 req/s, healthy: the knobs settle at 120 s and the fleet goes 4 -> 5 replicas of
    # ~13.6 req/s at the target; past that scale-up's dead time the fleet is loaded
    # (>= 80 % of 5 x 13.6 x the correction) and judged whole.
    decs, s = run(d, s, [60.0] * 60, **HEALTHY)
    assert {x.replicas for x in decs[30:]} == {5}
    before = s.plant.capacity_correction
    _, s = run(d, s, [60.0] * 120, start=ORIGIN_S + 300, **HEALTHY)
    gained = s.plant.capacity_correction - before
    assert 0.9 * 600 * CORRECTION_GAIN_PER_S <= gained <= 600 * CORRECTION_GAIN_PER_S + 1e-9
    # Loaded is judged against the corrected capacity: 68 req/s stays loaded to the top.
    decs, s = run(d, s, [68.0] * 360, start=ORIGIN_S + 900, **HEALTHY)
    assert s.plant.capacity_correction == pytest.approx(correction_ceiling(0.85))
    assert decs[-1].capacity_correction == pytest.approx(1 / policy.target_utilization_frac)
    violated = {"ttft_attainment_frac": 0.5, "itl_attainment_frac": 1.0}
    _, s = run(d, s, [68.0] * 12, start=ORIGIN_S + 2700, **violated)
    assert s.plant.capacity_correction < 1.0


def test_a_fleet_with_a_target_down_or_no_queue_gauge_teaches_no_gain() -> None:
    """Growth lowers replicas: a window with an engine target down or the waiting gauge
    absent (partial data, which holds a scale-down) grows nothing past 1."""
    for partial in ({"targets_down": 1}, {"waiting": None}):
        d = Decider(make_model(), make_policy())
        s = replace(d.initial_state(4), health=long_history())
        _, s = run(d, s, [60.0] * 120, **HEALTHY, **partial)
        assert s.plant.capacity_correction == 1.0, partial


def test_a_correction_past_1_shows_as_sla_feedback_and_a_raised_target_takes_it_back() -> None:
    """The fleet a correction of 1.15 sized reads SLA_FEEDBACK (not CAPACITY); with the
    target utilization raised to 1 (no headroom kept) the next tick runs at 1."""
    learned = PlantBelief(capacity_correction=1.15)
    d = Decider(make_model(), make_policy())
    s = replace(d.initial_state(4), plant=learned, health=long_history())
    decs, _ = run(d, s, [60.0] * 2)
    assert decs[-1].capacity_correction == pytest.approx(1.15, abs=0.01)
    assert Reason.SLA_FEEDBACK in decs[-1].reasons
    full = Decider(make_model(), make_policy(target_utilization_frac=1.0))
    s = replace(full.initial_state(4), plant=learned, health=long_history())
    decs, _ = run(full, s, [60.0])
    assert decs[-1].capacity_correction == 1.0
    assert Reason.CAPACITY in decs[-1].reasons
