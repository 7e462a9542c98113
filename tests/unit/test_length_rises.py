"""Lengths that grew, read from the length histograms' windows (controller.knobstep.
risen_length): where a window's mean prompt or output length reads past SHIFT_RISE x
the smoothed belief on every good tick for SHIFT_SUSTAIN_S, that window's lengths are
the belief, on a trusted window only (enough requests, a history a half-life old)."""

from __future__ import annotations

from dataclasses import replace

from controller.decider import Decider
from controller.knobstep import (
    INFLIGHT_SUSTAIN_S,
    SHIFT_MIN_REQUESTS,
    SHIFT_RISE,
    SHIFT_SUSTAIN_S,
    lengths_replaced,
    risen_length,
)
from controller.types import (
    Decision,
    Forecast,
    HoltState,
    LengthRises,
    Lengths,
    ModelState,
    PlantBelief,
)
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import long_history, obs

CONV = Lengths(prompt_mean=1155.0, prompt_p95=4083.0, output_mean=211.0, output_p95=451.0)


def test_the_docstring_example_and_what_stands() -> None:
    belief = (1460.0, 4724.0)
    # the window read past the rise from 625 s: at 655 s it is the belief
    assert risen_length((4232.0, 12700.0), belief, 625.0, 655.0, True) == (
        4232.0,
        12700.0,
        625.0,
    )
    # its p95 only where higher than the belief's
    assert risen_length((4232.0, 4000.0), belief, 625.0, 655.0, True)[1] == 4724.0
    # not sustained yet: the belief stands, the rise is remembered from its first tick
    assert risen_length((4232.0, 12700.0), belief, None, 655.0, True) == (1460.0, 4724.0, 655.0)
    assert risen_length((4232.0, 12700.0), belief, 630.0, 655.0, True)[:2] == belief
    # a window within the rise ends the rise; an untrusted window neither starts nor keeps it
    assert risen_length((SHIFT_RISE * 1460.0, 9000.0), belief, 600.0, 655.0, True)[2] is None
    assert risen_length((4232.0, 12700.0), belief, 600.0, 655.0, False) == (1460.0, 4724.0, None)


def _ticks(
    prompts: list[float], rate: float, history_s: float, plant: PlantBelief
) -> list[tuple[Decision, ModelState]]:
    """Ticks 5 s apart at `rate` req/s on 6 ready replicas whose output histogram reads
    the conversation's and whose prompt windows read `prompts` (means; p95 3.5x), from a
    belief of the conversation's lengths and of `plant`, and a good history `history_s`
    old: the decision and the state after each."""
    d = Decider(make_model(max_replicas=64), make_policy())
    s: ModelState = d.initial_state(6, now_s=ORIGIN_S - 1000)
    s = replace(
        s,
        forecast=Forecast(load=HoltState(level=rate, trend=0.0, at_s=ORIGIN_S - 5.0), lengths=CONV),
        health=replace(long_history(), first_good_s=ORIGIN_S - history_s),
        plant=plant,
    )
    out = []
    for i, p in enumerate(prompts):
        t = ORIGIN_S + 5.0 * i
        o = obs(
            t=t,
            rate=rate,
            ready_replicas=6,
            prompt_tokens_mean=p,
            prompt_tokens_p95=3.5 * p,
        )
        dec, s = d.decide(o, s, t)
        out.append((dec, s))
    return out


def _run(
    prompts: list[float], rate: float = 40.0, history_s: float = 1000.0
) -> list[tuple[float, float, int]]:
    """`_ticks` from the profile's plant: (the believed prompt mean and p95, the
    replicas asked for) of each."""
    out = []
    for dec, s in _ticks(prompts, rate, history_s, PlantBelief()):
        assert s.forecast.lengths is not None
        out.append((s.forecast.lengths.prompt_mean, s.forecast.lengths.prompt_p95, dec.replicas))
    return out


