"""Step 3 of the decider (controller.decider): what the plant is believed to be (the
engines' learned speed and per-sequence ratio, the learned cold start, the feedback
and knob corrections; controller.plant, controller.feedback) and the per-replica
capacity at the SLA that belief gives, with the knobs the replicas run; and when the
SLA seen may judge the capacity model.

A mixin of `Decider`: the methods read the decider's `model`, `policy`, `profile` and
`_max_gap_s`, and are pure like `decide`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from controller.batching import fewest_seqs
from controller.capacity import capacity_rps, fleet_capacity_rps, relaxed_sla
from controller.config import SLA, ModelConfig, ScalingPolicy
from controller.demand import SATURATED_SLOTS_FRAC
from controller.feedback import (
    AT_CAP_FRAC,
    DECODE_BOUND_FRAC,
    LOADED_FRAC,
    correction_ceiling,
    knob_target_out_of_reach,
    next_cold_start,
    next_correction,
    next_knob_correction,
    sla_evidence,
    streaming_evidence,
)
from controller.nodata import partial_data
from controller.plant import (
    FIT_MAX_WAITING_PER_REPLICA,
    MAX_WAITING_PER_REPLICA,
    believed_profile,
    learn_plant,
    median_reads_slower,
    next_overhead,
    overhead_sample,
    window_parts,
)
from controller.types import DataHealth, KnobMemory, Knobs, Lengths, ModelState, PlantBelief
from estimators.stepmodel import Profile
from estimators.types import Observation


class PlantSteps:
    """Plant-belief and capacity steps of `Decider` (see the module doc)."""

    model: ModelConfig
    policy: ScalingPolicy
    profile: Profile
    _max_gap_s: float

    def _capacity(
        self, knobs: Knobs, lengths: Lengths, profile: Profile, replicas: int, sla: SLA
    ) -> float:
        """Per-replica capacity at `sla` with `knobs` on `profile` in a fleet of
        `replicas`, req/s."""
        utilization = self.policy.target_utilization_frac
        return capacity_rps(knobs, lengths, sla, profile, utilization, replicas)

    def _plant(
        self,
        obs: Observation,
        state: ModelState,
        memory: KnobMemory,
        knobs: Knobs,
        lengths: Lengths | None,
        now_s: float,
        demand_rps: float = 0.0,
        shifted: bool = False,
    ) -> tuple[tuple[float, float] | None, PlantBelief, bool, bool]:
        """Step 3: the updated belief about the plant (controller.plant: the learned
        speed, the feedback correction), the per-replica capacity at the SLA with
        the knobs the replicas run on the profile x that speed (req/s; None without
        length statistics; the correction is applied by the caller), whether the
        SLA is out of reach (then capacity is at a relaxed one: SLA_INFEASIBLE), and
        whether the ITL target is out of the knobs' reach (KNOBS_SLA_INFEASIBLE:
        `_knob_correction`).

        Replicas still on knobs from before a change count with those: capacity is the
        fleet's mean. Example: 2 of 4 replicas on knobs worth 10 req/s, the published
        ones worth 14 -> 12 req/s per replica.

        Where the length belief was `shifted` on this tick (controller.knobstep.
        lengths_replaced, prefix_fell) a correction past 1 is brought to 1 (`_correction`).
        """
        ceiling = 1.0 if shifted else correction_ceiling(self.policy.target_utilization_frac)
        c = min(state.plant.capacity_correction, ceiling)  # held to a ceiling now lower
        prev_tick = state.forecast.load.at_s if state.forecast.load is not None else None
        dt = 0.0 if prev_tick is None else min(max(0.0, now_s - prev_tick), self._max_gap_s)
        belief = self._speed(obs, state, memory, knobs, lengths, now_s, dt)
        belief = self._timings(obs, state, belief, now_s, dt)
        profile = believed_profile(self.profile, belief)
        # Where one unloaded replica comes within RELAX_FACTOR of a target, sized relaxed.
        relaxed = None if lengths is None else relaxed_sla(knobs, lengths, self.model.sla, profile)
        sla = relaxed or self.model.sla
        caps = (
            None
            if lengths is None
            else fleet_capacity_rps(
                lambda n: self._capacity(knobs, lengths, profile, n, sla),  # type: ignore[arg-type]
                demand_rps / c,
                state.replicas,
                self.model.replicas.max_replicas,
                self.policy.tolerance_frac,
            )
        )
        if caps is not None and memory.running is not None and state.replicas > 0:
            # Never more than the published knobs' capacity: knobs that batch more than
            # the SLA allows serve worse, not better (the fluid model cannot see that).
            n = max(1, state.replicas)
            old = min(caps[1], self._capacity(memory.running, lengths, profile, n, sla))  # type: ignore[arg-type]
            n_old = min(memory.running_replicas, state.replicas)
            mixed = (n_old * old + (state.replicas - n_old) * caps[1]) / state.replicas
            caps = (caps[0] * mixed / caps[1], mixed)
        base_capacity = None if caps is None else caps[1]  # the fleet we have
        requests = obs.arrival_rate_rps * self.policy.window_s
        correction = self._correction(
            obs, state, (c, ceiling), base_capacity, now_s, dt, relaxed is not None
        )
        knob_correction, out_of_reach = self._knob_correction(
            obs, state, memory, knobs, now_s, dt, requests
        )
        plant = replace(belief, capacity_correction=correction, knob_correction=knob_correction)
        return caps, plant, relaxed is not None, out_of_reach

    def _correction(
        self,
        obs: Observation,
        state: ModelState,
        correction: tuple[float, float],
        base_capacity: float | None,
        now_s: float,
        dt: float,
        relaxed: bool,
    ) -> float:
        """Step 3's capacity correction (controller.feedback.next_correction) after this
        window, from `correction` (the correction and its ceiling this tick), on the
        fleet we have priced at `base_capacity` (req/s a replica, uncorrected; None:
        unknown) and an SLA `relaxed` or not.

        The ceiling is 1 on a tick where the length belief was replaced (a shift,
        controller.knobstep.lengths_replaced, or a prefix-hit share that fell as far,
        controller.knobstep.prefix_fell): a correction past 1 was the model shown
        pessimistic on the old lengths, and on the new ones the model may err the other
        way. A belief that drifts (under SHIFT_RISE) keeps it. Example
        (`synthetic:length-shift:rate=40,duration=3600`, outputs 4x longer from 1,800 s,
        start 4): 1.15 learned by then, held through the shift, TTFT p95 2.4 s in minute
        32 and 96.84 % over the hour; brought to 1 at 1,860 s, 352 ms and 97.33 %, on 8 %
        more GPU-hours (the fleet sized at 1).
        """
        c, ceiling = correction
        # The model is only wrong if the fleet we have was believed big enough (demand
        # within the deadband of its estimated capacity: we did not mean to scale up).
        believed_enough = (
            base_capacity is not None
            and obs.arrival_rate_rps
            <= state.replicas * base_capacity * c * (1.0 + self.policy.tolerance_frac)
        )
        # ...and it is only shown too pessimistic by a fleet that is healthy while loaded
        # near what the corrected estimate says it can take (a healthy idle fleet proves
        # nothing about its limit).
        loaded = (
            base_capacity is not None
            and obs.ready_replicas is not None
            and obs.ready_replicas > 0
            and obs.arrival_rate_rps >= LOADED_FRAC * obs.ready_replicas * base_capacity * c
        )
        requests = obs.arrival_rate_rps * self.policy.window_s
        violated, healthy = sla_evidence(obs, self.model.sla, requests)
        # An SLA out of every fleet's reach is violated whatever the fleet: no evidence.
        judge = believed_enough and not relaxed and self._judge(obs, state, now_s)
        complete = partial_data(obs, state.replicas) is None
        return next_correction(c, dt, violated, healthy, judge, loaded, ceiling, complete)

    def _timings(
        self, obs: Observation, state: ModelState, belief: PlantBelief, now_s: float, dt: float
    ) -> PlantBelief:
        """Step 3's learned cold start (controller.feedback.next_cold_start) and
        per-request overhead (controller.plant.next_overhead) on `belief`."""
        cold = next_cold_start(self.model.cold_start_s, state, obs, now_s, self._max_gap_s)
        overhead = next_overhead(
            state.plant.overhead_ms,
            overhead_sample(obs, self.policy.window_s),
            dt,
            self.profile.request_overhead_ms,
        )
        return replace(belief, cold_start_s=cold, overhead_ms=overhead)

    def _knob_correction(
        self,
        obs: Observation,
        state: ModelState,
        memory: KnobMemory,
        knobs: Knobs,
        now_s: float,
        dt: float,
        requests: float,
    ) -> tuple[float, bool]:
        """Step 3's knob correction after this window (controller.plant.
        next_knob_correction), and whether the ITL target is out of the knobs' reach:
        the stream violated where the knobs in force run the fewest sequences they may
        (batching.fewest_seqs), which no smaller budget lowers. Judged on `slo` knobs
        only, at the sequence cap of the knobs every ready replica runs (`knobs`, none
        still on older ones), published a whole window before the sample with no
        candidate pending. The fleet need not be whole: a replica's stream at its cap is
        its own knobs' doing, whatever the others."""
        k = state.plant.knob_correction
        n = obs.ready_replicas
        if self.model.batching_policy != "slo" or obs.running is None or not n:
            return k, False
        b = obs.running / n
        at_cap = b >= AT_CAP_FRAC * knobs.max_num_seqs
        # Decode-bound steps only: where prompts fill the steps' token budget (a queue
        # behind chunked prefill: the conversation trace's start-up ran every step with
        # a chunk), the stream is slow for the budget's chunks, which more replicas
        # drain, not for the batch the knobs allow.
        tokens = obs.step_tokens_mean
        decode_bound = (
            tokens is not None
            and max(0.0, tokens - b) <= DECODE_BOUND_FRAC * knobs.max_num_batched_tokens
        )
        changed = memory.changed_at_s
        settled = (
            memory.running is None
            and memory.candidate is None
            and (changed is None or now_s - obs.staleness_s - changed >= self.policy.window_s)
        )
        violated, healthy = streaming_evidence(obs, self.model.sla, requests)
        floored = knobs.max_num_seqs <= fewest_seqs(self.model.knobs)
        judged = at_cap and decode_bound
        return (
            next_knob_correction(k, dt, violated, healthy, judged, settled, floored),
            knob_target_out_of_reach(violated, judged, settled, floored),
        )

    def _speed(
        self,
        obs: Observation,
        state: ModelState,
        memory: KnobMemory,
        knobs: Knobs,
        lengths: Lengths | None,
        now_s: float,
        dt: float,
    ) -> PlantBelief:
        """Step 3's learned speed and per-sequence ratio after this window
        (controller.plant.next_speed, next_seq_ratio)."""
        # The token budget the engines ran: replicas still on knobs from before a change
        # run theirs (a bigger budget makes bigger chunk steps; the new knobs' budget
        # read them as a 4.8x slower plant when 256/8192 -> 16/1536 on long prompts).
        in_force = memory.largest(knobs)
        budget = in_force.max_num_batched_tokens
        # A jump to a much slower belief needs a window past the last scale-up's dead
        # time (one holding the burst that asked for it read code x4 at a 30 s scrape
        # 5.1x slow) whose median gap reads slow too (not a stall's few long gaps),
        # confirmed by windows half a window apart (new scrapes).
        parts = window_parts(obs, lengths, self.profile, self.policy.window_s, budget)
        standing = None
        if parts is None and self._standing_queue(obs, state, now_s, in_force):
            standing = window_parts(
                obs, lengths, self.profile, self.policy.window_s, budget, math.inf, step_priced=True
            )
        typical = median_reads_slower(obs, standing if parts is None else parts, state.plant)
        allowed = self._past_scale_up(state, now_s) and typical
        fit = window_parts(
            obs, lengths, self.profile, self.policy.window_s, budget, FIT_MAX_WAITING_PER_REPLICA
        )
        clean = window_parts(obs, lengths, self.profile, self.policy.window_s, budget, max_chunks=1)
        confirm_s = self.policy.window_s / 2.0
        return learn_plant(state.plant, parts, dt, now_s, confirm_s, allowed, fit, clean, standing)

    def _standing_queue(
        self, obs: Observation, state: ModelState, now_s: float, knobs: Knobs
    ) -> bool:
        """Whether the engines ran at their limit for the window behind a queue: one
        past MAX_WAITING_PER_REPLICA stood at this reading and the last tick's, on a
        fleet whole for a window (DataHealth.full_since_s), with `knobs` (the largest in
        force) at least SATURATED_SLOTS_FRAC spent in sequence slots, token budget
        (`step_tokens_mean`) or KV cache. An engine queues only what it cannot admit: a
        queue beside free slots, budget and KV is in transit (the conversation trace's
        start-up with a 2x cold start held 56 waiting per replica beside 34 of 144
        slots, 92 of 2,560 tokens a step and 8 % of the KV cache; its ITL read a plant
        of the profile's speed as 2.1x).

        Such a window teaches the speed too (priced at the tokens its steps ran,
        window_parts' `step_priced`). Without it a fleet that never catches up never
        learns why: engines 4x slower than the profile, started at one replica on the
        long-context trace, held a queue for 14 minutes at a believed speed of 1.00
        while 1,602 of the first 1,653 requests missed their SLA (51.27 % for the half
        hour). Its queued windows read 3.9-4.6x, at 37-40 of 80 slots, 1,370-1,446 of
        2,304 tokens a step and 60 % of the KV cache; with them the speed jumps to 3.87
        in the sixth minute and 84.20 % meet the SLA (tests/scenario/test_far_off.py)."""
        n = obs.ready_replicas if obs.ready_replicas is not None else state.replicas
        before = state.forecast.short_waiting
        if obs.waiting is None or before is None or obs.running is None or n <= 0:
            return False
        full = self._health_after(obs, state, now_s).full_since_s
        if full is None or now_s - obs.staleness_s - full < self.policy.window_s:
            return False  # the window ends at the sample, and must start on the fleet
        if min(obs.waiting, before) / n <= MAX_WAITING_PER_REPLICA:
            return False
        spent = (
            obs.running / n / knobs.max_num_seqs,
            (obs.step_tokens_mean or 0.0) / knobs.max_num_batched_tokens,
            obs.kv_usage_frac or 0.0,
        )
        return max(spent) >= SATURATED_SLOTS_FRAC

    def _judge(self, obs: Observation, state: ModelState, now_s: float) -> bool:
        """Whether the SLA seen now may judge the capacity model (see controller.plant).

        Only on a fleet seen whole (ready replicas >= those asked for), with the queue it
        had then drained (DataHealth.calm_since_s), for a window, and a (learned) cold
        start plus a window past a scale-up: the window must not hold samples from before
        the new replicas served (judging then would count the same violation twice and
        overshoot), however slow their cold start really was; likewise the first window
        after the controller starts holds whatever happened before we were in charge.
        """
        # Calm on this tick too: the same rule the tick's health record keeps.
        calm = self._health_after(obs, state, now_s).calm_for(now_s, self.policy.window_s)
        return calm and self._past_scale_up(state, now_s) and state.replicas > 0

    @staticmethod
    def _health_after(obs: Observation, state: ModelState, now_s: float) -> DataHealth:
        """The data health after this tick's good observation (DataHealth.after_good):
        what the tick's new state keeps, and what its judgements read."""
        return state.health.after_good(now_s, obs.ready_replicas, state.replicas, obs.waiting)

    def _past_scale_up(self, state: ModelState, now_s: float) -> bool:
        """Whether the last scale-up (if any) is a cold start plus a window ago, s: the
        window no longer holds the overloaded stretch that asked for it."""
        last_up, dead_s = state.windows.last_scale_up_s, self._cold_start(state.plant)
        return last_up is None or now_s - last_up >= dead_s + self.policy.window_s

    def _cold_start(self, plant: PlantBelief) -> float:
        """The dead time's cold start, s: the learned one (the forecast's lead keeps the
        configured one: the learned one includes the scrape that shows replicas ready)."""
        return plant.cold_start_s or self.model.cold_start_s
