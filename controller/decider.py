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
   ran, before the SLA is violated), times a feedback correction in [0.4, min(2, 1 /
   the target utilization)] that shrinks while the observed SLA is violated on a fleet
   seen whole (every replica asked for ready) for a window and grows while it is met
   with margin on a loaded fleet (past 1 at a quarter of the pace, on a fleet seen
   whole too: the headroom spent).
   The cold start (ask to all ready) is learned and sets that dead time (these steps:
   controller/plantstep.py).
4. demand = smoothed level (+ the Holt trend over one cold start, half a window more on
   a ramp the short window shows, when it predicts more growth than the deadband; in
   the first window only on such a ramp) +
   backlog / backlog_drain_s. The smoothed level, not the
   raw sample, so one noisy window cannot scale up on its own: a rise the short window
   shows on two ticks in a row (or on one, when the queue grew meanwhile on a whole
   fleet) past what the fleet serves at the SLA is scaled up for at once
   (SHORT_WINDOW), and sudden
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

from controller.capacity import (
    capacity_limit,
    priced_hit_frac,
)
from controller.config import ModelConfig, ScalingPolicy
from controller.demand import PANIC_Z, Demand, DemandSteps, Raw
from controller.knobstep import KnobSteps, lengths_replaced, prefix_fell
from controller.nodata import NoDataSteps, partial_data
from controller.plant import (
    believed_profile,
    model_overhead,
)
from controller.plantstep import PlantSteps
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
    Decision,
    Forecast,
    Hysteresis,
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


class Decider(DemandSteps, KnobSteps, NoDataSteps, PlantSteps):
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
        shifted = lengths_replaced(rises, now_s) or prefix_fell(state.forecast.lengths, lengths)
        caps, plant, hard, out_of_reach = self._plant(
            obs, state, knob_memory, knobs, lengths, now_s, sizing, shifted
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
        partial = partial_data(obs, state.replicas)
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
            plant_overhead_ms=model_overhead(plant.overhead_ms, self.profile.request_overhead_ms),
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
