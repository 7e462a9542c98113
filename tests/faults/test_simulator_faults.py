"""Control-side faults in the fleet simulator (simulator/scenario.py `run_policy`): the
real control loop (ControlLoop + decider) on simulated time against a simulated vLLM
fleet, faults injected from the outside through `run_policy`'s `on_sync` hook (the
simulator itself is unchanged).

- An engine replica that stops answering: at t = 300 s one serving replica freezes (its
  requests never finish, it accepts more until the router's least-outstanding choice
  avoids it) and its metrics vanish (a failed scrape). Must hold: no scale-down on the
  missing series; capacity is added for the lost replica; requests that reach healthy
  replicas after the replacement is up keep their SLO.
- A cold start three times longer than configured (135 s actual, 45 s in the config):
  must hold: no flap, no scale-down while replicas are starting, every request served,
  and no runaway (peak bounded against the same run with the right cold start).
- A 10x flash crowd (synthetic:flash-crowd, 10 -> 100 req/s for 60 s): must hold: panic
  mode engages and scales up at the first evaluation after the crowd arrives, nothing
  is scaled down during the crowd, no flap, every request served.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from controller.config import SLA, GovernorConfig
from simulator.fleet import Fleet
from simulator.scenario import PolicyResult, Scenario, run_policy
from simulator.traces import load_trace

pytestmark = pytest.mark.slow

SLA_ = SLA(ttft_p95_ms=1000, itl_p95_ms=50)


def _series(r: PolicyResult) -> list[tuple[float, int]]:
    return [(t, int(d)) for t, d in zip(r.series["t"], r.series["desired"], strict=True)]


@pytest.mark.fault_case(
    "Simulator",
    "an engine replica stops answering (frozen, metrics gone) at t = 300 s",
    "desired never below the 3 replicas before the fault; capacity added within one rate "
    "window + 2 HPA syncs (90 s); >= 99 % SLO attainment for requests reaching healthy "
    "replicas from 3 min after the fault (window + cold start + syncs)",
)
def test_replica_stops_answering(fault_note: Any) -> None:
    trace = load_trace("synthetic:poisson:rate=40,duration=900")
    sc = Scenario(trace=trace, sla=SLA_, max_replicas=32, start_replicas=3, cold_start_s=45.0)
    hung: dict[str, Any] = {}

    def on_sync(t: float, fleet: Fleet, policy: Any) -> None:
        hung.setdefault("fleet", fleet)
        if t < 300 or "rid" in hung:
            return
        rid, engine = next(iter(fleet.live_engines()))
        hung.update(rid=rid, t=t)
        engine.advance_to = lambda t_s, exact=False: None  # type: ignore[method-assign]
        live = fleet.live_engines

        def answering() -> Any:
            return ((r, e) for r, e in live() if r != rid)

        fleet.live_engines = answering  # type: ignore[method-assign]

    r = run_policy("governor", sc, on_sync=on_sync)
    assert "rid" in hung, "the fault was never injected"
    series = _series(r)
    before = [d for t, d in series if t < hung["t"]]
    after = [d for t, d in series if t >= hung["t"]]
    assert before[-1] == 3
    assert min(after) >= before[-1], "scaled down on the missing replica's series"
    assert max(after) > before[-1], "no capacity added for the lost replica"
    reacted = min(t for t, d in series if t >= hung["t"] and d > before[-1]) - hung["t"]
    assert reacted <= sc.governor_policy.window_s + 2 * sc.hpa_sync_s, reacted
    rec = hung["fleet"].records()
    late = (rec.arrival_s >= hung["t"] + 180) & (rec.replica != hung["rid"])
    with np.errstate(invalid="ignore"):
        ok = (
            rec.done
            & (rec.ttft_s <= SLA_.ttft_p95_ms / 1000)
            & (np.isnan(rec.mean_itl_s) | (rec.mean_itl_s <= SLA_.itl_p95_ms / 1000))
        )
    attained = float(ok[late].sum() / late.sum())
    assert attained >= 0.99, attained
    stuck = int((rec.replica == hung["rid"]).sum() - rec.done[rec.replica == hung["rid"]].sum())
    fault_note(
        f"reacted after {reacted:.0f} s: desired 3 -> max {max(after)}, final {after[-1]}; "
        f"healthy-replica attainment from +3 min "
        f"{attained:.3f}; {stuck} requests stuck on the frozen replica; flaps {r.flaps}"
    )


@dataclasses.dataclass(frozen=True)
class SlowStart(Scenario):
    """The fleet's replicas take `cold_start_s`; the governor is told `configured_cold_start_s`."""

    configured_cold_start_s: float = 45.0

    def governor_config(self) -> GovernorConfig:
        cfg = super().governor_config()
        model = cfg.models[0].model_copy(update={"cold_start_s": self.configured_cold_start_s})
        return cfg.model_copy(update={"models": (model,)})


