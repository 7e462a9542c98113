"""Smoothing and forecasting of load signals, as pure functions over frozen state.

Holt's linear trend (double exponential smoothing) with irregular sample spacing: the
level and trend are per-second quantities, so a missed tick does not distort them.
Worked example: level 10 req/s, trend +0.1 req/s per second, horizon 60 s ->
forecast 16 req/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HoltState:
    """Holt filter state: `level` (signal units), `trend` (units per second), `at_s`."""

    level: float
    trend: float
    at_s: float


def holt_update(
    state: HoltState | None, value: float, now_s: float, alpha: float, beta: float
) -> HoltState:
    """Fold one sample into the filter. `alpha` weights the level, `beta` the trend.

    Non-finite samples are refused (ValueError): missing data is handled by the caller,
    never smoothed in as a number. A sample at or before the last one replaces the
    level without touching the trend (clock went backwards or a duplicate tick).
    """
    if not math.isfinite(value):
        raise ValueError(f"holt_update: value must be finite, got {value}")
    if state is None:
        return HoltState(level=value, trend=0.0, at_s=now_s)
    dt = now_s - state.at_s
    if dt <= 0:
        return HoltState(
            level=alpha * value + (1 - alpha) * state.level, trend=state.trend, at_s=state.at_s
        )
    predicted = state.level + state.trend * dt
    level = alpha * value + (1 - alpha) * predicted
    trend = beta * (level - state.level) / dt + (1 - beta) * state.trend
    return HoltState(level=level, trend=trend, at_s=now_s)


def holt_forecast(state: HoltState, horizon_s: float) -> float:
    """Level projected `horizon_s` seconds past the last sample; never below 0."""
    return max(0.0, state.level + state.trend * max(0.0, horizon_s))


def ewma(previous: float | None, value: float, dt_s: float, half_life_s: float) -> float:
    """Exponentially weighted moving average with a half-life in seconds.

    The weight of the old value after `dt_s` is 0.5 ** (dt_s / half_life_s), so the
    result does not depend on how often it is sampled. The edges are that weight's
    limits, never a division by zero:

    - `dt_s` <= 0 (a second sample at the same instant, or the clock stepped back):
      no time has passed, the old value keeps its whole weight -> `previous`, unchanged,
      whatever the half-life (a repeated instant adds no evidence);
    - `half_life_s` <= 0 (or NaN) with time passed: nothing is remembered -> `value`.

    Example: previous 2,000, value 4,000, 5 s later, half-life 300 s -> about 2,023.
    """
    if previous is None:
        return value
    if not dt_s > 0.0:  # also NaN
        return previous
    if not half_life_s > 0.0:
        return value
    keep = 0.5 ** (dt_s / half_life_s)
    return keep * previous + (1 - keep) * value
