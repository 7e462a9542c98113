"""The embedded simulated fleet in real time, for `governor run --simulated-fleet TRACE`.

One simulated fleet per configured model replays the trace (looped, so the service can
run for as long as you like) with simulated time = (clock - start) x speed. The metric
source advances every fleet to "now" before evaluating it like Prometheus would; the
actuator applies valid decisions at once: replica counts to the fleet, knob changes to
replicas that start from then on (and rolls the others). Everything runs on the control
loop's thread, so no locking is needed. The engines are the calibrated plant (the
profile's step times and request overhead); the source scrapes at the config's
`prometheus.scrape_interval_s` and reads the short window over `short_window_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from controller.config import GovernorConfig
from controller.types import Decision
from estimators.stepmodel import load_profile
from estimators.types import ModelQuery, NoDataError, ObservationResult
from simulator.fleet import Fleet
from simulator.metrics import SimulatedSource
from simulator.plant import Plant
from simulator.traces import Trace, load_trace

LOOKAHEAD_S = 120.0  # trace copies are queued this far ahead of simulated time


class _ModelFleet:
    def __init__(
        self,
        trace: Trace,
        model: str,
        replicas: int,
        seed: int,
        window_s: float,
        short_window_s: float,
        profile: str,
        scrape_interval_s: float,
    ) -> None:
        self.trace = trace
        prof = load_profile(profile)
        # The plant as calibrated: the profile's step times and request overhead.
        self.fleet = Fleet(
            prof, initial_replicas=replicas, seed=seed, overhead_s=Plant().overhead_s(prof)
        )
        self.source = SimulatedSource(
            self.fleet,
            model,
            window_s=window_s,
            scrape_interval_s=scrape_interval_s,
            short_window_s=short_window_s,
        )
        self.loops = 0
        self.queued_until_s = 0.0

    def advance_to(self, sim_s: float) -> None:
        span = max(self.trace.span_s, 1.0)
        while self.queued_until_s < sim_s + LOOKAHEAD_S and len(self.trace):
            self.fleet.submit_trace(self.trace, offset_s=max(self.fleet.now_s, self.loops * span))
            self.loops += 1
            self.queued_until_s = self.loops * span
        if sim_s > self.fleet.now_s:
            self.fleet.advance_to(sim_s)


class RealTimeSimulatedFleet:
    """MetricSource and Actuator over one simulated fleet per model (see module doc)."""

    def __init__(
        self,
        trace: Trace,
        config: GovernorConfig,
        *,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        start_replicas: int | None = None,
        seed: int = 0,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.speed = speed
        self.clock = clock
        self.start_s = clock()
        self.fleets: dict[str, _ModelFleet] = {}
        for i, m in enumerate(config.models):
            policy = config.policy_for(m)
            n = start_replicas if start_replicas is not None else max(1, m.replicas.min_replicas)
            self.fleets[m.name] = _ModelFleet(
                trace,
                m.name,
                n,
                seed + i,
                policy.window_s,
                config.short_window_s,
                m.profile,
                config.prometheus.scrape_interval_s,
            )

    def sim_time(self, now_s: float | None = None) -> float:
        """Simulated seconds since the start for loop time `now_s` (default: the clock)."""
        now = self.clock() if now_s is None else now_s
        return max(0.0, (now - self.start_s) * self.speed)

    # MetricSource
    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        sim = self.sim_time(now_s)
        out: dict[str, ObservationResult] = {}
        for q in models:
            mf = self.fleets.get(q.name)
            if mf is None:
                out[q.name] = NoDataError(q.name, "arrival_rate", "no simulated fleet for model")
                continue
            mf.advance_to(sim)
            out.update(mf.source.observe([q], sim))
        return out

    # Actuator
    def apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            mf = self.fleets.get(d.model)
            if mf is None or not d.valid:
                continue
            fleet = mf.fleet
            if d.knobs != fleet.knobs:
                fleet.set_knobs(d.knobs)
                if d.rollout:
                    fleet.roll_out()
            if d.replicas != fleet.active_replicas:
                fleet.scale_to(d.replicas)


def build(trace_spec: str, config: GovernorConfig, **kwargs: float) -> RealTimeSimulatedFleet:
    """Load `trace_spec` (path, azure:conv|code, synthetic:NAME[:k=v,...]) and build."""
    rate = float(kwargs.pop("rate_scale", 1.0))
    trace = load_trace(trace_spec, rate_multiplier=rate)
    return RealTimeSimulatedFleet(trace, config, **kwargs)  # type: ignore[arg-type]
