"""A fleet that never drains its queue still learns how slow its engines are
(controller.plant.window_parts' `step_priced`, learn_plant's `standing_parts`,
Decider._standing_queue): a window queued at the engines' limit, priced at the tokens
its steps ran, may jump the speed to a much slower plant; it never averages."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controller.decider import Decider
from controller.plant import (
    learn_plant,
    window_parts,
    window_speed,
)
from controller.types import Knobs, Lengths, ModelState, PlantBelief
from estimators.stepmodel import load_profile
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import itl_reading, long_history, obs

PROFILE = load_profile("llama-3.1-8b-h100")
LENGTHS = Lengths(1155.0, 4083.0, 211.0, 451.0)
BUDGET = 8192
KNOBS = Knobs(max_num_seqs=64, max_num_batched_tokens=BUDGET)
# 4 replicas at 40 req/s (both windows) with 40 requests waiting each, but under half
# of every limit spent: 20 of their 64 slots, 500 of 8,192 tokens a step (20 of them
# decodes) and 30 % of the KV cache (a queue in transit)
QUEUED = {
    "rate": 40.0,
    "arrival_rate_short_rps": 40.0,
    "running": 80.0,
    "waiting": 160.0,
    "ready_replicas": 4,
    "step_tokens_mean": 500.0,
    "kv_usage_frac": 0.3,
}


def _standing_speed(itl: float, **kw: float) -> float | None:
    o = obs(itl_mean_ms=itl, **{**QUEUED, **kw})
    parts = window_parts(o, LENGTHS, PROFILE, 60.0, BUDGET, math.inf, step_priced=True)
    return window_speed(parts, 1.0)


def _itl_for(speed: float, **kw: float) -> float:
    """The mean ITL (ms) at which a QUEUED window (`kw` overriding), step-priced,
    reads `speed`."""
    return itl_reading(lambda itl: _standing_speed(itl, **kw), speed)


def test_step_pricing_agrees_with_arrival_pricing_where_both_see_the_same_chunks() -> None:
    """A step's prefill tokens past its decodes, over a chunk, are the share of steps
    that carry one: where the arrival rate brings exactly that many chunks a step, both
    pricings read the window alike; with the engines admitting fewer than arrive (a
    queue) they part, and only the step tokens say what ran."""
    itl, n = 20.0, 4
    b = QUEUED["running"] / n
    f = 40.0 / n * 1 * itl / 1000.0  # one chunk a prompt: 0.2 of the steps carry one
    kw = {**QUEUED, "waiting": 0.0, "step_tokens_mean": b + f * LENGTHS.prompt_mean}
    o = obs(itl_mean_ms=itl, **kw)
    by_arrival = window_parts(o, LENGTHS, PROFILE, 60.0, BUDGET)
    by_steps = window_parts(o, LENGTHS, PROFILE, 60.0, BUDGET, step_priced=True)
    assert by_arrival is not None and by_steps is not None
    assert by_steps == pytest.approx(by_arrival, rel=1e-9)
    fewer = obs(itl_mean_ms=itl, **{**kw, "step_tokens_mean": b})  # no chunk admitted
    no_chunks = window_parts(fewer, LENGTHS, PROFILE, 60.0, BUDGET, step_priced=True)
    assert no_chunks is not None and no_chunks[2] < by_arrival[2]
    assert _standing_speed(itl, step_tokens_mean=None) is None  # no step tokens: no price


def test_a_step_priced_window_does_not_depend_on_the_load() -> None:
    """An unsteady load (the short window 60 % over the long one) rules an
    arrival-priced window out; priced at its own steps it still reads, the same."""
    steady = _standing_speed(40.0)
    assert steady is not None
    assert _standing_speed(40.0, arrival_rate_short_rps=64.0) == pytest.approx(steady)
    o = obs(itl_mean_ms=40.0, **{**QUEUED, "waiting": 0.0, "arrival_rate_short_rps": 64.0})
    assert window_parts(o, LENGTHS, PROFILE, 60.0, BUDGET) is None


def test_a_standing_window_only_ever_jumps() -> None:
    """Standing parts are the sample only without unqueued parts and only past
    SPEED_JUMP_RATIO x the belief, confirmed like any jump; a standing window within
    the ratio, or not allowed (it holds a scale-up), leaves the belief as it is."""
    four = _itl_for(4.0)
    o = obs(itl_mean_ms=four, **QUEUED)
    standing = window_parts(o, LENGTHS, PROFILE, 60.0, BUDGET, math.inf, step_priced=True)
    o_mild = obs(itl_mean_ms=_itl_for(1.6), **QUEUED)
    mild = window_parts(o_mild, LENGTHS, PROFILE, 60.0, BUDGET, math.inf, step_priced=True)
    b = PlantBelief()
    first = learn_plant(b, None, 5.0, 100.0, 30.0, True, standing_parts=standing)
    assert first.speed == 1.0 and first.speed_jump == pytest.approx(4.0, rel=1e-6)
    second = learn_plant(first, None, 5.0, 130.0, 30.0, True, standing_parts=standing)
    assert second.speed == pytest.approx(4.0, rel=1e-6) and second.speed_samples == 2
    for blocked in (
        learn_plant(b, None, 5.0, 100.0, 30.0, True, standing_parts=mild),
        learn_plant(b, None, 5.0, 100.0, 30.0, False, standing_parts=standing),
    ):
        assert blocked == b
    unqueued = (20.0, 1.0, 9.0)  # reads 2.0: averaged, the standing window unused
    both = learn_plant(b, unqueued, 5.0, 100.0, 30.0, True, standing_parts=standing)
    assert both.speed_jump is None and 1.0 < both.speed < 1.1


def _run(**kw: float) -> ModelState:
    """The decider's state after a minute of QUEUED windows at 4x the profile (12
    ticks, 5 s apart) on a fleet of 4 whole since long ago and at its maximum (no
    scale-up restarts the dead time), knobs KNOBS; `kw` overrides the observation."""
    d = Decider(make_model(max_replicas=4), make_policy())
    s = d.initial_state(4, now_s=ORIGIN_S - 1000)
    s = replace(s, knobs=KNOBS, health=long_history())
    itl = _itl_for(4.0, **kw)
    for k in range(12):
        t = ORIGIN_S + 5.0 * k
        o = obs(t=t, itl_mean_ms=itl, **{**QUEUED, **kw})
        _, s = d.decide(o, replace(s, replicas=4, knobs=KNOBS), t)
    return s


def test_a_fleet_queued_at_its_limit_learns_a_far_slower_plant() -> None:
    """Engines 4x slower than the profile behind a queue that never drains: the
    belief jumps to 4x within the minute, whichever of slots, step tokens or KV cache
    is spent (SATURATED_SLOTS_FRAC); the per-sequence fit sees the windows as before."""
    for spent in (
        {"kv_usage_frac": 0.5},
        {"step_tokens_mean": 0.5 * BUDGET},
        {"running": 4 * 32.0},
    ):
        s = _run(**spent)
        assert s.plant.speed == pytest.approx(4.0, rel=0.05), spent


def test_a_queue_beside_free_room_or_a_new_fleet_teaches_nothing() -> None:
    """No jump where the queue is in transit (slots, step tokens and KV cache all
    under half spent), has not stood for two readings, stands on a fleet whole for
    less than a window before its sample, or where the sample is the fleet's stale
    one from before it was whole."""
    assert _run().plant.speed == 1.0
    d = Decider(make_model(max_replicas=4), make_policy())
    itl = _itl_for(4.0, kv_usage_frac=0.9)

    def run(full_since_s: float, staleness_s: float = 0.0) -> float:
        s = d.initial_state(4, now_s=ORIGIN_S - 1000)
        s = replace(s, knobs=KNOBS, health=replace(long_history(), full_since_s=full_since_s))
        for k in range(12):
            t = ORIGIN_S + 5.0 * k
            o = obs(
                t=t,
                itl_mean_ms=itl,
                staleness_s=staleness_s,
                **{**QUEUED, "kv_usage_frac": 0.9},
            )
            _, s = d.decide(o, replace(s, replicas=4, knobs=KNOBS), t)
        return s.plant.speed

    assert run(ORIGIN_S - 1000) == pytest.approx(4.0, rel=0.05)
    assert run(ORIGIN_S - 5.0) == 1.0  # whole 5-60 s before each sample
    assert run(ORIGIN_S - 40.0, staleness_s=25.0) == 1.0  # the samples 15-70 s old
    s = replace(d.initial_state(4, now_s=ORIGIN_S - 1000), health=long_history())
    queued = obs(t=ORIGIN_S, itl_mean_ms=itl, **{**QUEUED, "kv_usage_frac": 0.9})
    for before, stood in ((160.0, True), (4.0, False), (None, False)):
        s = replace(s, forecast=replace(s.forecast, short_waiting=before))
        assert d._standing_queue(queued, s, ORIGIN_S, KNOBS) is stood, before
