"""Outputs that grew, read from the requests in flight (controller.knobstep.
inflight_output_tokens): the output-length histogram counts a request when it
finishes, so after a shift to longer outputs it reads the short ones for minutes, while
the running count holds the long ones from their first token (Little's law)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.decider import Decider
from controller.knobstep import INFLIGHT_RISE, INFLIGHT_SUSTAIN_S, inflight_output_tokens
from controller.types import Forecast, HoltState, Lengths, ModelState
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import long_history, obs

CONV = Lengths(prompt_mean=1155.0, prompt_p95=4083.0, output_mean=211.0, output_p95=451.0)


def test_the_docstring_example_and_the_readings_refused() -> None:
    shifted = dict(rate=40.0, running=600.0, itl_mean_ms=20.0, prefill_time_mean_ms=50.0)
    assert inflight_output_tokens(obs(**shifted)) == pytest.approx(747.5)
    # the short window's rate when it is the higher (a rising load: the long window lags)
    assert inflight_output_tokens(obs(**shifted, arrival_rate_short_rps=50.0)) == pytest.approx(
        (600.0 / 50.0 - 0.05) / 0.02
    )
    assert inflight_output_tokens(obs(**{**shifted, "running": 7.0})) is None  # < 8 a replica
    assert inflight_output_tokens(obs(**shifted, waiting=2.0)) is None  # a queue: slots bind
    assert inflight_output_tokens(obs(**shifted, waiting=None)) is None
    assert inflight_output_tokens(obs(**{**shifted, "itl_mean_ms": None})) is None
    assert inflight_output_tokens(obs(**{**shifted, "rate": 0.0})) is None


def _state(d: Decider, calm_for_s: float) -> ModelState:
    """6 replicas on conversation lengths (smoothed), calm for `calm_for_s` seconds."""
    s = d.initial_state(6, now_s=ORIGIN_S - 1000)
    return replace(
        s,
        forecast=Forecast(load=HoltState(level=40.0, trend=0.0, at_s=ORIGIN_S - 5.0), lengths=CONV),
        health=replace(long_history(), calm_since_s=ORIGIN_S - calm_for_s),
    )


def _run(calm_for_s: float, running: list[float]) -> list[tuple[float, float | None, int]]:
    """Ticks 5 s apart at 40 req/s on 6 ready replicas whose histogram still reads the
    conversation's outputs, one per `running` count: (the believed output mean, the
    capacity per replica, the replicas asked for) of each."""
    d = Decider(make_model(max_replicas=64), make_policy())
    s = _state(d, calm_for_s)
    out = []
    for i, r in enumerate(running):
        t = ORIGIN_S + 5.0 * i
        o = obs(
            t=t,
            rate=40.0,
            running=r,
            waiting=0.0,
            ready_replicas=6,
            itl_mean_ms=12.0,
            prefill_time_mean_ms=45.0,
        )
        dec, s = d.decide(o, s, t)
        assert s.forecast.lengths is not None
        out.append((s.forecast.lengths.output_mean, dec.capacity_rps_per_replica, dec.replicas))
    return out


def test_outputs_in_flight_past_the_rise_replace_the_belief_once_sustained() -> None:
    """334 running at 40 req/s and 12 ms read ~692 tokens in flight against a belief of
    211: after INFLIGHT_SUSTAIN_S of such ticks the belief jumps there (the p95 by as
    much), the capacity per replica falls and the fleet grows. A tick in between that
    the belief explains (60 running: ~121 tokens) restarts the sustain; so does a fleet
    calm for less than a rate window."""
    sustained = int(INFLIGHT_SUSTAIN_S / 5.0)
    ticks = _run(calm_for_s=1000.0, running=[334.0] * (sustained + 2))
    means = [m for m, _, _ in ticks]
    assert means[sustained - 1] == pytest.approx(CONV.output_mean, rel=0.01)
    jumped = (334.0 / 40.0 - 0.045) / 0.012
    assert means[sustained] == pytest.approx(jumped)
    assert jumped > INFLIGHT_RISE * CONV.output_mean
    _, base_cap, base_replicas = ticks[0]
    _, cap, replicas = ticks[sustained]
    assert cap is not None and base_cap is not None and cap < 0.6 * base_cap
    assert replicas > base_replicas
    broken = _run(calm_for_s=1000.0, running=[334.0] * (sustained - 1) + [60.0] + [334.0] * 3)
    assert max(m for m, _, _ in broken) == pytest.approx(CONV.output_mean, rel=0.02)
    early = _run(calm_for_s=make_policy().window_s - 40.0, running=[334.0] * (sustained + 1))
    assert max(m for m, _, _ in early) == pytest.approx(CONV.output_mean, rel=0.01)