def test_prompts_past_the_rise_replace_the_belief_once_sustained() -> None:
    """Windows of 2x the believed prompts: after SHIFT_SUSTAIN_S of them the belief is
    theirs (mean and p95) and the fleet grows. A tick in between within the rise restarts
    the sustain; so does a window of fewer than SHIFT_MIN_REQUESTS requests, and a
    history younger than the half-life (where the belief follows the windows anyway)."""
    sustained = int(SHIFT_SUSTAIN_S / 5.0)
    grown = 2.0 * CONV.prompt_mean
    ticks = _run([grown] * (sustained + 2))
    means = [m for m, _, _ in ticks]
    assert means[sustained - 1] < 1.1 * CONV.prompt_mean
    assert means[sustained] == grown
    assert ticks[sustained][1] == 3.5 * grown
    assert ticks[sustained][2] > ticks[0][2]
    broken = _run([grown] * (sustained - 1) + [CONV.prompt_mean] + [grown] * 3)
    assert max(m for m, _, _ in broken) < 1.1 * CONV.prompt_mean
    few = 0.9 * SHIFT_MIN_REQUESTS / make_policy().window_s  # req/s
    sparse = _run([grown] * (sustained + 2), rate=few)
    assert max(m for m, _, _ in sparse) < 1.1 * CONV.prompt_mean
    young = _run([grown] * (sustained + 2), history_s=make_policy().lengths_half_life_s - 60.0)
    assert max(m for m, _, _ in young) < grown


def test_a_shift_takes_back_a_correction_past_1() -> None:
    """A capacity correction past 1 is the model shown pessimistic on the old lengths:
    on the tick the risen prompts become the belief it is brought to 1 (the fleet sized
    on the new lengths by the model alone), and a correction under 1 (the model shown
    optimistic) stands. Windows within the rise keep it."""
    sustained = int(SHIFT_SUSTAIN_S / 5.0)
    grown = [2.0 * CONV.prompt_mean] * (sustained + 2)
    shifted = _ticks(grown, 40.0, 1000.0, PlantBelief(capacity_correction=1.15))
    corrections = [dec.capacity_correction for dec, _ in shifted]
    assert min(corrections[:sustained]) > 1.14
    assert corrections[sustained] == 1.0
    assert shifted[sustained][0].replicas >= shifted[0][0].replicas
    low = _ticks(grown, 40.0, 1000.0, PlantBelief(capacity_correction=0.8))
    assert max(abs(dec.capacity_correction - 0.8) for dec, _ in low) < 0.01
    steady = _ticks(
        [CONV.prompt_mean] * (sustained + 2), 40.0, 1000.0, PlantBelief(capacity_correction=1.15)
    )
    assert min(dec.capacity_correction for dec, _ in steady) > 1.14
    # a rise that falls back on the tick it would have sustained replaced nothing
    brief = [2.0 * CONV.prompt_mean] * sustained + [CONV.prompt_mean] * 2
    fell = _ticks(brief, 40.0, 1000.0, PlantBelief(capacity_correction=1.15))
    assert min(dec.capacity_correction for dec, _ in fell) > 1.14


def test_each_rise_replaces_the_belief_at_its_own_sustain() -> None:
    now = 1000.0
    assert not lengths_replaced(LengthRises(), now)
    assert lengths_replaced(LengthRises(prompt_since_s=now - SHIFT_SUSTAIN_S), now)
    assert not lengths_replaced(LengthRises(output_since_s=now - SHIFT_SUSTAIN_S + 5.0), now)
    assert lengths_replaced(LengthRises(output_since_s=now - SHIFT_SUSTAIN_S), now)
    assert lengths_replaced(LengthRises(inflight_since_s=now - INFLIGHT_SUSTAIN_S), now)
    assert not lengths_replaced(LengthRises(inflight_since_s=now - INFLIGHT_SUSTAIN_S + 5.0), now)
