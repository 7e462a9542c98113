"""Prefix-cache hits priced: the share of prompt tokens the engines find in their prefix
cache is not prefill work (controller.capacity, controller.plant), and the belief in it
rises slowly and falls at once (controller.knobstep)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.batching import slo_knobs
from controller.capacity import capacity_rps, priced_hit_frac
from controller.config import SLA, KnobBounds
from controller.decider import Decider
from controller.plant import window_parts
from controller.types import Forecast, HoltState, Knobs, Lengths, ModelState
from estimators.stepmodel import load_profile
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import long_history, obs

PROFILE = load_profile()
CONV = Lengths(prompt_mean=1155, prompt_p95=4083, output_mean=211, output_p95=451)
LONG = Lengths(prompt_mean=12_000, prompt_p95=40_000, output_mean=250, output_p95=600)


def test_the_priced_share_is_rounded_down_and_bounded() -> None:
    assert priced_hit_frac(0.57) == pytest.approx(0.55)
    assert priced_hit_frac(0.55) == pytest.approx(0.55)  # not 0.50 by a float's hair
    assert priced_hit_frac(0.049) == 0.0
    assert priced_hit_frac(0.999) == pytest.approx(0.95)
    assert priced_hit_frac(-0.2) == 0.0


@pytest.mark.parametrize(
    ("lengths", "sla", "knobs", "at_half"),
    [
        (CONV, SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0), Knobs(152, 2560), 1.3),
        (LONG, SLA(ttft_p95_ms=15_000.0, itl_p95_ms=50.0), Knobs(16, 1280), 1.4),
    ],
)
def test_hits_are_not_prefill_work(
    lengths: Lengths, sla: SLA, knobs: Knobs, at_half: float
) -> None:
    """Capacity grows with the share hit, more where prefill is most of the work (the
    long prompts' capacity at 80 % more than 3x); none hit is the capacity without the
    field, exactly."""

    def cap(hit: float) -> float:
        return capacity_rps(knobs, replace(lengths, prefix_hit_frac=hit), sla, PROFILE, 0.85, 4)

    caps = [cap(h) for h in (0.0, 0.3, 0.5, 0.8)]
    assert caps == sorted(caps) and len(set(caps)) == 4
    assert caps[0] == capacity_rps(knobs, lengths, sla, PROFILE, 0.85, 4)
    assert caps[2] > at_half * caps[0]
    if lengths is LONG:
        assert caps[3] > 3.0 * caps[0]
    # a share that wanders within a pricing step moves nothing
    assert cap(0.51) == cap(0.54) == caps[2]


def test_the_knobs_price_the_hits_too() -> None:
    """The slo knobs (controller.batching) compute only the prompt tokens not hit: where
    the TTFT target sets the token budget (the p95 prompt within half of it, 100 ms), half
    of it hit needs half the tokens, so the ITL rule's budget stands; a chunk starts
    past the cached share, whose attention it reads, so long prompts get smaller chunks
    within the same mixed-step time. None hit is the knobs without the field."""
    bounds, margin = KnobBounds(), make_policy().itl_margin_frac
    tight = SLA(ttft_p95_ms=100.0, itl_p95_ms=50.0)

    def knobs(lengths: Lengths, sla: SLA, hit: float) -> Knobs:
        return slo_knobs(replace(lengths, prefix_hit_frac=hit), sla, PROFILE, bounds, margin)

    assert knobs(CONV, tight, 0.0) == slo_knobs(CONV, tight, PROFILE, bounds, margin)
    assert knobs(CONV, tight, 0.0) == Knobs(152, 4096)  # 4,083 tokens in one step
    assert knobs(CONV, tight, 0.5) == Knobs(152, 2560)  # 2,042: the ITL rule's budget
    long_sla = SLA(ttft_p95_ms=15_000.0, itl_p95_ms=50.0)
    assert knobs(LONG, long_sla, 0.0) == Knobs(16, 1280)
    assert knobs(LONG, long_sla, 0.5) == Knobs(16, 1024)  # chunks at 30k tokens, not 20k
    assert knobs(LONG, long_sla, 0.52) == knobs(LONG, long_sla, 0.5)  # priced as capacity


def test_the_speed_window_prices_the_hits_too() -> None:
    """A window of long prompts half hit: the profile predicts less prefill in its
    steps, so the same observed ITL reads a slower plant than without the hits (priced
    as the capacity model prices them, or the speed would absorb the hits and the
    capacity count them twice)."""
    o = obs(
        rate=2.0,
        itl_mean_ms=20.0,
        running=24.0,
        waiting=0.0,
        ready_replicas=4,
        prompt_tokens_mean=12_000.0,
        prompt_tokens_p95=40_000.0,
    )

    def predicted(hit: float) -> float:
        parts = window_parts(o, replace(LONG, prefix_hit_frac=hit), PROFILE, 60.0, 1280)
        assert parts is not None
        return parts[1] + parts[2]

    assert predicted(0.5) < 0.95 * predicted(0.0)
    # at the share believed, not rounded down as the capacity prices it (a window priced
    # for more prefill than ran would read faster engines)
    assert predicted(0.54) < predicted(0.5)


def _decider(
    level_rps: float, lengths: Lengths, history_s: float = 1000.0
) -> tuple[Decider, ModelState]:
    """A decider and the state of a model on 6 replicas believing `lengths` and a load
    of `level_rps`, with a good history `history_s` old."""
    d = Decider(make_model(max_replicas=64), make_policy())
    s: ModelState = d.initial_state(6, now_s=ORIGIN_S - 1000)
    return d, replace(
        s,
        forecast=Forecast(
            load=HoltState(level=level_rps, trend=0.0, at_s=ORIGIN_S - 5.0), lengths=lengths
        ),
        health=replace(long_history(), first_good_s=ORIGIN_S - history_s),
    )


def _believed(hits: list[float | None], history_s: float = 1000.0) -> list[float]:
    """Ticks 5 s apart at 40 req/s on 6 ready replicas whose windows read the prefix-cache
    hit shares `hits`, from a belief of 0.6 and a good history `history_s` old: the
    believed share after each."""
    d, s = _decider(40.0, replace(CONV, prefix_hit_frac=0.6), history_s)
    out = []
    for i, h in enumerate(hits):
        t = ORIGIN_S + 5.0 * i
        dec, s = d.decide(obs(t=t, ready_replicas=6, prefix_cache_hit_frac=h), s, t)
        assert s.forecast.lengths is not None
        out.append(s.forecast.lengths.prefix_hit_frac)
        assert dec.prefix_hit_frac == priced_hit_frac(out[-1])
    return out


def test_the_belief_rises_over_the_half_life_and_falls_at_once() -> None:
    half_life = make_policy().lengths_half_life_s
    ticks = int(half_life / 5.0)
    rising = _believed([0.9] * ticks)
    assert rising[0] < 0.61
    assert rising[-1] == pytest.approx(0.75, abs=0.01)  # halfway to 0.9 in a half-life
    assert _believed([0.2, 0.9]) == [0.2, pytest.approx(0.2, abs=0.01)]
    # a window without the counters keeps the belief; one that reads more than 1 is 1
    assert _believed([None, None]) == [0.6, 0.6]
    assert _believed([1.4])[0] <= 1.0


def test_fewer_hits_ask_for_more_replicas_at_once() -> None:
    """The cache stops hitting (a fleet grown behind a router that does not route by
    prefix, KV pressure evicting): the next tick sizes for whole prefills."""
    d, s = _decider(60.0, replace(LONG, prefix_hit_frac=0.8))
    long_obs = dict(prompt_tokens_mean=12_000.0, prompt_tokens_p95=40_000.0)
    hit, _ = d.decide(obs(t=ORIGIN_S, rate=2.0, prefix_cache_hit_frac=0.8, **long_obs), s, ORIGIN_S)
    cold, _ = d.decide(
        obs(t=ORIGIN_S, rate=2.0, prefix_cache_hit_frac=0.0, **long_obs), s, ORIGIN_S
    )
    assert hit.raw_replicas is not None and cold.raw_replicas is not None
    assert cold.raw_replicas > 2.0 * hit.raw_replicas
    assert "80% of their tokens priced as prefix-cache hits" in hit.explain()
    assert "prefix-cache" not in cold.explain()
