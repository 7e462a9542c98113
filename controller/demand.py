"""Steps 4 and 5 of the decider (controller.decider): the demand (smoothed level, trend,
short-window rise, backlog), the raw replica count, the burst memory, and what the
stabilization windows remember of a tick.

A mixin of `Decider`: the methods read the decider's `model`, `policy` and `_max_gap_s`
and are pure like `decide`. Rates are req/s, times seconds on the loop's clock.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from controller.config import ModelConfig, ScalingPolicy
from controller.stages import deadband, noise_margin_rps, poisson_count_sd
from controller.types import DataHealth, ModelState, PlantBelief, Reason
from estimators.smoothing import HoltState, holt_forecast, holt_update
from estimators.types import Observation

# A panic arms the burst memory only when the short window reads at least this much
# over the long one (a step to 2x over a 30 s short and a 60 s long window reads 1.33x).
BURST_SURGE_FRAC = 1.25
# A SHORT_WINDOW rise (no panic) arms it only when the short window's count is this many
# standard deviations over the base: Poisson's, or the short window's own spread where
# the arrivals are burstier than Poisson (see DemandSteps._burst).
BURST_Z = 5.0
# Half-life of that spread (a mean of z squared over the ticks, s).
NOISE_HALF_LIFE_S = 600.0
# A confirmed short-window rise (SHORT_WINDOW) and a panic count only this many Poisson
# deviations of the panic window's arrivals past their bar (controller.stages.
# noise_margin_rps): at conversation x16's 90 req/s that is 6 % more, at long-context's
# 1-3 req/s 35-60 %, where one 10 s window's chance reading scaled up a fleet the
# cooldown then held for 10 minutes (8 of long-context's 9 matrix rows, 2-14 % of their
# GPU-hours). Panic counts it only once the long window holds a full window: a fleet
# that starts was not sized for its load, and its first 2x reading is not noise to
# discount (conversation x16 from one replica lost 0.07-0.34 points of attainment).
RISE_Z = 2.0
PANIC_Z = 2.0
# A load has fallen (DemandSteps._fall_or_rise) when it kept falling over the scale-down
# window and its long window reads this many standard deviations under what it read
# then: Poisson's, or the long window's own spread around the smoothed level where the
# arrivals are burstier (6 to 12 met the same matrix goals; 16 lost two diurnal rows).
# Risen is the mirror, at the same threshold.
FALLING_Z = 10.0
# A queue that grows counts as the load outpacing the fleet's capacity (QUEUE_GROWTH)
# only while the replicas run at least this share of their sequence slots on average:
# with most slots empty it waits on chunked prefill (long prompts) or the KV cache, and
# what the fleet serves then is not its capacity at the SLA. vLLM's CPU engine (32
# slots), a step to 2x its capacity: RUNNING 25-32 on the ticks its queue grew.
SATURATED_SLOTS_FRAC = 0.5


@dataclass(frozen=True, slots=True)
class Demand:
    """Step 4's demand (req/s): smoothed `load`, `demand` (level + trend uplift +
    backlog), `short` / `long` (each window's rate + backlog), `observed` (what was seen, the larger
    window), and whether the fleet is idle."""

    load: HoltState
    demand: float
    short: float
    long: float
    observed: float
    idle: bool
    rise: float | None = None
    backlog: float = 0.0
    """The queue's share of every figure above (req/s: waiting / backlog_drain_s)."""
    confirmed: float | None = None
    """What the short window shows on two ticks in a row, or on this one when the queue
    grew meanwhile (+ backlog; DemandSteps._confirmed)."""
    history: bool = False
    """Whether the long window holds a full window of this model's good data."""
    falling: bool = False
    """Whether the load fell far past its noise over the scale-down window, with no
    scale-up for falling_release_after_s (DemandSteps._fall_or_rise): the scale-down
    window is then window_s."""
    marks: tuple[tuple[float, float], ...] = ()
    """Forecast.load_marks after this tick."""
    long_noise_z2: float | None = None
    """Forecast.long_noise_z2 after this tick."""
    rising: bool = False
    """Whether the load rose far past its noise over the scale-down window (the mirror
    of `falling`, DemandSteps._fall_or_rise): no step down then."""
    outpaced_rps: float | None = None
    """How fast the queue grew since the last reading (req/s) on a whole fleet that fell
    behind the load (DemandSteps._outpaced_by); None otherwise."""


