"""Step 2 of the decider (controller.decider): request lengths, smoothed, and the
batching knobs by the model's policy, adopted only when the change is material and
sustained; which replicas still run knobs from before a change.

A mixin of `Decider`: the methods read the decider's `model`, `policy`, `profile`,
`default_knobs` and `_max_gap_s`, and are pure like `decide`.
"""

from __future__ import annotations

from dataclasses import replace

from controller.batching import clamp_knobs, seed_policy_knobs, slo_knobs, throughput_knobs
from controller.config import ModelConfig, ScalingPolicy
from controller.feedback import streaming_violated
from controller.plant import believed_profile
from controller.types import KnobMemory, Knobs, LengthRises, Lengths, ModelState, Reason
from estimators.smoothing import ewma
from estimators.stepmodel import Profile
from estimators.types import Observation

INFLIGHT_RISE = 2.0
"""How far the outputs in flight (`inflight_output_tokens`) must exceed the smoothed
output mean before they replace it (ratio). Against the window's histogram mean they
read 1.06x at the median and up to 1.84x on conversation x16 at a 30 s scrape (the
running gauge is one instant); outputs 4x longer read 4.2x."""
INFLIGHT_SUSTAIN_S = 30.0
"""How long the outputs in flight must read past the rise, on every good tick, before
they replace the belief (s): an engine that stalls for a few seconds piles up running
sequences that the window's mean ITL does not yet show (a recorded real-engine run read
93 tokens in flight for 4 s of 16-token outputs)."""
SHIFT_RISE = 1.5
"""How far a window's mean length, prompts or outputs (the length histograms'), must
read past the smoothed mean before it replaces it (ratio). No cell of the one-factor,
combined or quick matrix moved with it (their windows swing less, or not for
SHIFT_SUSTAIN_S); prompts 3x longer read 1.34x 10 s after the shift and 1.93x 25 s
after it (a 60 s window fills)."""
SHIFT_SUSTAIN_S = 30.0
"""How long a window's mean must read past SHIFT_RISE, on every good tick, before it
replaces the belief (s): a burst of long requests that passes is not a shift."""
SHIFT_MIN_REQUESTS = 100.0
"""Fewest requests in the rate window (arrival rate x window) for its mean length to
replace the belief: heavy-tailed lengths vary by their own size (long-context prompts:
mean 12k, p95 40k tokens), and a window of 8 read 25.6k against 16.5k believed."""
INFLIGHT_MIN_RUNNING = 8.0
"""Fewest running sequences per ready replica for the in-flight reading: the running
gauge is one instant, and a handful of sequences is noise."""


def sustained_rise(since_s: float | None, now_s: float, rising: bool) -> float | None:
    """Since when a reading has been past its rise on every good tick (s), given since
    when it was on the last one (`since_s`) and whether it is on this one; None: not."""
    if not rising:
        return None
    return now_s if since_s is None else since_s


def risen_length(
    window: tuple[float, float],
    belief: tuple[float, float],
    since_s: float | None,
    now_s: float,
    trusted: bool,
) -> tuple[float, float, float | None]:
    """The (mean, p95) of one length (tokens) after a window that read (mean, p95)
    `window` against the smoothed `belief`, and since when the window's mean has read
    past SHIFT_RISE x the belief's (`since_s` on the last tick; None: not). Once it has
    for SHIFT_SUSTAIN_S the window's mean replaces the belief's and its p95 the belief's
    where higher. Only on a `trusted` window (enough requests, a history a half-life
    old): elsewhere the belief stands. Example: prompts believed 1,460 / 4,724 tokens
    (mean / p95), windows reading 2,877 from 625 s on, 4,232 / 12,700 at 655 s -> 4,232 /
    12,700 then."""
    mean, p95 = belief
    since = sustained_rise(since_s, now_s, trusted and window[0] > SHIFT_RISE * mean)
    if since is None or now_s - since < SHIFT_SUSTAIN_S:
        return mean, p95, since
    return window[0], max(window[1], p95), since