@pytest.mark.fault_case(
    "Simulator",
    "cold start 3x longer than configured (135 s actual, 45 s configured), 10 -> 60 req/s step",
    "no flap; desired never goes down while the step is being absorbed; every request "
    "served (none refused or unfinished); peak replicas <= 2.5x the peak with the right "
    "cold start (no runaway)",
)
def test_cold_start_three_times_longer(fault_note: Any) -> None:
    trace = load_trace("synthetic:step:low=10,high=60,at=0.3,duration=900")
    right = run_policy(
        "governor", SlowStart(trace=trace, sla=SLA_, max_replicas=40, cold_start_s=45.0)
    )
    slow = run_policy(
        "governor", SlowStart(trace=trace, sla=SLA_, max_replicas=40, cold_start_s=135.0)
    )
    assert slow.flaps == 0
    assert slow.refused == 0 and slow.unfinished == 0
    step_at = 0.3 * 900
    absorbing = [d for t, d in _series(slow) if step_at <= t <= step_at + 4 * 135]
    assert absorbing == sorted(absorbing), "scaled down while replicas were starting"
    assert slow.max_replicas <= 2.5 * right.max_replicas, (slow.max_replicas, right.max_replicas)
    fault_note(
        f"peak {slow.max_replicas} vs {right.max_replicas} with the right cold start; "
        f"attainment {slow.slo_attainment:.3f} vs {right.slo_attainment:.3f}; "
        f"GPU-h {slow.gpu_hours:.2f} vs {right.gpu_hours:.2f}; flaps 0"
    )


@pytest.mark.fault_case(
    "Simulator",
    "10x flash crowd (synthetic:flash-crowd: 10 -> 100 req/s for 60 s at t = 480 s)",
    "panic engages and desired rises at the first evaluation after the crowd arrives; "
    "nothing scaled down during the crowd; no flap; every request served; peak within "
    "max_replicas",
)
def test_flash_crowd(fault_note: Any) -> None:
    trace = load_trace("synthetic:flash-crowd")
    sc = Scenario(trace=trace, sla=SLA_, max_replicas=32, start_replicas=1, cold_start_s=45.0)
    panics: list[float] = []

    def on_sync(t: float, fleet: Fleet, policy: Any) -> None:
        latest = getattr(getattr(policy, "capture", None), "latest", None)
        if latest is not None and latest.panic:
            panics.append(t)

    r = run_policy("governor", sc, on_sync=on_sync)
    at, spike = 0.4 * 1200, 60.0
    series = _series(r)
    base = max(d for t, d in series if t < at)
    first_up = min(t for t, d in series if t >= at and d > base)
    assert first_up - at <= sc.hpa_sync_s + 2 * sc.governor_policy.tick_interval_s, first_up
    assert panics and min(panics) - at <= sc.hpa_sync_s + 2 * sc.governor_policy.tick_interval_s
    during = [d for t, d in series if at <= t <= at + spike]
    assert during == sorted(during), "scaled down during the crowd"
    assert r.flaps == 0
    assert r.refused == 0 and r.unfinished == 0
    # the governor never asks beyond the maximum; a knob roll-out's one surge replica
    # (a Deployment's maxSurge) may stand beside the 32 for its duration
    assert max(r.series["desired"]) <= sc.max_replicas
    assert r.max_replicas <= sc.max_replicas + 1
    fault_note(
        f"up {first_up - at:.0f} s after the crowd ({base} -> {max(during)} during it, peak "
        f"{r.max_replicas}); attainment {r.slo_attainment:.3f}, peak queue {r.peak_queue}"
    )
