"""Hysteresis stages applied to the raw replica recommendation, in this order:

    raw -> deadband -> stabilize -> rate-limit -> cooldown -> clamp[min, max]

plus panic mode, which replaces deadband, stabilize and rate-limit while it lasts
(scale up at once, never down). Each stage is a small pure function returning
`StageOut(value, reason, detail)`; `current` is the replica count the previous
decision asked for. Times are seconds on the loop's monotonic clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controller.config import RateLimit, ScalingPolicy
from controller.types import Hysteresis, Reason


@dataclass(frozen=True, slots=True)
class StageOut:
    value: int
    reason: Reason
    detail: str = ""


def deadband(raw: float, current: int, tolerance_frac: float) -> StageOut:
    """Keep `current` when raw/current is within 1 +/- tolerance (HPA's tolerance).

    Outside it, scale up to ceil(raw); scale *down* to ceil(raw * (1 + tolerance)), so
    the smaller fleet keeps the tolerance as headroom and the same noise that allowed
    the scale-down cannot push straight back up (a symmetric hysteresis band).
    Examples: current 5, raw 5.4 -> ratio 1.08 -> stay 5; current 5, raw 3.9 -> ratio
    0.78 -> ceil(3.9 * 1.1) = 5 -> stay 5; raw 3.5 -> ceil(3.85) = 4. From zero
    replicas there is no ratio: any raw > 0 leaves the deadband.
    """
    # 1e-9: 5.5 / 5 - 1 is 0.10000000000000009 in floating point, still "10 %".
    if current > 0 and abs(raw / current - 1.0) <= tolerance_frac + 1e-9:
        return StageOut(current, Reason.WITHIN_TOLERANCE, f"ratio {raw / current:.3f}")
    if raw <= 0:
        return StageOut(0, Reason.OUTSIDE_TOLERANCE, "raw 0")
    target = math.ceil(raw - 1e-9)
    if raw < current:
        target = min(current, math.ceil(raw * (1.0 + tolerance_frac) - 1e-9))
    return StageOut(target, Reason.OUTSIDE_TOLERANCE, f"raw {raw:.2f}")


def stabilize(
    recommendation: int,
    current: int,
    history: Sequence[tuple[float, int]],
    now_s: float,
    up_window_s: float,
    down_window_s: float,
) -> StageOut:
    """HPA's stabilization: scale up to the *minimum* recommendation within the up
    window, down to the *maximum* within the down window. `history` holds earlier
    (time, recommendation) pairs; the current one is included here.

    Example: recommendations 8, 6, 5 over the last 300 s, current 8 -> stays 8
    (SCALE_DOWN_STABILIZED) until the 8 leaves the window.
    """
    up_vals = [v for t, v in history if now_s - t < up_window_s] + [recommendation]
    down_vals = [v for t, v in history if now_s - t < down_window_s] + [recommendation]
    up_rec, down_rec = min(up_vals), max(down_vals)
    if current < up_rec:
        value = up_rec
    elif current > down_rec:
        value = down_rec
    else:
        value = current
    if value == recommendation:
        return StageOut(value, Reason.STABLE)
    if recommendation < current:
        return StageOut(value, Reason.SCALE_DOWN_STABILIZED, f"max in window {down_rec}")
    return StageOut(value, Reason.SCALE_UP_STABILIZED, f"min in window {up_rec}")


def _period_changes(
    changes: Sequence[tuple[float, int]], now_s: float, period_s: float
) -> tuple[int, int]:
    """(replicas added, replicas removed) by changes within the last `period_s`."""
    added = removed = 0
    for t, delta in changes:
        if now_s - t < period_s:
            if delta > 0:
                added += delta
            else:
                removed -= delta
    return added, removed


def rate_limit(
    proposal: int,
    current: int,
    changes: Sequence[tuple[float, int]],
    now_s: float,
    up_limits: Sequence[RateLimit],
    down_limits: Sequence[RateLimit],
) -> StageOut:
    """HPA's scaling policies with selectPolicy Max (the most permissive policy wins).

    `changes` holds (time, delta) of earlier output changes. For scale-up each policy
    allows periodStart + pods or ceil(periodStart * (1 + percent/100)), where
    periodStart = current - replicas added in the period. Example (defaults +100 % or
    +4 pods per 15 s): current 2, nothing added lately, proposal 10 -> limit
    max(4, 6) = 6 (SCALE_UP_LIMITED).
    """
    if proposal > current:
        limit = 0
        for p in up_limits:
            added, _ = _period_changes(changes, now_s, p.period_s)
            start = current - added
            if p.type == "pods":
                cap = start + p.value
            else:
                cap = math.ceil(start * (1 + p.value / 100.0))
            limit = max(limit, cap)
        if proposal > limit:
            return StageOut(max(limit, current), Reason.SCALE_UP_LIMITED, f"limit {limit}")
    elif proposal < current:
        limit = current
        for p in down_limits:
            _, removed = _period_changes(changes, now_s, p.period_s)
            start = current + removed
            if p.type == "pods":
                floor_ = start - p.value
            else:
                floor_ = math.ceil(start * (1 - p.value / 100.0))
            limit = min(limit, floor_)
        if proposal < limit:
            return StageOut(min(limit, current), Reason.SCALE_DOWN_LIMITED, f"limit {limit}")
    return StageOut(proposal, Reason.NOT_LIMITED)


def cooldown(
    proposal: int, current: int, last_scale_up_s: float | None, now_s: float, cooldown_s: float
) -> StageOut:
    """No scale-down within `cooldown_s` of the last scale-up."""
    if proposal < current and last_scale_up_s is not None and now_s - last_scale_up_s < cooldown_s:
        left = cooldown_s - (now_s - last_scale_up_s)
        return StageOut(current, Reason.SCALE_DOWN_COOLDOWN, f"{left:.0f}s left")
    return StageOut(proposal, Reason.NO_COOLDOWN)


def clamp(proposal: int, min_replicas: int, max_replicas: int) -> StageOut:
    """Bound to [min_replicas, max_replicas]."""
    if proposal > max_replicas:
        return StageOut(max_replicas, Reason.CLAMPED_MAX, f"max {max_replicas}")
    if proposal < min_replicas:
        return StageOut(min_replicas, Reason.CLAMPED_MIN, f"min {min_replicas}")
    return StageOut(proposal, Reason.WITHIN_BOUNDS)


def noise_margin_rps(bar_rps: float, backlog_rps: float, window_s: float, z: float) -> float:
    """How far a short-window demand (arrivals + the queue's share, req/s) must read over
    `bar_rps` before noise cannot explain it: `z` Poisson deviations of the count of
    arrivals a window of `window_s` seconds holds at the bar (at least one request's).
    The queue's share is a gauge the fleet built, not a count's noise. Examples at 10 s
    and z 2: bar 1.6 req/s, no queue -> 0.8 req/s (24 requests in the window, not 17,
    read as over a bar of 16); bar 52 -> 4.6 req/s (9 %); bar 52 of which a queue's share
    is 40 -> 2.2 req/s."""
    return z * poisson_count_sd(max(bar_rps - backlog_rps, 0.0), window_s) / window_s


def poisson_count_sd(rate_rps: float, window_s: float) -> float:
    """The standard deviation of the count of Poisson arrivals at `rate_rps` over
    `window_s` s, requests (at least one request's). Example: 2.5 req/s over 10 s -> 5."""
    return math.sqrt(max(rate_rps * window_s, 1.0))


def panic(
    short_demand_rps: float,
    current: int,
    capacity_rps: float,
    threshold_frac: float,
    panic_until_s: float | None,
    now_s: float,
    hold_s: float,
    noise_z: float = 0.0,
    window_s: float = 1.0,
    backlog_rps: float = 0.0,
) -> tuple[bool, float | None, Reason]:
    """Enter or stay in panic. Returns (in_panic, new panic_until_s, reason).

    Panic starts when short-window demand >= threshold x the capacity of the current
    replicas (from zero replicas, any demand beyond one replica's capacity), by more
    than the noise of the `window_s` window's arrivals (`noise_margin_rps`, `noise_z`
    deviations; `backlog_rps` the queue's share of the short demand); it lasts `hold_s`
    after the last tick that met the condition (Knative KPA's rule).
    """
    at = threshold_frac * max(current, 1) * capacity_rps
    if short_demand_rps >= at + noise_margin_rps(at, backlog_rps, window_s, noise_z):
        return True, now_s + hold_s, Reason.PANIC
    if panic_until_s is not None and now_s < panic_until_s:
        return True, panic_until_s, Reason.PANIC_HOLD
    return False, None, Reason.NO_PANIC


def next_memory(
    p: ScalingPolicy,
    w: Hysteresis,
    current: int,
    final: int,
    now_s: float,
    recs: tuple[tuple[float, int], ...],
    panic_until_s: float | None,
    idle_since_s: float | None,
) -> Hysteresis:
    """The stage memory a tick that moved `current` replicas to `final` at `now_s` leaves:
    its action and scale-up time recorded, and the recommendations (`recs`, this tick's
    included) and actions pruned to the longest window that reads them (the
    stabilization windows, the rate limits' periods), so the saved state stays bounded
    however long a stretch lasts (24 h without data grew 17,279 recommendations)."""
    actions, last_up = w.actions, w.last_scale_up_s
    if final != current:
        actions = (*actions, (now_s, final - current))
    if final > current:
        last_up = now_s
    longest_limit = max(lim.period_s for lim in (*p.scale_up_limits, *p.scale_down_limits))
    keep_recs_s = max(p.scale_up_stabilization_s, p.scale_down_stabilization_s)
    return Hysteresis(
        recommendations=tuple(r for r in recs if now_s - r[0] < keep_recs_s),
        actions=tuple(a for a in actions if now_s - a[0] < longest_limit),
        last_scale_up_s=last_up,
        panic_until_s=panic_until_s,
        idle_since_s=idle_since_s,
    )
