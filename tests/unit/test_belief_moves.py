"""Length beliefs that move without a shift read from the windows: a prefix-hit share
that falls (controller.knobstep.prefix_fell: the capacity correction past 1 is brought
to 1, as on a length shift) and the window after a data gap (weighed as one
MAX_GAP_TICKS after the last good tick, never as the whole gap)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.decider import MAX_GAP_TICKS, Decider
from controller.knobstep import SHIFT_RISE, prefix_fell
from controller.types import Forecast, HoltState, Lengths, ModelState, PlantBelief
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import long_history, obs

CONV = Lengths(prompt_mean=1155.0, prompt_p95=4083.0, output_mean=211.0, output_p95=451.0)


def _state(d: Decider, lengths: Lengths, last_s: float, correction: float = 1.0) -> ModelState:
    """6 replicas at 40 req/s believed, on `lengths`, the last good tick at `last_s`."""
    s = d.initial_state(6, now_s=ORIGIN_S - 1000)
    return replace(
        s,
        forecast=Forecast(load=HoltState(level=40.0, trend=0.0, at_s=last_s), lengths=lengths),
        health=long_history(),
        plant=PlantBelief(capacity_correction=correction),
    )


def _corrections(hits: list[float], believed: float, correction: float) -> list[float]:
    """The capacity correction after each of ticks 5 s apart whose windows read the
    prefix-hit shares `hits`, from a belief of `believed` and `correction`."""
    d = Decider(make_model(max_replicas=64), make_policy())
    s = _state(d, replace(CONV, prefix_hit_frac=believed), ORIGIN_S - 5.0, correction)
    out = []
    for i, hit in enumerate(hits):
        t = ORIGIN_S + 5.0 * i
        dec, s = d.decide(obs(t=t, ready_replicas=6, prefix_cache_hit_frac=hit), s, t)
        out.append(dec.capacity_correction)
    return out


def test_the_docstring_examples() -> None:
    def fell(old: float, new: float) -> bool:
        return prefix_fell(replace(CONV, prefix_hit_frac=old), replace(CONV, prefix_hit_frac=new))

    assert fell(0.6, 0.4) and not fell(0.2, 0.1)
    # the bound: the computed share grows exactly SHIFT_RISE x
    assert fell(0.8, 1.0 - SHIFT_RISE * 0.2) and not fell(0.8, 1.0 - SHIFT_RISE * 0.2 + 0.01)
    assert not fell(0.4, 0.6) and not fell(1.0, 1.0) and fell(1.0, 0.99)
    assert not prefix_fell(None, CONV) and not prefix_fell(CONV, None)


def test_a_prefix_hit_share_that_falls_takes_back_a_correction_past_1() -> None:
    """The correction past 1 was learned while the cache spared 60 % of every prompt's
    prefill: on the tick the share falls to 30 % (1.75x the tokens computed) it is 1. A
    fall of less than SHIFT_RISE x the computed tokens, a rise, and a correction under 1
    (the model shown optimistic) stand."""
    fall = _corrections([0.6, 0.6, 0.3, 0.3], believed=0.6, correction=1.15)
    assert min(fall[:2]) > 1.14 and fall[2] == 1.0
    assert min(_corrections([0.6, 0.5, 0.5], believed=0.6, correction=1.15)) > 1.14
    assert min(_corrections([0.6, 0.9, 0.9], believed=0.6, correction=1.15)) > 1.14
    low = _corrections([0.6, 0.3, 0.3], believed=0.6, correction=0.8)
    assert max(abs(c - 0.8) for c in low) < 0.01


@pytest.mark.parametrize("gap_s", [600.0, 3600.0])
def test_the_window_after_a_data_gap_weighs_as_after_the_longest_counted_gap(
    gap_s: float,
) -> None:
    """Windows of half the believed prompts, after a gap: the belief moves as after a
    gap of MAX_GAP_TICKS ticks (it moved 75 % of the way after 600 s, the lengths'
    half-life being 300 s, and could shrink the fleet on one window), and the fleet
    asked for is the same."""
    d = Decider(make_model(max_replicas=64), make_policy())
    short = {"prompt_tokens_mean": CONV.prompt_mean / 2, "prompt_tokens_p95": CONV.prompt_p95 / 2}
    counted = MAX_GAP_TICKS * make_policy().tick_interval_s
    after = {}
    for gap in (counted, gap_s):
        s = _state(d, CONV, ORIGIN_S - gap)
        dec, s = d.decide(obs(t=ORIGIN_S, ready_replicas=6, **short), s, ORIGIN_S)
        assert s.forecast.lengths is not None
        after[gap] = (s.forecast.lengths.prompt_mean, dec.replicas)
    assert after[gap_s] == after[counted]
    assert after[gap_s][0] > 0.95 * CONV.prompt_mean
