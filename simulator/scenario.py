"""Run one autoscaling policy on the simulated fleet over a trace, and score it.

The actuation path is the same for every policy: the policy evaluates on its own
cadence; an HPA sync loop (default every 15 s, the HPA's --horizontal-pod-autoscaler-
sync-period) reads the latest desired count and scales the fleet. For the governor the
HPA only relays the number (KEDA external scaler, damping-free behavior) but still
applies its 10 % tolerance. Knobs reach replicas when they start.

Scoring (per request): a request attains its SLO when its TTFT and its mean ITL are both
within the SLA; refused and unfinished requests are misses. GPU-hours count each replica
from the moment it was requested (cold start included) until it was gone or the run
ended (`gpu_hours`), and over the trace's whole minutes only (`gpu_hours_trace`: the
window the oracle pays for). A flap is a scaling action in the opposite direction of the
previous one within 10 minutes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from actuators.rollout import can_spare, fenceposts_down
from controller.config import (
    SLA,
    GovernorConfig,
    ModelConfig,
    PrometheusSettings,
    ReplicaBounds,
    ScalingPolicy,
)
from controller.types import Knobs, Lengths
from estimators.stepmodel import DEFAULT_PROFILE, Profile, load_profile
from simulator.autoscalers import (
    CEILING,
    HPA_TOLERANCE,
    POLICY_NAMES,
    Autoscaler,
    Ceiling,
    Governor,
    HpaGpu,
    HpaQueue,
    Keda,
    Kpa,
    Static,
)
from simulator.fleet import Fleet
from simulator.metrics import SimulatedSource
from simulator.plant import Plant
from simulator.requests import RequestRecords
from simulator.traces import Trace

FLAP_WINDOW_S = 600.0
MODEL = "demo"


DEFAULT_SCRAPE_INTERVAL_S = 15.0
"""Resolution of the simulated metric source: what most clusters scrape at, seconds."""
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 64
"""The replica bounds of a scenario that sets none (`governor demo`'s)."""


@dataclass(frozen=True)
class Scenario:
    """Everything a policy run needs besides the policy itself.

    `profile` and `cold_start_s` are what the governor is configured with (its belief;
    `cold_start_s` None = the profile's); `plant` says how the simulated engines differ
    from that (`simulator.plant`; the governor's `knobs_live` follows the plant's).
    `start_replicas` None = `min_replicas` (what a new deployment starts with).
    `scrape_interval_s`: the metric source's resolution.
    """

    trace: Trace
    sla: SLA
    profile: Profile = field(default_factory=lambda: load_profile(DEFAULT_PROFILE))
    min_replicas: int = DEFAULT_MIN_REPLICAS
    max_replicas: int = DEFAULT_MAX_REPLICAS
    start_replicas: int | None = None
    static_replicas: int | None = None
    seed: int = 0
    hpa_sync_s: float = 15.0
    cold_start_s: float | None = None
    drain_tail_s: float = 300.0
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    governor_policy: ScalingPolicy = field(default_factory=ScalingPolicy)
    plant: Plant = field(default_factory=Plant)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scrape_interval_s) and self.scrape_interval_s > 0):
            raise ValueError(f"scrape_interval_s must be > 0, got {self.scrape_interval_s}")
        if self.start_replicas is not None and self.start_replicas < 0:
            raise ValueError(f"start_replicas must be >= 0, got {self.start_replicas}")

    @property
    def end_s(self) -> float:
        return self.trace.span_s + self.drain_tail_s

    @property
    def initial_replicas(self) -> int:
        """Replicas serving at t = 0 (`start_replicas`, default `min_replicas`)."""
        return self.min_replicas if self.start_replicas is None else self.start_replicas

    @property
    def configured_cold_start_s(self) -> float:
        """The cold start the governor is told, seconds."""
        return self.cold_start_s if self.cold_start_s is not None else self.profile.cold_start_s

    def make_fleet(self, initial_replicas: int) -> Fleet:
        """A fleet on the plant: its step times, overhead and cold start."""
        return Fleet(
            self.plant.profile(self.profile),
            initial_replicas=initial_replicas,
            seed=self.seed,
            cold_start_s=self.plant.cold_start_s(self.configured_cold_start_s),
            overhead_s=self.plant.overhead_s(self.profile),
            live_knobs=self.plant.live_knobs,
            router=self.plant.router,
            rollout=self.plant.rollout,
            prefix_hit_frac=self.plant.prefix_hit_frac,
        )

    def governor_config(self) -> GovernorConfig:
        cold = self.configured_cold_start_s
        return GovernorConfig(
            models=(
                ModelConfig(
                    name=MODEL,
                    deployment=MODEL,
                    sla=self.sla,
                    replicas=ReplicaBounds(
                        min_replicas=self.min_replicas, max_replicas=self.max_replicas
                    ),
                    cold_start_s=cold,
                    profile=self.profile.name,
                ),
            ),
            # The deployment tells the governor whether its engines follow knobs live.
            policy=self.governor_policy.model_copy(update={"knobs_live": self.plant.live_knobs}),
            prometheus=PrometheusSettings(scrape_interval_s=self.scrape_interval_s),
        )


