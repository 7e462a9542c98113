"""The oracle: a lower bound on GPU-hours with perfect foresight and no cold start.

For each 60 s window, the smallest number of warm replicas that serves exactly that
window's requests at >= 99 % SLO attainment, found by simulating the window (each
replica count from a fresh, warm fleet; the window's requests run to completion) with
an exponential search then bisection on the count. GPU-hours are the sum over windows
of count x window length. Requests that miss their SLO even with `max_replicas` warm
replicas (refused ones, prompt longer than max_model_len; prompts whose prefill alone
exceeds the TTFT SLA) cannot be served by any count: they are left out of the oracle's
attainment, and still count as misses for every policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controller.config import SLA
from controller.types import Knobs
from estimators.stepmodel import Profile
from simulator.fleet import ROUTERS, Fleet
from simulator.pool import process_pool
from simulator.scenario import Scenario, governor_knobs_for, slo_met
from simulator.traces import Trace

ATTAINMENT_GOAL = 0.99


@dataclass(frozen=True)
class OracleResult:
    gpu_hours: float
    window_s: float
    replicas: list[int]
    """Replicas per window, in order."""

    def held_ratio(self, hold_s: float) -> float | None:
        """GPU-hours of these per-window counts each held for `hold_s` seconds (a window
        runs the largest count asked within the `hold_s` before it ends: a scale-down
        stabilization window of that length), over the oracle's own; None without
        GPU-hours. What a policy that keeps such a window pays even when it knows every
        window's need exactly (before cold starts and margins). Example: counts [3, 1, 1]
        in 60 s windows held 120 s -> [3, 3, 1] -> 7 / 5 = 1.4."""
        return self._over_own(sum(self._held(hold_s)))

    def flap_free_ratio(self, hold_s: float, flap_s: float, start: int) -> float | None:
        """GPU-hours of the cheapest fleet that runs at least these per-window counts
        held for `hold_s` seconds (`held_ratio`), starts at `start` replicas and never
        reverses a scaling direction within `flap_s` seconds (a flap, as the scenario
        counts them), over the oracle's own; None without GPU-hours. What a policy that
        keeps a scale-down window of `hold_s` and makes no flap pays even when it knows
        every window's need exactly. A change happens between windows; two changes of
        opposite direction must be at least ceil(flap_s / window_s) windows apart.
        Example: counts [1, 3, 1, 1], 60 s windows, no hold, flaps over 120 s, start 1
        -> [1, 3, 3, 1] (3 cannot drop right after its rise) -> 8 / 6 = 1.33."""
        gap = self._windows(flap_s)
        return self._over_own(_cheapest_flap_free(self._held(hold_s), start, gap))

    def _over_own(self, replica_windows: int) -> float | None:
        """`replica_windows` over the oracle's own (None when it has none)."""
        total = sum(self.replicas)
        return replica_windows / total if total > 0 else None

    def _windows(self, s: float) -> int:
        """Windows that `s` seconds span (rounded up)."""
        return math.ceil(s / self.window_s - 1e-9)

    def _held(self, hold_s: float) -> list[int]:
        """Each window's count raised to the largest asked within `hold_s` before its end."""
        back = max(0, self._windows(hold_s) - 1)
        return [max(self.replicas[max(0, i - back) : i + 1]) for i in range(len(self.replicas))]

    def summary(self) -> dict[str, float | int]:
        return {
            "gpu_hours": self.gpu_hours,
            "window_s": self.window_s,
            "max_replicas": max(self.replicas, default=0),
            "mean_replicas": float(np.mean(self.replicas)) if self.replicas else 0.0,
        }


def _cheapest_flap_free(need: list[int], start: int, gap: int) -> int:
    """The least sum over windows of a count n[i] >= need[i] that starts at `start`
    and changes direction only `gap` or more windows after its last change (replica-
    windows). A dynamic program over (count, direction of the last change, windows
    since it, capped at `gap`). Example: need [1, 1, 2, 2], start 4, gap 3 -> 8
    ([2, 2, 2, 2]: dropping to 1 first would need a rise 2 windows later)."""
    top = max([start, *need])
    states: dict[tuple[int, int, int], int] = {(start, 0, gap): 0}
    for r in need:
        nxt: dict[tuple[int, int, int], int] = {}
        for (n, last, since), cost in states.items():
            for m in range(r, top + 1):
                step = (m > n) - (m < n)
                if step and last and step != last and since < gap:
                    continue  # a reversal within the flap window
                key = (m, step, 1) if step else (m, last, min(gap, since + 1))
                if cost + m < nxt.get(key, cost + m + 1):
                    nxt[key] = cost + m
        states = nxt
    return min(states.values())