def lengths_replaced(rises: LengthRises, now_s: float) -> bool:
    """Whether a reading of longer requests replaced the length belief on this tick
    (`risen_length`, `KnobSteps._inflight`): a shift, where what was learned of the
    plant on the old lengths (the capacity correction past 1) no longer holds."""
    sustained = (
        (rises.prompt_since_s, SHIFT_SUSTAIN_S),
        (rises.output_since_s, SHIFT_SUSTAIN_S),
        (rises.inflight_since_s, INFLIGHT_SUSTAIN_S),
    )
    return any(since is not None and now_s - since >= need for since, need in sustained)


def prefix_fell(old: Lengths | None, new: Lengths | None) -> bool:
    """Whether the believed prefix-hit share fell on this tick (from `old`'s to `new`'s;
    it falls at once, `KnobSteps._lengths`) far enough that the prompt tokens the engines
    compute grew SHIFT_RISE x, as a length shift's prompts do (`lengths_replaced`): what
    was learned of the plant while the cache spared them (the correction past 1) no
    longer holds. Example: 0.6 -> 0.4 computes 1.5x the tokens (0.4 -> 0.6 of each
    prompt) and is one; 0.2 -> 0.1 (1.125x) is not."""
    if old is None or new is None or new.prefix_hit_frac >= old.prefix_hit_frac:
        return False
    # 1e-9: the example's 0.6 -> 0.4 is 1.5x in decimals, a hair under it in floats
    return 1.0 - new.prefix_hit_frac >= SHIFT_RISE * (1.0 - old.prefix_hit_frac) - 1e-9


def inflight_output_tokens(obs: Observation) -> float | None:
    """The mean output length of the requests in flight, tokens, by Little's law: a
    request runs for its prefill and then one inter-token latency per output token, so
    running = arrival rate x (prefill time + output x mean ITL). None without the
    signals, under INFLIGHT_MIN_RUNNING a replica, or with a queue (more than one
    waiting a replica: the running count is then the slots, not the load).

    The output-length histogram counts a request when it finishes, so after a shift to
    longer outputs it reads the short ones that finish first for minutes; the running
    count holds the long ones from their first token. Example: 40 req/s, 600 running,
    mean ITL 20 ms, prefill 50 ms -> (15 s - 0.05 s) / 0.02 s = 748 tokens."""
    lam = max(obs.arrival_rate_rps, obs.arrival_rate_short_rps or 0.0)
    running, itl_ms = obs.running, obs.itl_mean_ms
    if lam <= 0 or running is None or itl_ms is None or itl_ms <= 0 or obs.waiting is None:
        return None
    replicas = max(1, obs.ready_replicas or 1)
    if running < INFLIGHT_MIN_RUNNING * replicas or obs.waiting > replicas:
        return None
    decode_s = running / lam - (obs.prefill_time_mean_ms or 0.0) / 1000.0
    return max(0.0, decode_s) * 1000.0 / itl_ms