def policy_changes(policy: ScalingPolicy) -> dict[str, Any]:
    """The fields of `policy` that differ from the built-in defaults (JSON-ready; empty
    for the defaults): what a result's document records of the governor's policy."""
    return policy.model_dump(mode="json", exclude_defaults=True)


@dataclass
class PolicyResult:
    """Scores of one policy over one scenario (see module doc for definitions)."""

    name: str
    slo_attainment: float
    gpu_hours: float
    scaling_actions: int
    flaps: int
    knob_changes: int
    ttft_p95_ms: float | None
    itl_p95_ms: float | None
    peak_queue: int
    requests: int
    refused: int
    unfinished: int
    max_replicas: int
    gpu_hours_trace: float | None = None
    """GPU-hours over the trace's whole minutes only (the oracle's window), without the
    drain tail after the trace."""
    series: dict[str, list[float]] = field(default_factory=dict, repr=False)
    settled_s: float | None = None
    """When the fleet had settled after the scored window (runs with a settling tail)."""
    settled_replicas: int | None = None
    learned_speed: float | None = None
    """The median over the scored window (from the plant's speed change on, where it
    has one) of the step-time factor the policy believed (the governor's learned speed,
    controller.plant; None for a policy that learns none): against the plant's own
    (`Plant.speed`, or the speed after the change), how well it calibrated online."""

    def summary(self) -> dict[str, float | int | None]:
        return {
            "slo_attainment": self.slo_attainment,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_trace": self.gpu_hours_trace,
            "scaling_actions": self.scaling_actions,
            "flaps": self.flaps,
            "knob_changes": self.knob_changes,
            "ttft_p95_ms": self.ttft_p95_ms,
            "itl_p95_ms": self.itl_p95_ms,
            "peak_queue": self.peak_queue,
            "requests": self.requests,
            "refused": self.refused,
            "unfinished": self.unfinished,
            "max_replicas": self.max_replicas,
            "learned_speed": self.learned_speed,
        }


def make_policy(name: str, sc: Scenario, fleet: Fleet, source: SimulatedSource) -> Autoscaler:
    lo, hi = sc.min_replicas, sc.max_replicas
    if name == "governor":
        return Governor(sc.governor_config(), source, fleet=fleet)
    if name == "hpa-gpu":
        return HpaGpu(fleet, source, MODEL, lo, hi)
    if name == "hpa-queue":
        return HpaQueue(fleet, source, MODEL, lo, hi)
    if name == "keda":
        return Keda(fleet, source, MODEL, lo, hi)
    if name == "kpa":
        return Kpa(fleet, MODEL, lo, hi)
    if name == "static":
        return Static(sc.static_replicas if sc.static_replicas is not None else sc.initial_replicas)
    if name == CEILING:
        return Ceiling(hi)
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