@dataclass(frozen=True, slots=True)
class Raw:
    """The raw recommendation (replicas, fractional), its reason, the corrected
    per-replica capacity it was sized with (req/s; None when idle), the idle clock and
    the corrected per-replica capacity of the current fleet (req/s; what panic and a
    rise are measured against)."""

    raw: float
    reason: Reason
    capacity: float | None
    idle_since: float | None
    current: float | None = None


class DemandSteps:
    """Demand, raw count and burst-memory steps of `Decider` (see the module doc)."""

    model: ModelConfig
    policy: ScalingPolicy
    _max_gap_s: float

    def _demand(
        self, obs: Observation, state: ModelState, now_s: float, slots: int | None = None
    ) -> Demand:
        """Step 4: demand from the smoothed level, its trend and the backlog (req/s);
        `slots` the sequences a replica runs at most (max_num_seqs; None: unknown)."""
        p = self.policy
        prev = state.forecast.load
        if prev is not None and now_s - prev.at_s > self._max_gap_s:
            # After a gap the trend is not extrapolated over it: the filter resumes as if
            # the last good sample were MAX_GAP_TICKS ago.
            prev = replace(prev, at_s=now_s - self._max_gap_s)
        elif prev is not None and now_s - prev.at_s < p.tick_interval_s / 2.0:
            # A tick right after the last one (a new leader ticking just after the old
            # one's last saved tick) re-reads the same windows: its change over a few ms
            # is noise, not a slope (3 % over 20 ms was a trend of 2.25 req/s per second,
            # 14 replicas for a flat load 7 served). It moves the level, not the trend.
            prev = replace(prev, at_s=now_s)
        load = holt_update(prev, obs.arrival_rate_rps, now_s, p.forecast_alpha, p.forecast_beta)
        backlog = (obs.waiting or 0.0) / p.backlog_drain_s
        short = obs.arrival_rate_short_rps
        # The trend looks ahead a cold start, and half a window more on a ramp the short
        # window shows too (the long window's rate, which the level follows, lags a ramp
        # by that much); it counts only past the deadband's worth of growth: below that
        # it is mostly noise, and acting on it would make scale-ups that later unwind.
        ramp = short is not None and short > (1.0 + p.tolerance_frac) * obs.arrival_rate_rps
        lead = self.model.cold_start_s + (p.window_s / 2.0 if ramp else 0.0)
        uplift = holt_forecast(load, lead) - load.level
        # Before the long window holds a full window, the trend is mostly the noise of
        # the first samples (0.45 req/s per second from +/-15 % noise on a level 249
        # req/s, ten ticks in: 20 replicas where 16-17 serve): it counts then only on a
        # ramp the short window shows too.
        first = state.health.first_good_s
        history = first is not None and now_s - first >= p.window_s
        if uplift <= p.tolerance_frac * load.level or not (history or ramp):
            uplift = 0.0
        demand = max(0.0, load.level + uplift) + backlog
        short_demand = (obs.arrival_rate_rps if short is None else short) + backlog

        # Idle means gauges that read zero: absent ones are unknown (only a fleet we
        # scaled to zero has no engines to report them).
        def zero(v: float | None) -> bool:
            return v == 0 if v is not None else state.replicas == 0

        idle = obs.arrival_rate_rps == 0 and zero(obs.waiting) and zero(obs.running)
        # What was observed (the short window, or the long one when higher): the size of
        # a panic and of a remembered burst. Observed, not forecast: a trend fitted to the
        # first few samples of a surge overshoots, and the overshoot later unwinds.
        long_demand = obs.arrival_rate_rps + backlog
        observed = max(long_demand, short_demand)
        outpaced = self._outpaced(obs, state, now_s)
        confirmed = self._confirmed(obs, state, now_s, backlog, outpaced)
        rise = confirmed
        bar = (1.0 + p.tolerance_frac) * demand
        if rise is not None and rise < bar + noise_margin_rps(
            bar, backlog, p.panic_window_s, RISE_Z
        ):
            rise = None  # within the deadband of the demand, or of its noise: not a rise
        falling, rising, marks, noise = self._fall_or_rise(
            obs.arrival_rate_rps, state, now_s, history
        )
        return Demand(
            load,
            demand,
            short_demand,
            long_demand,
            observed,
            idle,
            rise,
            backlog,
            confirmed,
            history,
            falling,
            marks,
            noise,
            rising,
            self._outpaced_by(obs, state, now_s, slots) if outpaced else None,
        )

    def _fall_or_rise(
        self, rate: float, state: ModelState, now_s: float, history: bool
    ) -> tuple[bool, bool, tuple[tuple[float, float], ...], float | None]:
        """Whether the load has fallen, whether it has risen, and the load marks and
        long-window spread after this tick (`rate`: the long window's arrival rate, req/s).

        The scale-down window holds the largest recommendation of the last 300 s, so
        that a dip which comes back does not take replicas away (a reversal). On a load
        that only falls it is pure lag: each step down waits a whole window, as the
        diurnal trace's evening did (4 replicas held from minute 13 to 18 where 2-3
        served). Fallen means the load kept falling: each mark (one per window_s, so
        their windows do not overlap) under the one before, over a scale-down window;
        and far: the long window reads FALLING_Z standard deviations under the oldest
        mark, the deviation Poisson's or, where the arrivals are burstier, the long
        window's own spread around the smoothed level (the root of a mean of z squared,
        NOISE_HALF_LIFE_S, from a Poisson prior; one tick adds at most the threshold
        squared). A step down is not a fall (its marks after the step read alike): it
        may be a pause that comes back, and keeps the whole window. And only once the
        last scale-up is falling_release_after_s old (at least the scale-down window):
        releasing early then cannot reverse a recent scale-up. Example: 38 req/s five
        minutes ago, 11 now, Poisson: (38 - 11) x 60 = 1,620 requests fewer, z = 1,620
        / sqrt(2,940) = 30.

        Risen is the mirror (each mark over the one before, the long window FALLING_Z
        deviations over the oldest mark), without the scale-up condition: a step down
        while the load keeps rising sheds replicas the load is about to ask back (the
        diurnal morning from 4 replicas stepped 4 -> 3 at 315 s with the load at 28
        req/s and rising, and back to 4 at minute 8 after 117 misses: a flap). The
        decider then keeps the fleet (Decider._stages). A step up is not a rise (its
        marks after the step read alike).
        """
        p, f = self.policy, state.forecast
        w = p.window_s
        noise = f.long_noise_z2
        if history and f.load is not None:
            z = _poisson_z(rate, f.load.level, w)
            noise = _spread_after(noise, z, FALLING_Z, p.tick_interval_s)
        marks = tuple(m for m in f.load_marks if now_s - m[0] <= p.scale_down_stabilization_s)
        if not marks or now_s - marks[-1][0] >= w - 1e-9:
            marks = (*marks, (now_s, rate))
        after = p.falling_release_after_s
        last_up = state.windows.last_scale_up_s
        t0, r0 = marks[0]
        spanned = history and now_s - t0 >= p.scale_down_stabilization_s - w
        # The change that counts as far, in requests over a window (only read when spanned).
        far = FALLING_Z * _sigma(noise) * math.sqrt(max((r0 + rate) * w, 1.0)) if spanned else 0.0
        falling = (
            spanned
            and after is not None
            and (last_up is None or now_s - last_up >= max(after, p.scale_down_stabilization_s))
            and all(b[1] < a[1] for a, b in itertools.pairwise(marks))
            and (r0 - rate) * w >= far
        )
        rising = (
            spanned
            and all(b[1] > a[1] for a, b in itertools.pairwise(marks))
            and (rate - r0) * w >= far
        )
        return falling, rising, marks, noise

    def _confirmed(
        self, obs: Observation, state: ModelState, now_s: float, backlog: float, outpaced: bool
    ) -> float | None:
        """What the short window shows on two ticks in a row: the smaller of this
        tick's reading and the last one (+ backlog, req/s), or None without both;
        `outpaced` this tick's `_outpaced`.

        The smoothed level follows a step over several windows; the short window shows
        it within one. Where this reads over (1 + tolerance) x the demand, it is the
        demand to scale up for, below the panic threshold too (`Demand.rise`); and it is
        what the burst memory holds. Two readings, so one noisy window cannot scale up
        alone, nor be remembered as a burst: at a 5 s scrape each tick reads a new
        10 s window. Example: 9 -> 18 req/s; the short window reads 15 then 18 while
        the level is at 11: demand 15 on the second tick.

        Unless the queue grew between the two readings on a whole fleet (`_outpaced`):
        then this tick's reading stands alone. The older one was taken while a step had
        filled part of the window, and a growing queue is not noise. Example (vLLM's
        CPU engine, 1 s ticks, a step to 2x its capacity): the short window reads 44
        then 76 req/s while WAITING goes 89 -> 166: demand 76 + the backlog, one tick
        sooner.
        """
        short, last = obs.arrival_rate_short_rps, state.forecast.short_rps
        if short is None or last is None or self._since_reading(state, now_s) is None:
            return None
        if outpaced:
            return short + backlog
        return min(short, last) + backlog

    def _since_reading(self, state: ModelState, now_s: float) -> float | None:
        """Seconds since the last tick's short-window reading, or None without one
        within two ticks (an older one is not the tick before)."""
        at = state.forecast.short_at_s
        if at is None or now_s - at > 2.0 * self.policy.tick_interval_s + 1e-9:
            return None
        return now_s - at

    def _outpaced_by(
        self, obs: Observation, state: ModelState, now_s: float, slots: int | None
    ) -> float | None:
        """How fast the queue grew since the last reading (req/s, over the time between
        their samples) on a fleet that fell behind the load (the caller checked
        `_outpaced`) with its sequence slots busy, else None.

        An engine queues only what it cannot admit, so such a fleet serves what it can
        and the load is that plus the growth; the short window's rate, a regression over
        a window mostly before a step, shows it ticks later. Example (vLLM's CPU engine,
        1 s scrapes and ticks, a step to 2x its capacity): WAITING 99 -> 177 while the
        short window reads 64 req/s against a capacity of 78: 78 req/s more than served.
        """
        f = state.forecast
        if obs.waiting is None or f.short_waiting is None or f.short_sample_s is None:
            return None
        if slots is None or obs.running is None:
            return None
        n = obs.ready_replicas if obs.ready_replicas is not None else state.replicas
        if obs.running < SATURATED_SLOTS_FRAC * slots * n:
            return None
        # Between the samples, not the ticks: at a 15 s scrape and 5 s ticks a gauge
        # moves by 15 s of growth in one tick.
        span = now_s - obs.staleness_s - f.short_sample_s
        return (obs.waiting - f.short_waiting) / span if span > 0 else None

    def _outpaced(self, obs: Observation, state: ModelState, now_s: float) -> bool:
        """Whether the fleet fell behind the load since the last reading (within two
        ticks, `_since_reading`): every replica asked for is ready (readiness not
        reported counts as ready; a queue that grows while replicas start is theirs to
        serve) and the queue grew by more than one request per replica, at more than the
        deadband's share of the smoothed level. Example: 6 replicas at 90 req/s, WAITING
        0 -> 60 in 5 s: 12 req/s more than served, over 9."""
        before = state.forecast.short_waiting
        level = state.forecast.load.level if state.forecast.load is not None else None
        dt_s = self._since_reading(state, now_s)
        if obs.waiting is None or before is None or level is None or dt_s is None:
            return False
        if dt_s <= 0 or not DataHealth.whole(obs.ready_replicas, state.replicas):
            return False
        n = obs.ready_replicas if obs.ready_replicas is not None else state.replicas
        grew = obs.waiting - before
        return grew > max(1, n) and grew / dt_s > self.policy.tolerance_frac * level

    def _raw(
        self,
        state: ModelState,
        now_s: float,
        demand: Demand,
        caps: tuple[float, float] | None,
        plant: PlantBelief,
        infeasible: bool = False,
    ) -> Raw:
        """Steps 4 and 5: the raw replica count (idle, capacity or burst memory);
        `caps` the per-replica capacity of the fleet to size and of the current one."""
        w = state.windows
        if demand.idle:
            idle_since = w.idle_since_s if w.idle_since_s is not None else now_s
            mn = self.model.replicas.min_replicas
            if mn == 0 and now_s - idle_since >= self.policy.scale_to_zero_idle_s:
                return Raw(0.0, Reason.SCALE_TO_ZERO, None, idle_since)
            # Idle means no demand: the raw count is zero and the clamp holds the
            # minimum (one replica while a min of 0 waits for scale_to_zero_idle_s), so
            # the stabilization window sees zero from the start of the idle stretch.
            # (A raw of `mn` would keep mn + 1: the deadband's scale-down headroom
            # turns 1 into ceil(1.1) = 2.)
            return Raw(0.0, Reason.IDLE, None, idle_since)
        if caps is None:  # no lengths: the caller holds, or the fleet is at zero
            return Raw(1.0, Reason.SCALE_FROM_ZERO, None, None)  # its engines tell the rest
        correction = plant.capacity_correction
        capacity, current = caps[0] * correction, caps[1] * correction
        level = demand.demand
        # A confirmed rise is scaled up for now only past what the fleet serves: a rise
        # the short window shows past its capacity at the SLA (without the target
        # utilization's headroom), a growing queue past its capacity at the target. A
        # rise into the headroom is what the headroom is for, and the long window sizes
        # for it within a window. Chased at once, a 10 s reading just past the target
        # asked back a replica within the 10-minute flap span of a step down
        # (conversation x16: 10 -> 7 at minute 11, +1 at minute 19 on 107 req/s read
        # where the level was 85 and 7 replicas serve 97 at the target, about 115 at the
        # SLA). Each is held to its own bar, the larger that passes chased.
        rises: list[tuple[float, Reason]] = []
        at_target = current * state.replicas  # what the fleet serves at the target, req/s
        at_sla = at_target / self.policy.target_utilization_frac
        if demand.rise is not None and demand.rise > at_sla:
            rises.append((demand.rise, Reason.SHORT_WINDOW))
        if demand.outpaced_rps is not None:
            # A fleet whose queue grows serves at least its capacity at the target (a
            # belief, the learned speed's), and the load is that plus the growth.
            floor = at_target + demand.outpaced_rps + demand.backlog
            if floor > at_target:
                rises.append((floor, Reason.QUEUE_GROWTH))
        rise: float | None = None
        if rises:
            rise, reason = max(rises, key=lambda r: r[0])
            level = rise  # a confirmed rise: scale up for it now
        if (remembered := self._burst_memory(state, now_s)) > level:
            # Bursts that needed panic recur faster than a cold start can follow:
            # keep capacity for them (decaying) instead of chasing each one.
            return Raw(remembered / capacity, Reason.BURST_MEMORY, capacity, None, current)
        if rise is not None:
            return Raw(rise / capacity, reason, capacity, None, current)
        # Either way off 1 the SLA's evidence, not the model alone, sized the fleet.
        reason = Reason.SLA_FEEDBACK if abs(correction - 1.0) > 0.001 else Reason.CAPACITY
        if infeasible:
            reason = Reason.SLA_INFEASIBLE
        return Raw(max(level / capacity, 1e-9), reason, capacity, None, current)

    def _burst(
        self, state: ModelState, now_s: float, demand: Demand, why: tuple[Reason, Reason]
    ) -> tuple[float | None, float | None, float | None]:
        """Step 5: the burst memory's (demand req/s, time) and the short window's noise
        (mean z squared) after this tick; `why` the panic stage's and the raw count's
        reasons.

        A surge that panicked or that the short window confirmed past the fleet's
        capacity at the SLA (SHORT_WINDOW: the fleet grows for it without panicking, as
        code x4's minute-3 burst did from 3 to 7 replicas, and the next burst found 4;
        a rise into the target utilization's headroom is not chased, and is no burst to
        remember) starts the burst memory; once started
        it follows the envelope (a decaying max) of what the short window shows on two
        ticks in a row (`Demand.confirmed`; the observed demand without two readings),
        so bursts that the grown fleet now absorbs without panicking keep it from
        shrinking back into the next panic.
        """
        remembered = self._burst_memory(state, now_s)
        # Only a surge arms it: the short window well above the long one, once the long
        # window holds a full window of history. A fleet that starts small panics too
        # (demand far over its capacity), but on a level load or while its first window
        # fills: that is a ramp to hold the load, not a burst to remember.
        history = demand.history
        # Against the smoothed level too: at a slow scrape the short window spans the
        # long one (30 s scrape: both 60 s), and only the level still lags a burst.
        base = min(demand.long, demand.demand)
        surge = history and demand.short >= BURST_SURGE_FRAC * base
        # A rise without panic only when noise cannot explain it: BURST_Z sigma over the
        # panic window (which undercounts a longer short window, never over), sigma
        # Poisson's or, where the arrivals are burstier, the short window's own spread
        # (the root of the mean z squared of the ticks before, NOISE_HALF_LIFE_S).
        # Smooth traces read 1.25x by chance (long-context z ~1.2, diurnal's ramp at a
        # 5 s scrape 3-4); conversation x16's 10 s windows at a 5 s scrape read z >= 5 on
        # one tick in ten (its rms z is 4: 10-second swings of +40 % a fleet absorbs);
        # code x4's minute-3 burst z 5.2 even at a 30 s scrape, after quiet minutes.
        w = self.policy.panic_window_s
        z = _poisson_z(demand.short, base, w)
        noise = state.forecast.short_noise_z2
        sigma = _sigma(noise)
        rise = why[1] == Reason.SHORT_WINDOW and z >= BURST_Z * sigma
        if history:  # from a Poisson prior; one tick adds at most the threshold squared
            noise = _spread_after(noise, z, BURST_Z * sigma, self.policy.tick_interval_s)
        armed = surge and (why[0] == Reason.PANIC or rise)
        # What it holds: what two ticks in a row saw (one tick's window is not a level to
        # keep capacity for: at a 5 s scrape each tick reads a new 10 s window).
        held = demand.observed if demand.confirmed is None else max(demand.long, demand.confirmed)
        if armed or (remembered > 0 and held > remembered):
            return max(remembered, held), now_s, noise
        return state.forecast.burst_rps, state.forecast.burst_at_s, noise

    def _remembered(self, value: int, raw: Raw, demand: Demand, current: int | None) -> int:
        """The recommendation the stabilization windows remember for this tick: what
        the load asks for, without the queue's share (replicas); `current` None: in
        panic.

        This tick acts on the queue (it is in the raw count and in panic's observed
        demand), but a drained queue does not come back the way a load does: if
        remembered, the replicas asked to drain it would be held for the whole
        scale-down window after it is gone. Example: one replica met by 50 req/s
        queues ~3,000 requests; at a 30 s drain that is 100 req/s more, and the fleet
        asks for 14 where the load needs 7. Once the queue is down, the window holds
        the 7 the load asked for, not the 14 (the 14 then go when the cooldown after
        their scale-up ends: cooldown_after_scale_up_s, 600 s by default, so that a
        scale-up is not reversed within 10 minutes). A queue that stays keeps its share in
        every tick's own recommendation, so nothing drops while it lasts. In panic the
        window remembers what the observed load needs, not the count panic holds (the
        hold is panic_hold_s; a surge to keep capacity for is the burst memory's,
        and a remembered burst, BURST_MEMORY, is kept whole).
        """
        cap = raw.capacity
        if cap is None or raw.reason == Reason.BURST_MEMORY:
            return value
        if current is None:
            return min(value, math.ceil((demand.observed - demand.backlog) / cap - 1e-9))
        if demand.backlog <= 0:
            return value
        load = max(0.0, raw.raw - demand.backlog / cap)
        return min(value, deadband(load, current, self.policy.tolerance_frac).value)

    def _sizing_demand(self, state: ModelState, now_s: float, demand: Demand) -> float:
        """The largest demand this tick may size the fleet for (req/s): the level, what
        was observed (panic), a confirmed rise, the burst memory. Capacity per replica is
        taken for the fleet that serves it (controller.capacity.fleet_capacity_rps)."""
        return max(
            demand.demand, demand.observed, demand.rise or 0.0, self._burst_memory(state, now_s)
        )

    def _burst_memory(self, state: ModelState, now_s: float) -> float:
        """The largest panic-level demand seen, halved every burst_memory_half_life_s
        (req/s); 0 when none or disabled. Example: a 120 req/s burst 20 minutes ago with
        a 20-minute half-life is remembered as 60 req/s."""
        hl = self.policy.burst_memory_half_life_s
        f = state.forecast
        if f.burst_rps is None or f.burst_at_s is None or hl <= 0:
            return 0.0
        return f.burst_rps * 0.5 ** (max(0.0, now_s - f.burst_at_s) / hl)


def _poisson_z(rate: float, base: float, window_s: float) -> float:
    """z of a window's count at `rate` against `base` (req/s) over `window_s` s, by
    Poisson's deviation (at least one request's)."""
    return (rate - base) * window_s / poisson_count_sd(base, window_s)


def _spread_after(noise: float | None, z: float, cap: float, tick_s: float) -> float:
    """A window's spread (mean of z squared, NOISE_HALF_LIFE_S, from a Poisson prior
    of 1) after one tick's `z`, which adds at most `cap` squared."""
    a = 1.0 - 0.5 ** (tick_s / NOISE_HALF_LIFE_S)
    before = 1.0 if noise is None else noise
    return before + a * (min(z * z, cap**2) - before)


def _sigma(noise: float | None) -> float:
    """The deviation in units of Poisson's that a spread `noise` stands for (>= 1)."""
    return max(1.0, math.sqrt(noise)) if noise is not None else 1.0