def _met(
    trace: Trace,
    n: int,
    profile: Profile,
    knobs: Knobs,
    sla: SLA,
    seed: int,
    overhead_s: float,
    router: str = ROUTERS[0],
    prefix_hit_frac: float = 0.0,
) -> np.ndarray:
    """Per-request SLO mask of `trace` served by `n` warm replicas to completion."""
    fleet = Fleet(
        profile,
        knobs=knobs,
        initial_replicas=n,
        seed=seed,
        overhead_s=overhead_s,
        router=router,
        prefix_hit_frac=prefix_hit_frac,
    )
    fleet.submit_trace(trace, offset_s=0.0)
    fleet.run()
    return slo_met(fleet.records(), sla)


def window_replicas(args: tuple[Trace, Profile, Knobs, SLA, int, int, float, str, float]) -> int:
    """Smallest warm replica count serving `trace` (one window) at the goal.

    `args`: (trace, plant profile, knobs, sla, max replicas, seed, overhead seconds,
    router, prefix-cache hit share)."""
    trace, profile, knobs, sla, max_replicas, seed, overhead_s, router, hit = args
    if len(trace) == 0:
        return 0
    servable = _met(trace, max_replicas, profile, knobs, sla, seed, overhead_s, router, hit)
    if not servable.any():
        return 0  # nothing any count could serve: the oracle holds no replica
    cache: dict[int, bool] = {max_replicas: True}

    def ok(n: int) -> bool:
        if n not in cache:
            met = _met(trace, n, profile, knobs, sla, seed, overhead_s, router, hit)
            cache[n] = met[servable].sum() / servable.sum() >= ATTAINMENT_GOAL
        return cache[n]

    hi = 1
    while not ok(hi):
        hi = min(hi * 2, max_replicas)
    lo = hi // 2  # known bad (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def oracle(
    trace: Trace,
    profile: Profile,
    knobs: Knobs,
    sla: SLA,
    *,
    window_s: float = 60.0,
    max_replicas: int = 64,
    seed: int = 0,
    workers: int | None = None,
    overhead_s: float = 0.0,
    router: str = ROUTERS[0],
    prefix_hit_frac: float = 0.0,
    change: tuple[float, Profile] | None = None,
) -> OracleResult:
    """Run the oracle over `trace` in windows of `window_s` (see module doc) on the plant
    `profile` with `overhead_s` of per-request server overhead, behind `router`
    (simulator.fleet.ROUTERS), its engines finding `prefix_hit_frac` of each prompt in
    their prefix cache. `change` (at_s, profile): the plant from `at_s` s on
    (simulator.plant's speed change); a window it splits runs on the faster of the two,
    so the sum stays a lower bound."""
    n_windows = max(1, math.ceil(trace.span_s / window_s)) if len(trace) else 0
    jobs = []
    for i in range(n_windows):
        lo, hi = i * window_s, (i + 1) * window_s
        a, b = np.searchsorted(trace.arrival_s, [lo, hi], side="left")
        sub = Trace(
            trace.arrival_s[a:b] - lo,
            trace.prompt_tokens[a:b],
            trace.output_tokens[a:b],
            trace.name,
        )
        plant = profile if change is None else _window_plant(profile, change, lo, hi)
        jobs.append(
            (sub, plant, knobs, sla, max_replicas, seed, overhead_s, router, prefix_hit_frac)
        )
    with process_pool(min(2 if workers is None else workers, len(jobs))) as pool:
        counts = list(pool.map(window_replicas, jobs))
    return OracleResult(
        gpu_hours=sum(counts) * window_s / 3600.0, window_s=window_s, replicas=counts
    )


def _window_plant(before: Profile, change: tuple[float, Profile], lo: float, hi: float) -> Profile:
    """The plant of the window [lo, hi) s around a change (at_s, profile): the one in
    force all through it, else (split) the faster one, the lower bound's. Faster by the
    per-token coefficient: the plant scales every step-time coefficient by one factor
    (simulator.plant), so one coefficient orders them."""
    at_s, after = change
    if at_s <= lo:
        return after
    if at_s >= hi:
        return before
    return min(before, after, key=lambda p: p.step_time.per_token_ms)


def scenario_oracle(sc: Scenario, workers: int | None = None) -> OracleResult:
    """The oracle of a scenario: its trace on its plant, with the knobs the governor's
    batching policy picks for the trace's length statistics."""
    return oracle(
        sc.trace,
        sc.plant.profile(sc.profile),
        governor_knobs_for(sc.trace, sc),
        sc.sla,
        max_replicas=sc.max_replicas,
        seed=sc.seed,
        workers=workers,
        overhead_s=sc.plant.overhead_s(sc.profile),
        router=sc.plant.router,
        prefix_hit_frac=sc.plant.prefix_hit_frac,
        change=sc.plant.changed_profile(sc.profile),
    )