def count_flaps(actions: list[tuple[float, int]], window_s: float = FLAP_WINDOW_S) -> int:
    """Direction reversals within `window_s`: actions are (time, delta != 0)."""
    flaps = 0
    for (t0, d0), (t1, d1) in itertools.pairwise(actions):
        if (d0 > 0) != (d1 > 0) and t1 - t0 < window_s:
            flaps += 1
    return flaps


def slo_met(rec: RequestRecords, sla: SLA) -> np.ndarray:
    """Per-request SLO mask: finished, TTFT within the SLA and mean ITL within the SLA
    (a one-token output has no ITL). The one definition every score uses."""
    itl = rec.mean_itl_s
    with np.errstate(invalid="ignore"):
        ok: np.ndarray = (
            rec.done
            & (rec.ttft_s <= sla.ttft_p95_ms / 1000.0)
            & (np.isnan(itl) | (itl <= sla.itl_p95_ms / 1000.0))
        )
    return ok


def score(fleet: Fleet, sla: SLA) -> tuple[float, float | None, float | None, int, int]:
    """(attainment, ttft p95 ms, mean-ITL p95 ms, refused, unfinished) over all requests."""
    rec = fleet.records()
    n = len(rec)
    if n == 0:
        return 1.0, None, None, 0, 0
    done = rec.done
    ttft = rec.ttft_s
    itl = rec.mean_itl_s
    ok = slo_met(rec, sla)
    ttft_p95 = float(np.percentile(ttft[done], 95) * 1000.0) if done.any() else None
    itl_done = itl[done & ~np.isnan(itl)]
    itl_p95 = float(np.percentile(itl_done, 95) * 1000.0) if len(itl_done) else None
    refused = int(rec.refused.sum())
    unfinished = int(n - done.sum() - refused)
    return float(ok.sum() / n), ttft_p95, itl_p95, refused, unfinished


@dataclass
class _Run:
    """The mutable bookkeeping of one `run_policy` (desired count, actions, series)."""

    desired: int | None = None
    actions: list[tuple[float, int]] = field(default_factory=list)
    knob_changes: int = 0
    peak_queue: int = 0
    learned: list[tuple[float, float]] = field(default_factory=list)
    """(time s, learned speed) at each evaluation that reported one."""
    rollout_waiting: bool = False
    """A roll-out asked for and not started: the fleet could not spare a replica."""
    series: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in ("t", "desired", "ready", "total", "waiting")}
    )


ROLLOUT_FENCEPOSTS = {"surge": (1, 0), "unavailable": (0, 1)}
"""(maxSurge, maxUnavailable) of each simulated roll-out strategy (simulator.fleet.ROLLOUTS),
resolved as the roll-out actuator resolves a Deployment's (actuators.rollout.fenceposts_down)."""


def _apply_policy(run: _Run, policy: Autoscaler, fleet: Fleet, t: float) -> None:
    """A policy evaluation: remember its desired count, hand new knobs to the fleet, and
    start a roll-out it asked for once the fleet can spare the replicas the strategy
    takes down, as the roll-out actuator does (actuators.rollout.can_spare)."""
    want = policy.evaluate(t)
    if want is not None:
        run.desired = want
    speed = policy.learned_speed()
    if speed is not None:
        run.learned.append((t, speed))
    k = policy.knobs()
    if k is not None and k != fleet.knobs:
        fleet.set_knobs(k)
        run.knob_changes += 1
        run.rollout_waiting = run.rollout_waiting or policy.rollout()
    if run.rollout_waiting:
        # Replicas still starting count as none: the actuator waits for a Deployment
        # whose updated replicas are not all available (WAITING_ROLLOUT).
        ready = min(fleet.active_replicas, fleet.ready_replicas)
        needed = policy.replicas_needed()
        down = fenceposts_down(*ROLLOUT_FENCEPOSTS[fleet.rollout], ready)
        if can_spare(ready, down, fleet.active_replicas if needed is None else needed):
            fleet.roll_out()
            run.rollout_waiting = False
    policy.rollout_held(run.rollout_waiting)


