"""The pure decider: `Decider.decide(observation, state, now_s) -> (Decision, ModelState)`.

One `Decider` per model holds that model's immutable config; `decide` reads nothing
else (no clock, no I/O), so the same inputs always give the same outputs and a decision
can be replayed from its trace. Steps, in order:

1. missing data -> hold (`valid=False`, NO_DATA_HOLD); after N consecutive failed ticks,
   re-assert the last good replicas or the configured fallback if higher
   (NO_DATA_FALLBACK), within the bounds configured now (knobs too). Missing data
   never lowers replicas.
2. knobs by the model's batching policy (`seed`, `slo`, `static`), adopted only when
   the change is material (>= knob_min_gain_frac) and sustained (knob_sustain_s).
3. per-replica capacity at the SLA with the knobs the replicas run (controller.capacity:
   a queueing model of the engine at the attainment goal's quantile, for the smallest
   fleet whose pooled capacity serves the demand) on the profile x the engines' learned
   speed (controller.plant: learned online from their mean ITL against the batch they
   ran, before the SLA is violated), times a feedback correction in [0.4, 1] that
   shrinks while the observed SLA is violated on a fleet seen whole (every replica
   asked for ready) for a window and recovers while it is met with margin on a loaded
   fleet. The cold start (ask to all ready) is learned and sets that dead time.
4. demand = smoothed level (+ the Holt trend over one cold start, half a window more on
   a ramp the short window shows, when it predicts more growth than the deadband; in
   the first window only on such a ramp) +
   backlog / backlog_drain_s. The smoothed level, not the
   raw sample, so one noisy window cannot scale up on its own: a rise the short window
   shows on two ticks in a row (or on one, when the queue grew meanwhile on a whole
   fleet) is scaled up for at once (SHORT_WINDOW), and sudden
   surges past the panic threshold are panic mode's job; both only past the noise of
   the panic window's count (RISE_Z, PANIC_Z: controller.stages.noise_margin_rps;
   panic from the first full window on);
   raw = demand / capacity; idle -> min replicas, zero only after the idle period; at
   zero with demand but no lengths yet (a gateway's rate only) -> 1 (SCALE_FROM_ZERO).
5. burst memory: a surge (the short window well over the long one; a fleet that starts
   small is not a burst) that triggered panic or a SHORT_WINDOW rise is remembered,
   halving every burst_memory_half_life_s, and from then on follows the envelope of
   what the short window shows on two ticks in a row (controller/demand.py); the fleet
   is sized for it while it exceeds the demand (BURST_MEMORY): on/off bursts shorter
   than a cold start cannot be chased, only held;
6. stages (controller.stages): panic, or deadband -> stabilize -> rate-limit; then
   cooldown -> clamp.
7. composite scale-out rules (controller.rules), when the model has any: the final
   replicas raised to a firing rule's floor (RULE_SCALE_OUT), never lowered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controller.batching import fewest_seqs
from controller.capacity import (
    capacity_limit,
    capacity_rps,
    fleet_capacity_rps,
    priced_hit_frac,
    relaxed_sla,
)
from controller.config import SLA, ModelConfig, ScalingPolicy
from controller.demand import PANIC_Z, SATURATED_SLOTS_FRAC, Demand, DemandSteps, Raw
from controller.feedback import (
    AT_CAP_FRAC,
    DECODE_BOUND_FRAC,
    LOADED_FRAC,
    knob_target_out_of_reach,
    next_cold_start,
    next_correction,
    next_knob_correction,
    sla_evidence,
    streaming_evidence,
)
from controller.knobstep import KnobSteps
from controller.nodata import NoDataSteps
from controller.plant import (
    FIT_MAX_WAITING_PER_REPLICA,
    MAX_WAITING_PER_REPLICA,
    believed_profile,
    learn_plant,
    median_reads_slower,
    window_parts,
)
from controller.rules import rules_stage
from controller.stages import (
    StageOut,
    clamp,
    cooldown,
    deadband,
    next_memory,
    panic,
    rate_limit,
    stabilize,
)
from controller.types import (
    DataHealth,
    Decision,
    Forecast,
    Hysteresis,
    KnobMemory,
    Knobs,
    LengthRises,
    Lengths,
    ModelState,
    PlantBelief,
    Reason,
    RuleMemory,
    Stage,
)
from estimators.stepmodel import Profile, load_profile
from estimators.types import NoDataError, Observation, SourceError

# A tick after a gap in the data counts as at most this many tick intervals for the
# feedback correction and the forecast: evidence is one window, whatever the gap was
# (600 s without data and one violated tick must not decay the correction by 600 s).
MAX_GAP_TICKS = 3


@dataclass(frozen=True, slots=True)
class _Outcome:
    """The final replicas and the stage memory they leave behind."""

    replicas: int
    memory: Hysteresis


def _stage(name: str, before: int, out: StageOut) -> Stage:
    """The stage record, shared between equal ones (it is immutable): most stages repeat
    from tick to tick (NOT_LIMITED, NO_COOLDOWN, WITHIN_BOUNDS, ...), and a lookup costs
    a tenth of building one, which also leaves the tick's GC fewer objects to scan."""
    key = (name, before, out.value, out.reason, out.detail)
    stage = _STAGES.get(key)
    if stage is None:
        if len(_STAGES) >= _STAGES_MAX:
            _STAGES.clear()
        stage = _STAGES[key] = Stage(name, before, out.value, out.reason, out.detail)
    return stage


