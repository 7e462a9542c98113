"""Step 1 of the decider (controller.decider): missing data and a dead fleet. Hold;
after N failed ticks re-assert the last good replicas or the configured fallback if
higher, and the knobs in force. Missing data never lowers replicas; the re-asserted
replicas and knobs keep to the model's bounds configured now (narrowed while the data
was gone, or since the state was saved).

A mixin of `Decider`: the methods read the decider's `model` and `policy` (and step 2's
`_no_data_knobs`), and are pure like `decide`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from controller.config import ModelConfig, ScalingPolicy
from controller.stages import clamp, next_memory
from controller.types import Decision, KnobMemory, Knobs, ModelState, Reason, Stage
from estimators.types import NoDataError, Observation, SourceError


def partial_data(obs: Observation, replicas: int) -> str | None:
    """Why a good observation is partial, or None: an engine target down, or the
    waiting gauge absent on a fleet that has replicas (the queue is unknown, not
    drained). A partial window holds scale-downs (`Decider._stages`) and grows no
    capacity correction past 1 (controller.feedback.next_correction): nothing on it may
    lower replicas."""
    if obs.targets_down:
        return f"{obs.targets_down} engine target(s) down"
    if obs.waiting is None and replicas > 0:
        return "waiting gauge absent"
    return None


class NoDataSteps:
    """No-data steps of `Decider` (see the module doc)."""

    model: ModelConfig
    policy: ScalingPolicy
    _no_data_knobs: Callable[[ModelState, float], tuple[Knobs, Reason, KnobMemory, bool]]
    """`KnobSteps._no_data_knobs`: the knobs a valid decision without data publishes."""

    def _unusable(self, obs: Observation, state: ModelState) -> str | None:
        """Why an observation is no data although it parsed, or None.

        A dead fleet reads like a quiet one: when every engine target goes down, the
        gauges vanish at once while the rate window still holds the old samples and
        decays over one window (8.4 -> 6.4 -> 4.4 -> 2.8 -> 1.9 req/s). Stale samples,
        no target up, or no engine gauge at all are therefore no data, never a reason
        to scale down. A fleet we scaled to zero has no engines to report: that is
        not a dead one.
        """
        max_age = self.policy.max_staleness_s
        if not math.isfinite(obs.staleness_s) or obs.staleness_s > max_age:
            return f"newest sample {obs.staleness_s:.0f} s old (max_staleness_s {max_age:g})"
        if state.replicas == 0:
            return None
        if obs.targets_up == 0:
            return "every engine target is down"
        if obs.running is None and obs.waiting is None:
            return "engine gauges (running, waiting) absent: engines gone or not scraped"
        return None

    def _hold(
        self, model: str, state: ModelState, now_s: float, why: str
    ) -> tuple[Decision, ModelState]:
        stage = Stage("raw", state.replicas, state.replicas, Reason.NO_DATA_HOLD, why)
        d = Decision(
            model=model,
            at_s=now_s,
            valid=False,
            replicas=state.replicas,
            knobs=state.knobs,
            stages=(stage,),
            knob_reason=Reason.KNOBS_NO_DATA,
            detail=why,
        )
        return d, state

    def _no_data(
        self, err: NoDataError | SourceError, state: ModelState, now_s: float
    ) -> tuple[Decision, ModelState]:
        """Step 1: hold; after N failed ticks re-assert the last good replicas or the
        fallback if higher (NO_DATA_FALLBACK)."""
        ticks = state.health.no_data_ticks + 1
        why = str(err)
        health = replace(state.health, no_data_ticks=ticks, full_since_s=None, calm_since_s=None)
        new_state = replace(state, health=health)
        # Never had good data: the fleet's size is unknown to us, so only hold.
        if ticks < self.policy.no_data_ticks_before_fallback or state.health.last_good_s is None:
            d, _ = self._hold(self.model.name, state, now_s, why)
            return d, new_state
        target = state.replicas
        fb = self.model.fallback_replicas
        detail = f"{ticks} ticks without data; keeping last good replicas {target}"
        if fb is not None and fb > target:
            target = fb
            detail = f"{ticks} ticks without data; fallback {fb} > last good {state.replicas}"
        # Within the bounds configured now: an operator who lowered max replicas while
        # the data was gone set a bound, which no decision passes (the clamp stage).
        bounds = self.model.replicas
        bounded = clamp(target, bounds.min_replicas, bounds.max_replicas).value
        if bounded != target:
            target = bounded
            detail += f"; clamped to [{bounds.min_replicas}, {bounds.max_replicas}]"
        stage = Stage("raw", state.replicas, target, Reason.NO_DATA_FALLBACK, detail)
        w = state.windows
        windows = next_memory(
            self.policy,
            w,
            state.replicas,
            target,
            now_s,
            # The fallback is a recommendation like any other: the down-stabilization
            # window must see it, or the next good tick could drop below it at once.
            (*w.recommendations, (now_s, target)),
            w.panic_until_s,
            # A fallback raise restarts the idle clock, so scale-to-zero cannot follow it
            # within the stabilization window.
            None if target > state.replicas else w.idle_since_s,
        )
        # A valid decision is served to engines: its knobs keep to the bounds configured
        # now, as the replicas do.
        knobs, knob_reason, memory, rollout = self._no_data_knobs(state, now_s)
        new_state = replace(
            new_state, replicas=target, windows=windows, knobs=knobs, knob_memory=memory
        )
        d = Decision(
            model=self.model.name,
            at_s=now_s,
            valid=True,
            replicas=target,
            knobs=knobs,
            stages=(stage,),
            knob_reason=knob_reason,
            detail=why,
            rollout=rollout,
        )
        return d, new_state