def _hpa_sync(run: _Run, policy: Autoscaler, fleet: Fleet, t: float) -> None:
    """An HPA sync: scale the fleet to the desired count (the HPA's tolerance on a
    relayed number), record the series point."""
    current = fleet.active_replicas
    if run.desired is not None and run.desired != current:
        target = run.desired
        if policy.passthrough and current > 0 and abs(target / current - 1.0) <= HPA_TOLERANCE:
            target = current  # the HPA's own tolerance on the relayed metric
        if target != current:
            fleet.scale_to(target, t)
            run.actions.append((t, target - current))
    waiting = fleet.router_queue_len + sum(e.num_waiting for _, e in fleet.live_engines())
    run.peak_queue = max(run.peak_queue, waiting)
    s = run.series
    s["t"].append(t)
    s["desired"].append(float(run.desired if run.desired is not None else current))
    s["ready"].append(float(fleet.ready_replicas))
    s["total"].append(float(fleet.total_replicas))
    s["waiting"].append(float(waiting))


def settled(policy: Autoscaler, fleet: Fleet, desired: int | None) -> bool:
    """The fleet holds what the policy wants, nothing starts or drains, and the policy
    has no scale-down waiting in its stabilization window."""
    active = fleet.active_replicas
    return (
        (desired is None or desired == active)
        and fleet.total_replicas == active == fleet.ready_replicas
        and not policy.scale_down_pending()
    )


def run_policy(
    name: str,
    sc: Scenario,
    progress: Callable[[float], None] | None = None,
    on_sync: Callable[[float, Fleet, Autoscaler], None] | None = None,
    settle_max_s: float = 0.0,
    on_tick: Callable[[float, Autoscaler], None] | None = None,
) -> PolicyResult:
    """Simulate `name` over the scenario and score it. `progress(fraction)` is called
    about once a simulated minute; `on_sync(t_s, fleet, policy)` after every HPA sync;
    `on_tick(t_s, policy)` after every evaluation of the policy (the governor's ticks).

    Scores (attainment, GPU-hours, actions, flaps) cover [0, `sc.end_s`]. With
    `settle_max_s` > 0 the run goes on after that until the fleet has settled (see
    `settled`) or for at most that long; the series include that tail and
    `settled_s` / `settled_replicas` say where it ended.
    """
    # A static fleet is what it is from the start; the others start at start_replicas.
    initial = sc.static_replicas if name == "static" and sc.static_replicas else sc.initial_replicas
    fleet = sc.make_fleet(initial)
    source = SimulatedSource(
        fleet,
        MODEL,
        window_s=sc.governor_policy.window_s,
        scrape_interval_s=sc.scrape_interval_s,
        short_window_s=sc.governor_config().short_window_s,
    )
    fleet.submit_trace(sc.trace, offset_s=0.0)
    policy = make_policy(name, sc, fleet, source)
    end = sc.end_s
    events: list[tuple[float, int]] = [(policy.interval_s, 0), (sc.hpa_sync_s, 1)]
    heapq.heapify(events)  # a tick longer than the HPA's sync comes second
    change = sc.plant.changed_profile(sc.profile)
    if change is not None:
        heapq.heappush(events, (change[0], 2))  # after a tick or sync at the same time
    run = _Run()
    scored: PolicyResult | None = None
    settled_s: float | None = None
    last_progress = 0.0
    while events:
        t, kind = heapq.heappop(events)
        if t > end and scored is None:
            fleet.advance_to(end)
            scored = _result(name, sc, fleet, run)
            if settle_max_s <= 0 or settled(policy, fleet, run.desired):
                settled_s = end if settle_max_s > 0 else None
                break
        if t > end + settle_max_s:
            break
        fleet.advance_to(t)
        if kind == 2:
            assert change is not None
            fleet.set_profile(change[1], t)
        elif kind == 0:
            _apply_policy(run, policy, fleet, t)
            if on_tick is not None:
                on_tick(t, policy)
            heapq.heappush(events, (t + policy.interval_s, 0))
        else:
            _hpa_sync(run, policy, fleet, t)
            heapq.heappush(events, (t + sc.hpa_sync_s, 1))
            if on_sync is not None:
                on_sync(t, fleet, policy)
            if scored is not None and settled(policy, fleet, run.desired):
                settled_s = t
                break
        if progress is not None and t - last_progress >= 60.0:
            progress(min(1.0, t / end))
            last_progress = t
    if scored is None:
        fleet.advance_to(end)
        scored = _result(name, sc, fleet, run)
    res = scored
    res.series = run.series  # the whole run, the settling tail included
    res.settled_s = settled_s
    res.settled_replicas = fleet.active_replicas if settled_s is not None else None
    if progress is not None:
        progress(1.0)
    return res


