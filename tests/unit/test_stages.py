"""Table tests for every hysteresis stage, each alone (controller.stages)."""

from __future__ import annotations

import pytest

from controller.config import RateLimit
from controller.stages import (
    clamp,
    cooldown,
    deadband,
    noise_margin_rps,
    panic,
    poisson_count_sd,
    rate_limit,
    stabilize,
)
from controller.types import Reason

HPA_UP = (
    RateLimit(type="percent", value=100, period_s=15),
    RateLimit(type="pods", value=4, period_s=15),
)
HPA_DOWN = (RateLimit(type="percent", value=100, period_s=15),)


@pytest.mark.parametrize(
    ("raw", "current", "tol", "want", "reason"),
    [
        pytest.param(5.4, 5, 0.1, 5, Reason.WITHIN_TOLERANCE, id="up-8pct-inside"),
        pytest.param(4.6, 5, 0.1, 5, Reason.WITHIN_TOLERANCE, id="down-8pct-inside"),
        pytest.param(5.6, 5, 0.1, 6, Reason.OUTSIDE_TOLERANCE, id="up-12pct-outside"),
        pytest.param(4.4, 5, 0.1, 5, Reason.OUTSIDE_TOLERANCE, id="down-12pct-ceil-keeps-5"),
        pytest.param(3.9, 5, 0.1, 5, Reason.OUTSIDE_TOLERANCE, id="down-22pct-headroom-keeps-5"),
        pytest.param(3.5, 5, 0.1, 4, Reason.OUTSIDE_TOLERANCE, id="down-30pct-to-4-with-headroom"),
        pytest.param(1.0, 10, 0.1, 2, Reason.OUTSIDE_TOLERANCE, id="down-far-ceil-of-1.1"),
        pytest.param(0.2, 0, 0.1, 1, Reason.OUTSIDE_TOLERANCE, id="from-zero-any-demand"),
        pytest.param(0.0, 0, 0.1, 0, Reason.OUTSIDE_TOLERANCE, id="zero-stays-zero"),
        pytest.param(5.5, 5, 0.1, 5, Reason.WITHIN_TOLERANCE, id="edge-exactly-10pct"),
        pytest.param(10.0, 5, 0.0, 10, Reason.OUTSIDE_TOLERANCE, id="no-tolerance"),
    ],
)
def test_deadband(raw: float, current: int, tol: float, want: int, reason: Reason) -> None:
    out = deadband(raw, current, tol)
    assert (out.value, out.reason) == (want, reason)


@pytest.mark.parametrize(
    ("rec", "current", "history", "up_w", "down_w", "want", "reason"),
    [
        pytest.param(
            6,
            8,
            [(100.0, 8), (200.0, 7)],
            0,
            300,
            8,
            Reason.SCALE_DOWN_STABILIZED,
            id="down-held-by-max-in-window",
        ),
        pytest.param(
            6,
            8,
            [(0.0, 8), (200.0, 7)],
            0,
            300,
            7,
            Reason.SCALE_DOWN_STABILIZED,
            id="down-to-max-of-window-after-old-left",
        ),
        pytest.param(6, 8, [(0.0, 9)], 0, 300, 6, Reason.STABLE, id="down-window-expired"),
        pytest.param(10, 5, [(290.0, 4)], 0, 300, 10, Reason.STABLE, id="up-is-immediate"),
        pytest.param(
            10, 5, [(290.0, 7)], 60, 300, 7, Reason.SCALE_UP_STABILIZED, id="up-window-takes-min"
        ),
        pytest.param(5, 5, [], 0, 300, 5, Reason.STABLE, id="unchanged"),
        pytest.param(3, 4, [(299.0, 4)], 0, 0, 3, Reason.STABLE, id="no-down-window"),
    ],
)
def test_stabilize(
    rec: int,
    current: int,
    history: list[tuple[float, int]],
    up_w: float,
    down_w: float,
    want: int,
    reason: Reason,
) -> None:
    out = stabilize(rec, current, history, 300.0, up_w, down_w)
    assert (out.value, out.reason) == (want, reason)