_STAGES_MAX = 8192
_STAGES: dict[tuple[str, int, int, Reason, str], Stage] = {}


class Decider(DemandSteps, KnobSteps, NoDataSteps):
    """Decides replicas and knobs for one model. Immutable; `decide` is pure."""

    def __init__(
        self, model: ModelConfig, policy: ScalingPolicy, profile: Profile | None = None
    ) -> None:
        self.model = model
        self.policy = policy
        self.profile = profile or load_profile(model.profile)
        self._max_gap_s = MAX_GAP_TICKS * policy.tick_interval_s
        self.default_knobs = Knobs(
            max_num_seqs=model.knobs.default_max_num_seqs,
            max_num_batched_tokens=model.knobs.default_max_num_batched_tokens,
        )

    def initial_state(self, replicas: int | None = None, now_s: float | None = None) -> ModelState:
        """State before the first tick: the fleet's current size (or min replicas), at
        most max replicas (the first decision clamps to it anyway; a size read from a
        bad gauge, 10**6 ready replicas, must not reach the capacity model).

        With `now_s`, the stabilization window starts seeded with the current size (as
        the HPA does), so a controller that just started cannot scale down at once.
        """
        r = max(0, self.model.replicas.min_replicas if replicas is None else replicas)
        r = min(r, self.model.replicas.max_replicas)  # a fleet past its bounds is clamped
        recs = () if now_s is None else ((now_s, r),)
        return ModelState(
            replicas=r, knobs=self.default_knobs, windows=Hysteresis(recommendations=recs)
        )

    def resumed_state(self, state: ModelState, now_s: float) -> ModelState:
        """A state restored from the store, as its first tick after a restart uses it:
        the stabilization window gets the restored size at `now_s`, as `initial_state`
        seeds a fresh start. The process may have been down longer than the window, and
        every recommendation remembered from before would have expired: the first good
        tick could then drop the whole fleet (the rate limit allows 100 % per 15 s)."""
        w = state.windows
        recs = (*w.recommendations, (now_s, state.replicas))
        return replace(state, windows=replace(w, recommendations=recs))

    # ------------------------------------------------------------------ decide
    def decide(
        self,
        observation: Observation | NoDataError | SourceError,
        state: ModelState,
        now_s: float,
    ) -> tuple[Decision, ModelState]:
        """One decision for this model at `now_s` (seconds, loop's monotonic clock).

        The steps of the module docstring, in order, each a method below.
        """
        if not isinstance(observation, Observation):
            d, s = self._no_data(observation, state, now_s)  # step 1
            return d, replace(s, rules=RuleMemory())  # rule timers need unbroken data
        obs = observation  # clean by construction (estimators.types.Observation)
        if (why := self._unusable(obs, state)) is not None:  # step 1: a dead fleet
            d, s = self._no_data(NoDataError(obs.model, "engines", why), state, now_s)
            return d, replace(s, rules=RuleMemory())
        lengths, rises = self._lengths(obs, state, now_s)
        knobs, knob_reason, pending = self._knobs(obs, lengths, state, now_s)  # step 2
        rollout, knob_memory = self._knob_change(state, knobs, knob_reason, pending, now_s)
        slots = knob_memory.largest(knobs).max_num_seqs  # a replica's sequence slots
        demand = self._demand(obs, state, now_s, slots)  # step 4
        sizing = self._sizing_demand(state, now_s, demand)
        caps, plant, hard, out_of_reach = self._plant(
            obs, state, knob_memory, knobs, lengths, now_s, sizing
        )
        if out_of_reach and knob_reason == Reason.KNOBS_UNCHANGED:
            knob_reason = Reason.KNOBS_SLA_INFEASIBLE
        if lengths is None and not demand.idle and state.replicas > 0:
            # Demand but no length statistics yet: capacity unknown, hold what we have.
            # The data is good: the fleet's health (whole since, calm since, no-data
            # ticks) is as seen, or a fleet whole through these ticks is judged late.
            d, _ = self._hold(obs.model, state, now_s, "demand without length statistics")
            return d, replace(state, health=self._health_after(obs, state, now_s))
        raw = self._raw(state, now_s, demand, caps, plant, hard)  # steps 4 and 5
        panic_state = self._panic(state, now_s, demand, raw)
        burst = self._burst(state, now_s, demand, (panic_state[2], raw.reason))
        partial = f"{obs.targets_down} engine target(s) down" if obs.targets_down else None
        if partial is None and obs.waiting is None and state.replicas > 0:
            # The queue is unknown, not drained: the replicas asked for it stay.
            partial = "waiting gauge absent"
        stages, windows = self._stages(state, now_s, raw, demand, panic_state, partial)  # step 6
        rules = state.rules
        if self.model.scale_out_rules:  # step 7
            stages, windows, rules = self._rules(obs, state, now_s, stages, windows)
        final = windows.replicas
        new_state = ModelState(
            replicas=final,
            knobs=knobs,
            windows=windows.memory,
            forecast=self._forecast(obs, demand, lengths, burst, now_s, rises),
            knob_memory=knob_memory,
            health=self._health_after(obs, state, now_s),
            plant=plant,
            rules=rules,
        )
        decision = Decision(
            model=obs.model,
            at_s=now_s,
            valid=True,
            replicas=final,
            knobs=knobs,
            stages=tuple(stages),
            knob_reason=knob_reason,
            raw_replicas=raw.raw,
            demand_rps=demand.demand,
            capacity_rps_per_replica=raw.capacity,
            plant_speed=plant.speed,
            plant_seq_ratio=plant.seq_ratio,
            plant_cold_start_s=self._cold_start(plant),
            capacity_correction=plant.capacity_correction,
            knob_correction=plant.knob_correction,
            prefix_hit_frac=None if lengths is None else priced_hit_frac(lengths.prefix_hit_frac),
            capacity_limit=self._limit(knobs, lengths, plant, hard, raw),
            panic=panic_state[0],
            rollout=rollout,
        )
        return decision, new_state

    def _limit(
        self, knobs: Knobs, lengths: Lengths | None, plant: PlantBelief, hard: bool, raw: Raw
    ) -> str | None:
        """Which SLA target bounds the capacity this tick sized with (controller.capacity.
        capacity_limit: "ITL", "TTFT" or "saturation"), at the fleet the raw count asks
        for, on the profile x the learned speed; None when idle, without lengths, or at
        a relaxed SLA (SLA_INFEASIBLE says that one)."""
        if raw.capacity is None or lengths is None or hard:
            return None
        profile = believed_profile(self.profile, plant)
        n = max(1, math.ceil(raw.raw - 1e-9))
        return capacity_limit(knobs, lengths, self.model.sla, profile, n)

    # ------------------------------------------------------------------ steps
    @staticmethod
    def _forecast(
        obs: Observation,
        demand: Demand,
        lengths: Lengths | None,
        burst: tuple[float | None, float | None, float | None],
        now_s: float,
        rises: LengthRises,
    ) -> Forecast:
        """What this tick leaves the next one to forecast from: the smoothed load, the
        lengths, the burst memory (rps, since s, short-window spread), this tick's
        short-window reading with the queue it saw, and since when longer requests have
        read past the length belief (controller.knobstep)."""
        short = obs.arrival_rate_short_rps
        return Forecast(
            load=demand.load,
            lengths=lengths,
            burst_rps=burst[0],
            burst_at_s=burst[1],
            short_noise_z2=burst[2],
            load_marks=demand.marks,
            long_noise_z2=demand.long_noise_z2,
            short_rps=short,
            short_at_s=now_s if short is not None else None,
            short_waiting=obs.waiting if short is not None else None,
            short_sample_s=now_s - obs.staleness_s if short is not None else None,
            rises=rises,
        )

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
        """
        prev_tick = state.forecast.load.at_s if state.forecast.load is not None else None
        dt = 0.0 if prev_tick is None else min(max(0.0, now_s - prev_tick), self._max_gap_s)
        belief = self._speed(obs, state, memory, knobs, lengths, now_s, dt)
        cold = next_cold_start(self.model.cold_start_s, state, obs, now_s, self._max_gap_s)
        belief = replace(belief, cold_start_s=cold)
        profile = believed_profile(self.profile, belief)
        # Where one unloaded replica comes within RELAX_FACTOR of a target, sized relaxed.
        relaxed = None if lengths is None else relaxed_sla(knobs, lengths, self.model.sla, profile)
        sla = relaxed or self.model.sla
        caps = (
            None
            if lengths is None
            else fleet_capacity_rps(
                lambda n: self._capacity(knobs, lengths, profile, n, sla),  # type: ignore[arg-type]
                demand_rps / state.plant.capacity_correction,
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
        c = state.plant.capacity_correction
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
            and obs.arrival_rate_rps >= LOADED_FRAC * obs.ready_replicas * base_capacity * c
        )
        requests = obs.arrival_rate_rps * self.policy.window_s
        violated, healthy = sla_evidence(obs, self.model.sla, requests)
        # An SLA out of every fleet's reach is violated whatever the fleet: no evidence.
        judge = believed_enough and relaxed is None and self._judge(obs, state, now_s)
        correction = next_correction(c, dt, violated, healthy, judge, loaded)
        knob_correction, out_of_reach = self._knob_correction(
            obs, state, memory, knobs, now_s, dt, requests
        )
        plant = replace(belief, capacity_correction=correction, knob_correction=knob_correction)
        return caps, plant, relaxed is not None, out_of_reach

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

    def _panic(
        self, state: ModelState, now_s: float, demand: Demand, raw: Raw
    ) -> tuple[bool, float | None, Reason]:
        """Panic mode on the short window: (in panic, panic until, reason)."""
        if raw.current is None:
            return False, None, Reason.NO_PANIC
        p = self.policy
        return panic(
            demand.short,
            state.replicas,
            raw.current,
            p.panic_threshold_frac,
            state.windows.panic_until_s,
            now_s,
            p.panic_hold_s,
            PANIC_Z if demand.history else 0.0,
            p.panic_window_s,
            demand.backlog,
        )

    def _stages(
        self,
        state: ModelState,
        now_s: float,
        raw: Raw,
        demand: Demand,
        panic_state: tuple[bool, float | None, Reason],
        partial: str | None = None,
    ) -> tuple[list[Stage], _Outcome]:
        """Step 6: panic, or deadband -> stabilize -> rate-limit; then cooldown -> clamp.
        Returns the stage trace and the final replicas with the new stage memory."""
        p, w, current = self.policy, state.windows, state.replicas
        in_panic, panic_until, panic_reason = panic_state
        raw_int = math.ceil(raw.raw - 1e-9)
        detail = f"demand {demand.demand:.3f} req/s" if not demand.idle else ""
        stages = [Stage("raw", current, raw_int, raw.reason, detail)]
        if in_panic:
            # Panic: scale up at once to what was observed, never down. While it holds,
            # only past the tolerance band: noise on a level load must not ratchet the
            # fleet up sample by sample (it would unwind later, a direction reversal).
            need = demand.observed / raw.capacity  # type: ignore[operator]
            if panic_reason == Reason.PANIC_HOLD and need <= current * (1.0 + p.tolerance_frac):
                need = current
            target = max(current, math.ceil(need - 1e-9))
            out = StageOut(target, panic_reason, f"short demand {demand.short:.2f} req/s")
            stages.append(_stage("panic", raw_int, out))
            value = out.value
            recs = (*w.recommendations, (now_s, self._remembered(value, raw, demand, None)))
        else:
            out = deadband(raw.raw, current, p.tolerance_frac)
            stages.append(_stage("deadband", raw_int, out))
            value = out.value
            recs = (*w.recommendations, (now_s, self._remembered(value, raw, demand, current)))
            # Scale to zero is stabilized and rate-limited like any scale-down. A load
            # that has fallen is released after one rate window (DemandSteps._fall_or_rise).
            down_s = p.scale_down_stabilization_s
            if demand.falling:
                down_s = min(down_s, p.window_s)
            out = stabilize(
                value, current, w.recommendations, now_s, p.scale_up_stabilization_s, down_s
            )
            if demand.falling and out.value < current:
                out = replace(out, detail=f"load fallen: window {down_s:.0f} s")
            elif demand.rising and out.value < current:
                # The mirror: a load that keeps rising asks back what a step down sheds.
                out = StageOut(current, Reason.SCALE_DOWN_STABILIZED, "load rising")
            stages.append(_stage("stabilize", value, out))
            value = out.value
            out = rate_limit(
                value, current, w.actions, now_s, p.scale_up_limits, p.scale_down_limits
            )
            stages.append(_stage("ratelimit", value, out))
            value = out.value
        out = cooldown(value, current, w.last_scale_up_s, now_s, p.cooldown_after_scale_up_s)
        stages.append(_stage("cooldown", value, out))
        value = out.value
        bounds = self.model.replicas
        lo = (
            bounds.min_replicas
            if raw.reason == Reason.SCALE_TO_ZERO
            else max(bounds.min_replicas, 0 if demand.idle and current == 0 else 1)
        )
        out = clamp(value, lo, bounds.max_replicas)
        stages.append(_stage("clamp", value, out))
        held = min(current, bounds.max_replicas)  # a lowered max still applies
        if partial is not None and out.value < held:
            # Part of the fleet is not seen: its demand is missing, not zero.
            value, out = (
                out.value,
                StageOut(held, Reason.NO_DATA_HOLD, f"{partial}: no scale-down"),
            )
            stages.append(_stage("health", value, out))
        return stages, self._outcome(state, now_s, out.value, recs, panic_until, raw.idle_since)

    def _rules(
        self,
        obs: Observation,
        state: ModelState,
        now_s: float,
        stages: list[Stage],
        outcome: _Outcome,
    ) -> tuple[list[Stage], _Outcome, RuleMemory]:
        """Step 7: the composite scale-out rules (controller/rules.py) raise the final
        replicas to their floor, never lower them; a raise is a recommendation the
        down-stabilization window sees, like any other."""
        stage, rule_states = rules_stage(
            self.model.scale_out_rules,
            state.rules.states,
            obs,
            outcome.replicas,
            state.replicas,
            self.model.replicas.max_replicas,
            now_s,
        )
        if stage.after != outcome.replicas:
            m = outcome.memory
            recs = (*m.recommendations, (now_s, stage.after))
            outcome = self._outcome(
                state, now_s, stage.after, recs, m.panic_until_s, m.idle_since_s
            )
        return [*stages, stage], outcome, RuleMemory(rule_states)

    def _outcome(
        self,
        state: ModelState,
        now_s: float,
        final: int,
        recs: tuple[tuple[float, int], ...],
        panic_until: float | None,
        idle_since: float | None,
    ) -> _Outcome:
        """The final replicas and the stage memory they leave (windows pruned)."""
        memory = next_memory(
            self.policy, state.windows, state.replicas, final, now_s, recs, panic_until, idle_since
        )
        return _Outcome(final, memory)

    # ------------------------------------------------------------------ parts
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