class KnobSteps:
    """Knob and length steps of `Decider` (see the module doc)."""

    model: ModelConfig
    policy: ScalingPolicy
    profile: Profile
    default_knobs: Knobs
    _max_gap_s: float

    def _knob_memory(
        self,
        state: ModelState,
        knobs: Knobs,
        reason: Reason,
        pending: KnobMemory,
        rollout: bool,
        now_s: float,
    ) -> KnobMemory:
        """Step 2's memory: the pending candidate, the change count, and which replicas
        still run knobs from before the last change (they serve with those until a
        rolling restart or a scale-down replaces them)."""
        old = state.knob_memory
        running, n, until = (
            old.running,
            min(old.running_replicas, state.replicas),
            old.running_until_s,
        )
        if reason == Reason.KNOBS_CHANGED:
            running, n = state.knobs, state.replicas
            if self.policy.knobs_live:
                until = now_s  # every replica runs them from its next step
            else:
                until = self._rollout_end_s(now_s, n) if rollout else None
        if running is None or running == knobs or n <= 0 or (until is not None and now_s >= until):
            running, n, until = None, 0, None
        return KnobMemory(
            candidate=pending.candidate,
            candidate_since_s=pending.candidate_since_s,
            changes=old.changes + (1 if reason == Reason.KNOBS_CHANGED else 0),
            running=running,
            running_replicas=n,
            running_until_s=until,
            changed_at_s=now_s if reason == Reason.KNOBS_CHANGED else old.changed_at_s,
        )

    def _knob_change(
        self, state: ModelState, knobs: Knobs, reason: Reason, pending: KnobMemory, now_s: float
    ) -> tuple[bool, KnobMemory]:
        """Whether publishing `knobs` (for `reason`) asks for a rolling restart (a change
        of at least knob_rollout_gain_frac from the knobs in force, on engines that do
        not follow knobs live), and step 2's memory after it (`_knob_memory`)."""
        rollout = (
            reason == Reason.KNOBS_CHANGED
            and not self.policy.knobs_live
            and self._material(knobs, state.knobs, self.policy.knob_rollout_gain_frac)
        )
        return rollout, self._knob_memory(state, knobs, reason, pending, rollout, now_s)

    def _rollout_end_s(self, now_s: float, replicas: int) -> float:
        """When a roll-out of `replicas` started at `now_s` is over, seconds: it restarts
        one replica at a time, each a cold start."""
        return now_s + self.model.cold_start_s * max(1, replicas)

    def rollout_waiting(self, state: ModelState, now_s: float) -> ModelState:
        """`state` for a tick on which the roll-out it asked for still waits (an
        actuator holds it, controller.actuation.RolloutGate): the replicas on the knobs
        from before the change run them for a whole roll-out from `now_s` (a cold start
        each), not from when it was asked for. Unchanged when no roll-out is counted."""
        mem = state.knob_memory
        if mem.running is None or mem.running_until_s is None:
            return state
        until = self._rollout_end_s(now_s, mem.running_replicas)
        return replace(
            state, knob_memory=replace(mem, running_until_s=max(mem.running_until_s, until))
        )

    def _bounded(self, state: ModelState) -> Knobs:
        """The knobs in force moved inside the model's knob bounds configured now (they
        lie outside after the bounds were narrowed: a target edit, a restart or a
        takeover on a new config)."""
        return clamp_knobs(state.knobs, self.model.knobs)

    def _no_data_knobs(
        self, state: ModelState, now_s: float
    ) -> tuple[Knobs, Reason, KnobMemory, bool]:
        """Step 2 without data, for a valid decision (the no-data fallback): the knobs in
        force, their memory unchanged (KNOBS_NO_DATA, no roll-out); once the bounds were
        narrowed, moved inside them as a good tick would (`_knobs`: KNOBS_CHANGED, the
        pending candidate dropped, the replicas still on the old knobs remembered).
        Returns (knobs, reason, memory, rollout)."""
        bounded = self._bounded(state)
        if bounded == state.knobs:
            return state.knobs, Reason.KNOBS_NO_DATA, state.knob_memory, False
        reason = Reason.KNOBS_CHANGED
        rollout, memory = self._knob_change(state, bounded, reason, KnobMemory(), now_s)
        return bounded, reason, memory, rollout

    def _lengths(
        self, obs: Observation, state: ModelState, now_s: float
    ) -> tuple[Lengths | None, LengthRises]:
        """Smoothed length statistics: this tick's, blended into the last known ones with
        a half-life of `lengths_half_life_s`; the last known when this tick has none.

        The per-window means of a bursty trace swing by 2x or more from one minute to
        the next, and capacity and knobs follow them: smoothing keeps one odd window from
        resizing the fleet. Example: last 2,000 tokens, this window 4,000, 5 s later with
        a 300 s half-life -> 2,023 tokens (with 20 s of history: a 20 s half-life ->
        2,318 tokens). Lengths that grew jump instead (`_grown`).

        The prefix-cache hit share (`Lengths.prefix_hit_frac`) rises with the same
        half-life but falls at once to a window that reads less (a cache that stops
        hitting, as a fleet grows behind a router that does not route by prefix, or as
        KV pressure evicts, makes every prompt cost its whole prefill now); a window with
        none (no prefill queried, an engine without the counters) keeps the last known
        one (none known: 0, every prompt token priced).
        """
        pm, pp, om, op = (
            obs.prompt_tokens_mean,
            obs.prompt_tokens_p95,
            obs.output_tokens_mean,
            obs.output_tokens_p95,
        )
        old = state.forecast.lengths
        if pm is None or om is None:
            return old, LengthRises()
        hit = obs.prefix_cache_hit_frac
        if hit is None:
            hit = 0.0 if old is None else old.prefix_hit_frac
        hit = min(hit, 1.0)
        # A p95 missing this tick (its bucket answer empty, a recording rule lagging)
        # keeps the last known one: the mean in its place reads less spread, and long-
        # context prompts (12k / 40k) then sized the fleet at 18 replicas where 48 serve.
        # With nothing known yet, the mean is all there is.
        if pp is None:
            pp = pm if old is None else max(pm, old.prompt_p95)
        if op is None:
            op = om if old is None else max(om, old.output_p95)
        new = Lengths(
            prompt_mean=pm, prompt_p95=pp, output_mean=om, output_p95=op, prefix_hit_frac=hit
        )
        last = state.forecast.load.at_s if state.forecast.load is not None else None
        if old is None or last is None:
            return new, LengthRises()
        # A data gap is no evidence that the lengths moved: the window after it weighs as
        # one MAX_GAP_TICKS after the last (as the Holt filter and the correction do);
        # weighed over a 600 s gap it was 75 % of the belief and could shrink the fleet.
        dt, hl = min(now_s - last, self._max_gap_s), self.policy.lengths_half_life_s
        # While the history is younger than the half-life, the half-life is its age: the
        # first windows hold a few requests (at a 5 s scrape the first one read long-
        # context prompts as 5.6k / 9.5k tokens, mean / p95, against 12k / 40k), and
        # blended in at 300 s they sized the fleet 6x too small for minutes.
        first = state.health.first_good_s
        if first is not None:
            hl = min(hl, max(dt, now_s - first))
        smoothed = Lengths(
            prompt_mean=ewma(old.prompt_mean, new.prompt_mean, dt, hl),
            prompt_p95=ewma(old.prompt_p95, new.prompt_p95, dt, hl),
            output_mean=ewma(old.output_mean, new.output_mean, dt, hl),
            output_p95=ewma(old.output_p95, new.output_p95, dt, hl),
            prefix_hit_frac=min(hit, ewma(old.prefix_hit_frac, hit, dt, hl)),
        )
        return self._grown(obs, state, now_s, new, smoothed)

    def _grown(
        self, obs: Observation, state: ModelState, now_s: float, new: Lengths, smoothed: Lengths
    ) -> tuple[Lengths, LengthRises]:
        """`smoothed`, with the lengths that grew for their belief, after a window that
        read `new`; and since when each reading has read past the belief.

        Where a window's mean prompt or output length has read past SHIFT_RISE x the
        smoothed one for SHIFT_SUSTAIN_S (`risen_length`), that window's lengths are the
        belief. Example (`synthetic:length-shift:rate=40,prompt_x=3,output_x=1`,
        prompts 3x longer at 600 s): believed 1,460 tokens at 600 s and, smoothed alone,
        2,425 at 800 s against windows of 4,400, while the fleet grew 6 -> 13 on its
        queue over three minutes; the windows read past 1.5x from 625 s on, and the belief
        was theirs (4,232 tokens) at 655 s.

        And where the outputs in flight (`inflight_output_tokens`) read more than
        INFLIGHT_RISE x the smoothed mean for INFLIGHT_SUSTAIN_S, on a fleet calm for a
        rate window, the mean is theirs and the p95 grows by as much.
        Example (`synthetic:length-shift:rate=40`, outputs 4x longer at 600 s, their
        mean 172 -> 676): at 615 s the histogram read 214 tokens (smoothed 162), the
        running count 334 sequences at 40.1 req/s, a mean ITL of 12.1 ms and a prefill
        of 46 ms: 686 tokens in flight. Smoothed alone, the belief reached 184 tokens by
        660 s, the fleet stepped down 6 -> 4 there, and minutes 11-12 met 7 % and 35 %
        of the SLA (97 % and 99 % with the jump, at 645 s).
        """
        rises = state.forecast.rises
        first = state.health.first_good_s
        # A window of enough requests, on a history older than a half-life (before that
        # the half-life is the history's age: the belief follows the windows anyway,
        # and outputs read short while only the short ones have finished).
        trusted = (
            first is not None
            and now_s - first >= self.policy.lengths_half_life_s
            and obs.arrival_rate_rps * self.policy.window_s >= SHIFT_MIN_REQUESTS
        )
        pm, pp, prompt_since = risen_length(
            (new.prompt_mean, new.prompt_p95),
            (smoothed.prompt_mean, smoothed.prompt_p95),
            rises.prompt_since_s,
            now_s,
            trusted,
        )
        om, op, output_since = risen_length(
            (new.output_mean, new.output_p95),
            (smoothed.output_mean, smoothed.output_p95),
            rises.output_since_s,
            now_s,
            trusted,
        )
        risen = Lengths(
            prompt_mean=pm,
            prompt_p95=pp,
            output_mean=om,
            output_p95=op,
            prefix_hit_frac=smoothed.prefix_hit_frac,
        )
        lengths, inflight_since = self._inflight(obs, state, now_s, risen)
        return lengths, LengthRises(prompt_since, output_since, inflight_since)

    def _inflight(
        self,
        obs: Observation,
        state: ModelState,
        now_s: float,
        smoothed: Lengths,
    ) -> tuple[Lengths, float | None]:
        """`smoothed`, or with the outputs in flight for its output mean (the p95 grown by
        as much) where they have read past INFLIGHT_RISE x the smoothed mean on every
        good tick for INFLIGHT_SUSTAIN_S; and since when they have (None: not on this
        tick). On a fleet calm for a whole rate window only: a queue draining (a
        start-up's, a cold start's) admits faster than requests arrive, and the running
        count then reads long outputs that are not there."""
        if not state.health.calm_for(now_s, self.policy.window_s):
            return smoothed, None
        inflight = inflight_output_tokens(obs)
        rising = inflight is not None and inflight > INFLIGHT_RISE * smoothed.output_mean
        since = sustained_rise(state.forecast.rises.inflight_since_s, now_s, rising)
        if inflight is None or since is None or now_s - since < INFLIGHT_SUSTAIN_S:
            return smoothed, since
        grown = inflight / smoothed.output_mean
        out_p95 = smoothed.output_p95 * grown
        return replace(smoothed, output_mean=inflight, output_p95=out_p95), since

    def _knobs(
        self, obs: Observation, lengths: Lengths | None, state: ModelState, now_s: float
    ) -> tuple[Knobs, Reason, KnobMemory]:
        """Step 2: knobs to publish, the reason, and the candidate memory (its `changes`
        count is the caller's)."""
        bounds = self.model.knobs
        policy = self.model.batching_policy
        if policy == "static":
            return clamp_knobs(self.default_knobs, bounds), Reason.KNOBS_STATIC, KnobMemory()
        current = self._bounded(state)
        if current != state.knobs:
            # The bounds were narrowed (a target edit, a restart on a new config): the
            # knobs in force move inside them now, data or not (a change short of
            # knob_min_gain_frac would otherwise never be made).
            return current, Reason.KNOBS_CHANGED, KnobMemory()
        # Knobs move only on this tick's own length statistics under real demand: not on
        # remembered lengths, nor on the few requests of an idle window. Time without
        # such data does not count towards a candidate's sustain (`_unsustained`).
        last = state.health.last_good_s
        own = obs.prompt_tokens_mean is not None and obs.output_tokens_mean is not None
        if lengths is None or not own or obs.arrival_rate_rps <= 0:
            return current, Reason.KNOBS_NO_DATA, self._unsustained(state, now_s, last)
        short = False  # at the max replicas and short: the knobs serve throughput
        if policy == "seed":
            seed = seed_policy_knobs(obs, self.model.sla)
            if isinstance(seed, str):
                return state.knobs, Reason.KNOBS_NO_DATA, KnobMemory()
            candidate = clamp_knobs(seed, bounds)
        else:
            # On the profile x the learned speed: slower engines fit fewer sequences
            # into the ITL target.
            profile = believed_profile(self.profile, state.plant)
            margin = self.policy.itl_margin_frac * state.plant.knob_correction
            candidate = slo_knobs(lengths, self.model.sla, profile, bounds, margin)
            short = self._short_at_max(state)
            if short:
                candidate = throughput_knobs(candidate, lengths, profile, bounds)
        if candidate == current:
            kept = Reason.KNOBS_THROUGHPUT if short else Reason.KNOBS_UNCHANGED
            return current, kept, KnobMemory()
        if not self._material(candidate, current):
            return current, Reason.KNOBS_NOT_MATERIAL, KnobMemory()
        pending = state.knob_memory
        if last is None or now_s - last > self._max_gap_s:  # no data in between
            pending = self._unsustained(state, now_s, last)
        prev, since = pending.candidate, pending.candidate_since_s
        if prev is None or since is None or self._material(candidate, prev):
            since = now_s
        if now_s - since >= self._sustain_s(obs, state, candidate, current):
            return candidate, Reason.KNOBS_CHANGED, KnobMemory()
        return current, Reason.KNOBS_PENDING, KnobMemory(candidate, since)

    def _short_at_max(self, state: ModelState) -> bool:
        """Whether the fleet is at its max replicas and the last tick recommended more
        (past the deadband, before the clamp): no scale-up can serve the load, so the
        knobs serve throughput (controller.batching.throughput_knobs)."""
        top = self.model.replicas.max_replicas
        recs = state.windows.recommendations
        return state.replicas >= top and bool(recs) and recs[-1][1] > top

    def _sustain_s(
        self, obs: Observation, state: ModelState, candidate: Knobs, current: Knobs
    ) -> float:
        """How long a candidate must hold before it replaces the knobs in force (s):
        `knob_sustain_s`, which keeps one window's lengths or speed from rolling the
        fleet to knobs of ours that the next window would move again; 0 while the
        engines still run the knobs they started with (no change made yet: the model's
        default knobs, vLLM's or the knob bounds', nobody's choice for this SLA) and
        tokens stream slower than the SLA allows (`streaming_violated`). Example: the
        quick matrix's conversation x4 on a plant 30 % slower than the profile streamed
        at an ITL p95 of 104 ms where the SLA allows 50 ms, while the candidate, moving
        as the speed was learned, restarted its sustain for all 5 minutes
        (docs/decider-history.md)."""
        requests = obs.arrival_rate_rps * self.policy.window_s
        # The knob correction's fewer sequences, while tokens stream too slowly: what the
        # stream says of the knobs in force needs no second window.
        corrected = (
            state.plant.knob_correction < 1.0 and candidate.max_num_seqs < current.max_num_seqs
        )
        if (state.knob_memory.changes == 0 or corrected) and streaming_violated(
            obs, self.model.sla, requests
        ):
            return 0.0
        return self.policy.knob_sustain_s

    def _unsustained(
        self, state: ModelState, now_s: float, last_good_s: float | None
    ) -> KnobMemory:
        """The pending candidate with the time since the last good tick (`last_good_s`,
        seconds) not counted towards its sustain: an idle window or a gap in the data
        says nothing of it. Example: a candidate since 1,000 s, idle ticks to 1,150 s:
        since 1,150 s, and one window with data at 1,155 s is 5 s sustained, not 155 s
        (a stale candidate rolled the fleet out of one window)."""
        mem = state.knob_memory
        if mem.candidate is None or mem.candidate_since_s is None:
            return KnobMemory()
        if last_good_s is None:
            return KnobMemory(mem.candidate, now_s)
        return KnobMemory(mem.candidate, mem.candidate_since_s + max(0.0, now_s - last_good_s))

    def _material(self, a: Knobs, b: Knobs, gain_frac: float | None = None) -> bool:
        """Whether `a` differs from `b` by at least `gain_frac` (default knob_min_gain_frac)
        of `b` in either knob."""
        return a.differs_by(b, self.policy.knob_min_gain_frac if gain_frac is None else gain_frac)