@pytest.mark.parametrize(
    ("proposal", "current", "changes", "want", "reason"),
    [
        pytest.param(10, 2, [], 6, Reason.SCALE_UP_LIMITED, id="up-max-of-100pct-and-4pods"),
        pytest.param(30, 10, [], 20, Reason.SCALE_UP_LIMITED, id="up-100pct-beats-4pods"),
        pytest.param(3, 1, [], 3, Reason.NOT_LIMITED, id="up-within-limit"),
        pytest.param(
            12, 6, [(95.0, 4)], 6, Reason.SCALE_UP_LIMITED, id="up-period-start-counts-recent-adds"
        ),
        pytest.param(12, 6, [(80.0, 4)], 12, Reason.NOT_LIMITED, id="up-old-adds-outside-period"),
        pytest.param(4, 0, [], 4, Reason.NOT_LIMITED, id="from-zero-4-pods"),
        pytest.param(9, 0, [], 4, Reason.SCALE_UP_LIMITED, id="from-zero-capped-at-4"),
        pytest.param(0, 10, [], 0, Reason.NOT_LIMITED, id="down-100pct-allowed"),
        pytest.param(5, 5, [], 5, Reason.NOT_LIMITED, id="no-change"),
    ],
)
def test_rate_limit(
    proposal: int, current: int, changes: list[tuple[float, int]], want: int, reason: Reason
) -> None:
    out = rate_limit(proposal, current, changes, 100.0, HPA_UP, HPA_DOWN)
    assert (out.value, out.reason) == (want, reason)


@pytest.mark.parametrize(
    ("down", "proposal", "current", "changes", "want", "reason"),
    [
        pytest.param(
            (RateLimit(type="pods", value=1, period_s=60),),
            2,
            6,
            [],
            5,
            Reason.SCALE_DOWN_LIMITED,
            id="one-pod-per-minute",
        ),
        pytest.param(
            (RateLimit(type="pods", value=1, period_s=60),),
            2,
            5,
            [(70.0, -1)],
            5,
            Reason.SCALE_DOWN_LIMITED,
            id="already-removed-one-this-minute",
        ),
        pytest.param(
            (RateLimit(type="percent", value=50, period_s=60),),
            1,
            10,
            [],
            5,
            Reason.SCALE_DOWN_LIMITED,
            id="half-per-minute",
        ),
        pytest.param(
            (
                RateLimit(type="percent", value=50, period_s=60),
                RateLimit(type="pods", value=7, period_s=60),
            ),
            1,
            10,
            [],
            3,
            Reason.SCALE_DOWN_LIMITED,
            id="max-policy-most-permissive",
        ),
    ],
)
def test_rate_limit_down_policies(
    down: tuple[RateLimit, ...],
    proposal: int,
    current: int,
    changes: list[tuple[float, int]],
    want: int,
    reason: Reason,
) -> None:
    out = rate_limit(proposal, current, changes, 100.0, HPA_UP, down)
    assert (out.value, out.reason) == (want, reason)


@pytest.mark.parametrize(
    ("proposal", "current", "last_up", "want", "reason"),
    [
        pytest.param(3, 5, 90.0, 5, Reason.SCALE_DOWN_COOLDOWN, id="down-inside-cooldown"),
        pytest.param(3, 5, 30.0, 3, Reason.NO_COOLDOWN, id="down-after-cooldown"),
        pytest.param(3, 5, None, 3, Reason.NO_COOLDOWN, id="never-scaled-up"),
        pytest.param(8, 5, 99.0, 8, Reason.NO_COOLDOWN, id="up-not-affected"),
        pytest.param(3, 5, 40.0, 3, Reason.NO_COOLDOWN, id="exactly-at-cooldown-end"),
    ],
)
def test_cooldown(
    proposal: int, current: int, last_up: float | None, want: int, reason: Reason
) -> None:
    out = cooldown(proposal, current, last_up, 100.0, 60.0)
    assert (out.value, out.reason) == (want, reason)


@pytest.mark.parametrize(
    ("proposal", "want", "reason"),
    [
        pytest.param(0, 1, Reason.CLAMPED_MIN, id="below-min"),
        pytest.param(11, 10, Reason.CLAMPED_MAX, id="above-max"),
        pytest.param(5, 5, Reason.WITHIN_BOUNDS, id="inside"),
        pytest.param(1, 1, Reason.WITHIN_BOUNDS, id="at-min"),
        pytest.param(10, 10, Reason.WITHIN_BOUNDS, id="at-max"),
    ],
)
def test_clamp(proposal: int, want: int, reason: Reason) -> None:
    out = clamp(proposal, 1, 10)
    assert (out.value, out.reason) == (want, reason)