def _result(name: str, sc: Scenario, fleet: Fleet, run: _Run) -> PolicyResult:
    """Scores at `sc.end_s` (the fleet advanced exactly there)."""
    end = sc.end_s
    att, ttft_p95, itl_p95, refused, unfinished = score(fleet, sc.sla)
    run.series["ttft_p95_by_minute"] = ttft_p95_by_minute(fleet, end)
    actions = list(run.actions)
    since = 0.0 if sc.plant.speed_change is None else sc.plant.speed_change[0]
    return PolicyResult(
        name=name,
        slo_attainment=att,
        gpu_hours=fleet.gpu_seconds(end) / 3600.0,
        gpu_hours_trace=fleet.gpu_seconds(min(end, trace_window_s(sc.trace))) / 3600.0,
        scaling_actions=len(actions),
        flaps=count_flaps(actions),
        knob_changes=run.knob_changes,
        ttft_p95_ms=ttft_p95,
        itl_p95_ms=itl_p95,
        peak_queue=max(run.peak_queue, fleet.peak_router_queue),
        requests=len(sc.trace),
        refused=refused,
        unfinished=unfinished,
        max_replicas=int(max(run.series["total"], default=0)),
        series=run.series,
        learned_speed=_median([v for t, v in run.learned if since <= t <= end]),
    )


def _median(values: list[float]) -> float | None:
    """The median of `values` (None: none)."""
    return float(np.median(values)) if values else None


def trace_window_s(trace: Trace, window_s: float = 60.0) -> float:
    """The trace's span rounded up to whole windows, seconds: what the oracle pays for
    (it sizes each 60 s window of requests; simulator.oracle)."""
    return max(1, math.ceil(trace.span_s / window_s)) * window_s if len(trace) else 0.0


def trace_lengths(trace: Trace) -> Lengths:
    """The trace's overall length statistics as the decider reads them (mean and p95 of
    prompt and output lengths, tokens)."""
    p, o = trace.prompt_tokens, trace.output_tokens
    return Lengths(
        prompt_mean=float(p.mean()),
        prompt_p95=float(np.percentile(p, 95)),
        output_mean=float(o.mean()),
        output_p95=float(np.percentile(o, 95)),
    )


def governor_knobs_for(trace: Trace, sc: Scenario) -> Knobs:
    """The knobs the slo policy picks for the trace's overall length statistics, with
    the plant's prefix-cache hit share."""
    from controller.batching import slo_knobs

    cfg = sc.governor_config()
    lengths = replace(trace_lengths(trace), prefix_hit_frac=sc.plant.prefix_hit_frac)
    return slo_knobs(lengths, sc.sla, sc.profile, cfg.models[0].knobs, cfg.policy.itl_margin_frac)


def ttft_p95_by_minute(fleet: Fleet, end_s: float) -> list[float]:
    """p95 TTFT (ms) of the requests arriving in each minute; NaN where none finished."""
    rec = fleet.records()
    minutes = math.ceil(end_s / 60.0)
    out = [math.nan] * minutes
    done = rec.done
    idx = (rec.arrival_s // 60.0).astype(int)
    ttft = rec.ttft_s
    for m in range(minutes):
        sel = (idx == m) & done
        if sel.any():
            out[m] = float(np.percentile(ttft[sel], 95) * 1000.0)
    return out
