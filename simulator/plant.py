"""simulator.plant: the simulated hardware, kept apart from what the controller believes.

The decider plans with the profile it is configured with (its belief). The plant is what
the simulated engines actually do: the same profile with every step time multiplied by
`speed` (1.3 = a GPU 30 % slower than the profile says; `speed_change` changes it
mid-run, a plant that moves under the controller), a per-request server overhead
before the first step (HTTP, tokenization; default: the profile's calibrated
`request_overhead_ms`), and cold starts `cold_start_factor` times the configured one.
With `live_knobs` the engines follow knob changes at their next step (the governor's
scheduler plugin, the chart's default), else only replicas started after a change run
the new knobs (a roll-out replaces the others); the governor is told which
(`policy.knobs_live`). `router` is how the cluster spreads requests over the replicas
(simulator.fleet: a gateway's least-outstanding balancing by default, or kube-proxy's
random endpoint), which the decider is not told: its capacity model pools the fleet as a
least-request router does. `rollout` is the Deployment's rolling-update strategy a knob
roll-out meets (simulator.fleet.ROLLOUTS: a surge replica first by default, or the
outdated replica down first), which the decider is not told either. Baselines and the
oracle run on the same plant, so every policy is judged on one truth. `prefix_hit_frac`
is the share of every prompt the engines find in their prefix cache (simulator.engine:
whole blocks, computed for free; 0 by default, as the matrix runs), which the decider
reads from `vllm:prefix_cache_hits_total` as a real fleet's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from estimators.stepmodel import Profile, StepTimeCoefficients
from simulator.fleet import ROLLOUTS, ROUTERS


@dataclass(frozen=True, slots=True)
class Plant:
    """How the simulated engines differ from the configured profile (see module doc).

    `speed`: step-time factor (> 0, 1 = exactly the profile). `overhead_ms`: per-request
    server overhead in ms (>= 0; None = the profile's `request_overhead_ms`).
    `cold_start_factor`: actual cold start / configured cold start (> 0).
    `live_knobs`: the engines follow knob changes live. `router`: one of
    simulator.fleet.ROUTERS. `rollout`: how a knob roll-out replaces replicas, one of
    simulator.fleet.ROLLOUTS. `prefix_hit_frac`: the share of each prompt found in the
    prefix cache, in [0, 1).
    """

    speed: float = 1.0
    overhead_ms: float | None = None
    cold_start_factor: float = 1.0
    live_knobs: bool = False
    router: str = ROUTERS[0]
    rollout: str = ROLLOUTS[0]
    prefix_hit_frac: float = 0.0
    speed_change: tuple[float, float] | None = None
    """(at_s, speed): from `at_s` seconds on, every engine's step times are `speed` x the
    profile's (a GPU that throttles, a noisy neighbour, a node pool swapped mid-run); the
    steps before keep `speed`. None: `speed` throughout."""

    def __post_init__(self) -> None:
        for name in ("speed", "cold_start_factor"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"plant {name} must be a finite number > 0, got {v}")
        o = self.overhead_ms
        if o is not None and not (math.isfinite(o) and o >= 0):
            raise ValueError(f"plant overhead_ms must be a finite number >= 0, got {o}")
        h = self.prefix_hit_frac
        if not (math.isfinite(h) and 0.0 <= h < 1.0):
            raise ValueError(f"plant prefix_hit_frac must be in [0, 1), got {h}")
        if self.router not in ROUTERS:
            known = ", ".join(ROUTERS)
            raise ValueError(f"plant router must be one of {known}, got {self.router!r}")
        if self.speed_change is not None:
            at_s, after = self.speed_change
            if not (math.isfinite(at_s) and at_s >= 0 and math.isfinite(after) and after > 0):
                raise ValueError(
                    "plant speed_change must be (at_s >= 0, speed > 0), both finite, "
                    f"got {self.speed_change}"
                )
        if self.rollout not in ROLLOUTS:
            known = ", ".join(ROLLOUTS)
            raise ValueError(f"plant rollout must be one of {known}, got {self.rollout!r}")

    def profile(self, belief: Profile) -> Profile:
        """`belief` with every step-time coefficient x `speed` (the same object at 1.0):
        the plant from t = 0 (until `speed_change`, if any)."""
        return _scaled(belief, self.speed)

    def changed_profile(self, belief: Profile) -> tuple[float, Profile] | None:
        """(at_s, the plant's profile from then on) of `speed_change`, or None."""
        if self.speed_change is None:
            return None
        at_s, after = self.speed_change
        return at_s, _scaled(belief, after)

    def overhead_s(self, belief: Profile) -> float:
        """Per-request server overhead, seconds."""
        ms = belief.request_overhead_ms if self.overhead_ms is None else self.overhead_ms
        return ms / 1000.0

    def cold_start_s(self, configured_s: float) -> float:
        """The plant's cold start for a configured one, seconds."""
        return configured_s * self.cold_start_factor

    def describe(self, belief: Profile) -> dict[str, float | bool | str]:
        """JSON-ready summary (speed, overhead in ms, cold-start factor, live knobs,
        router, roll-out, prefix-cache hits; the speed change where there is one)."""
        out: dict[str, float | bool | str] = {
            "speed": self.speed,
            "overhead_ms": self.overhead_s(belief) * 1000.0,
            "cold_start_factor": self.cold_start_factor,
            "live_knobs": self.live_knobs,
            "router": self.router,
            "rollout": self.rollout,
            "prefix_hit_frac": self.prefix_hit_frac,
        }
        if self.speed_change is not None:  # only where set: earlier outputs stay as they were
            out["speed_change_at_s"], out["speed_after"] = self.speed_change
        return out


def _scaled(belief: Profile, speed: float) -> Profile:
    """`belief` with every step-time coefficient x `speed` (the same object at 1.0)."""
    if speed == 1.0:
        return belief
    st = belief.step_time.model_dump()
    scaled = StepTimeCoefficients(**{k: v * speed for k, v in st.items()})
    return belief.model_copy(update={"step_time": scaled})