@pytest.mark.parametrize(
    ("short", "current", "until", "now", "want_panic", "want_until", "reason"),
    [
        pytest.param(40.0, 2, None, 100.0, True, 160.0, Reason.PANIC, id="2x-capacity-enters"),
        pytest.param(39.0, 2, None, 100.0, False, None, Reason.NO_PANIC, id="below-threshold"),
        pytest.param(10.0, 2, 150.0, 100.0, True, 150.0, Reason.PANIC_HOLD, id="holds-after-spike"),
        pytest.param(10.0, 2, 150.0, 150.0, False, None, Reason.NO_PANIC, id="hold-expired"),
        pytest.param(
            20.0, 0, None, 100.0, True, 160.0, Reason.PANIC, id="from-zero-vs-one-replica"
        ),
    ],
)
def test_panic(
    short: float,
    current: int,
    until: float | None,
    now: float,
    want_panic: bool,
    want_until: float | None,
    reason: Reason,
) -> None:
    got = panic(short, current, 10.0, 2.0, until, now, 60.0)
    assert got == (want_panic, want_until, reason)


def test_noise_margin_is_poisson_deviations_of_the_windows_arrivals() -> None:
    """z deviations of the count a window holds at the bar, the queue's share left out
    (a gauge, not a count), at least one request's: 6 % over a bar of 90 req/s in a 10 s
    window, 50 % over 1.6 req/s."""
    assert noise_margin_rps(1.6, 0.0, 10.0, 2.0) == pytest.approx(0.8)
    assert noise_margin_rps(52.0, 0.0, 10.0, 2.0) == pytest.approx(4.5607, abs=1e-4)
    assert noise_margin_rps(52.0, 40.0, 10.0, 2.0) == pytest.approx(2.1909, abs=1e-4)
    assert noise_margin_rps(99.0, 0.0, 10.0, 2.0) / 99.0 == pytest.approx(0.0636, abs=1e-4)
    assert noise_margin_rps(0.0, 0.0, 10.0, 2.0) == pytest.approx(0.2)  # one request
    assert noise_margin_rps(5.0, 9.0, 10.0, 2.0) == pytest.approx(0.2)  # queue over the bar
    assert noise_margin_rps(1.6, 0.0, 10.0, 0.0) == 0.0
    assert poisson_count_sd(2.5, 10.0) == 5.0 and poisson_count_sd(0.0, 10.0) == 1.0


@pytest.mark.parametrize(
    ("short", "z", "backlog", "want"),
    [
        pytest.param(2.3, 0.0, 0.0, True, id="low-rate-2x-without-noise-test"),
        pytest.param(2.3, 2.0, 0.0, False, id="low-rate-2x-within-noise"),
        pytest.param(2.5, 2.0, 0.0, True, id="low-rate-past-noise"),
        pytest.param(2.3, 2.0, 1.4, True, id="mostly-queue-less-noise"),
    ],
)
def test_panic_past_the_short_windows_noise(
    short: float, z: float, backlog: float, want: bool
) -> None:
    """One replica of 0.8 req/s: the 2x bar is 1.6 req/s, 16 arrivals in a 10 s window,
    and 2 deviations of it are 0.8 req/s more; a reading mostly queue (1.4 of the bar)
    needs only 2 deviations of the 2 arrivals left (0.28 req/s)."""
    got, _, reason = panic(short, 1, 0.8, 2.0, None, 100.0, 60.0, z, 10.0, backlog)
    assert got is want
    assert reason == (Reason.PANIC if want else Reason.NO_PANIC)


def test_decider_shares_equal_stage_records_and_only_equal_ones() -> None:
    from controller.decider import _stage
    from controller.stages import StageOut
    from controller.types import Reason, Stage

    a = _stage("cooldown", 3, StageOut(3, Reason.NO_COOLDOWN))
    assert a is _stage("cooldown", 3, StageOut(3, Reason.NO_COOLDOWN))
    assert a == Stage("cooldown", 3, 3, Reason.NO_COOLDOWN, "")
    for other in (
        _stage("clamp", 3, StageOut(3, Reason.NO_COOLDOWN)),
        _stage("cooldown", 2, StageOut(3, Reason.NO_COOLDOWN)),
        _stage("cooldown", 3, StageOut(4, Reason.NO_COOLDOWN)),
        _stage("cooldown", 3, StageOut(3, Reason.SCALE_DOWN_COOLDOWN)),
        _stage("cooldown", 3, StageOut(3, Reason.NO_COOLDOWN, "x")),
    ):
        assert other != a
