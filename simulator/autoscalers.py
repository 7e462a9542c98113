"""Autoscaling policies run against the simulated fleet: the governor and the baselines.

Every policy acts through the same modelled actuation path (`simulator.scenario`): it
publishes a desired replica count; an HPA sync loop (default every 15 s) reads it and
scales the Deployment (the fleet), and every replica pays the same cold start.

Baselines, faithful to their published algorithms and defaults (docs/ARCHITECTURE.md, Actuation):
- `hpa-gpu`: HPA v2 on each pod's GPU utilisation (DCGM's busy fraction, a Pods
  metric), target 70 %, with the replica calculator's missing and pending pod rules
  (`plain_metric_replicas`).
- `hpa-queue`: HPA v2 on p95 queue time, target 500 ms (a Value-type metric).
- `keda`: KEDA Prometheus scaler on sum(vllm:num_requests_waiting), threshold 5
  (AverageValue), feeding an HPA with default behavior.
- `kpa`: Knative KPA on in-flight concurrency: stable window 60 s, panic window 6 s,
  panic threshold 200 %, target 100 x 70 % per pod, max scale-up rate 1000, max
  scale-down rate 2, 2 s tick; never scales down in panic.
- `static`: a fixed replica count.
HPA arithmetic (Kubernetes' replica calculator): desired = ceil(ready * metric / target)
for a utilization or Value target, the ready replicas (not those still starting: they
report no metric yet; counting them doubled the simulated HPAs' fleets at every sync of
a cold start until 2026-12-02), ceil(metric / target) for KEDA's AverageValue; the
current count unless the ratio is outside the tolerance 0.1; then default behavior:
scale-up max(+100 %, +4 pods) per 15 s, scale-down stabilization 300 s (max of
recommendations), -100 % per 15 s. The stabilization and rate-limit steps reuse
`controller.stages`, which implement exactly the HPA's rules.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from actuators.rollout import replicas_needed
from controller.actuation import Actuator
from controller.config import GovernorConfig, RateLimit
from controller.loop import ControlLoop
from controller.metrics import GovernorMetrics
from controller.stages import rate_limit, stabilize
from controller.types import Decision, Knobs, Reason
from estimators.types import ModelQuery, Observation
from simulator.fleet import Fleet, ReplicaState
from simulator.metrics import SimulatedSource

HPA_TOLERANCE = 0.1
HPA_UP = (
    RateLimit(type="percent", value=100, period_s=15),
    RateLimit(type="pods", value=4, period_s=15),
)
HPA_DOWN = (RateLimit(type="percent", value=100, period_s=15),)
HPA_DOWN_STABILIZATION_S = 300.0

POLICY_NAMES = ("governor", "hpa-gpu", "hpa-queue", "keda", "kpa", "static")


class Autoscaler(Protocol):
    """A policy under test. `evaluate(now_s)` runs every `interval_s` and returns the
    replica count it wants now (None: no opinion yet)."""

    name: str
    interval_s: float

    def evaluate(self, now_s: float) -> int | None: ...

    def knobs(self) -> Knobs | None:
        """Knobs for replicas that start from now on (None: leave the fleet's)."""
        ...

    def rollout(self) -> bool:
        """True when the last knob change should be rolled out to running replicas."""
        ...

    def replicas_needed(self) -> float | None:
        """Replicas the load needs now, as the policy computes it (None: it computes
        none); a roll-out that takes replicas down waits until the rest serve this."""
        ...

    def rollout_held(self, waiting: bool) -> None:
        """Whether the roll-out the policy asked for waits for room (told after each
        evaluation; the governor's roll-out actuator tells its loop so)."""
        ...

    @property
    def passthrough(self) -> bool:
        """True when the HPA only relays this policy's number (KEDA external scaler with
        damping-free behavior): the HPA still applies its 10 % tolerance."""
        ...

    def scale_down_pending(self) -> bool:
        """True while a lower count is held back (stabilization window, rate limits)."""
        ...

    def learned_speed(self) -> float | None:
        """The engines' step-time factor against the profile this policy believes now
        (None: it learns none, or nothing yet); the plant's true one is `Plant.speed`."""
        ...

    def decision(self) -> Decision | None:
        """The policy's latest decision with its stage trace (None: it makes none, or
        none yet; only the governor does)."""
        ...


@dataclass
class _HpaCore:
    """HPA v2 replica arithmetic with default behavior, on a metric ratio."""

    min_replicas: int
    max_replicas: int
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    changes: list[tuple[float, int]] = field(default_factory=list)
    last_recommendation: int | None = None
    last_out: int | None = None

    def desired(self, ratio: float | None, current: int, now_s: float, pods: int) -> int | None:
        """The HPA's output at `now_s` for usage `ratio` on a fleet of `current` replicas,
        the ratio multiplying `pods`: the ready ones for a utilization or Value target
        (Kubernetes' replica calculator, `ceil(usageRatio * readyPodCount)`: replicas
        still starting do not multiply a metric they do not report yet), `current` for an
        AverageValue one (KEDA), where ratio x current is the metric over its target."""
        if ratio is None or not math.isfinite(ratio) or pods <= 0:
            return None  # missing metric (or no ready pod to read it): the HPA does not act
        rec = current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(ratio * pods - 1e-9)
        return self.settle(rec, current, now_s)

    def settle(self, rec: int | None, current: int, now_s: float) -> int | None:
        """The HPA's output at `now_s` for the replica calculator's recommendation `rec`
        (None: no metric, no action): bounds, scale-down stabilization, rate limits."""
        if rec is None:
            return None
        rec = min(max(rec, self.min_replicas), self.max_replicas)
        self.last_recommendation = rec
        self.recommendations = [
            (t, v) for t, v in self.recommendations if now_s - t < HPA_DOWN_STABILIZATION_S
        ]
        out = stabilize(
            rec, current, self.recommendations, now_s, 0.0, HPA_DOWN_STABILIZATION_S
        ).value
        self.recommendations.append((now_s, rec))
        self.changes = [(t, d) for t, d in self.changes if now_s - t < 15.0]
        out = rate_limit(out, current, self.changes, now_s, HPA_UP, HPA_DOWN).value
        out = min(max(out, self.min_replicas), self.max_replicas)
        if out != current:
            self.changes.append((now_s, out - current))
        self.last_out = out
        return out

    def scale_down_pending(self) -> bool:
        """The latest recommendation is below what the stabilized output holds."""
        return (
            self.last_recommendation is not None
            and self.last_out is not None
            and self.last_recommendation < self.last_out
        )


class _Base:
    interval_s = 15.0
    passthrough = False

    def rollout(self) -> bool:
        return False

    def replicas_needed(self) -> float | None:
        return None

    def rollout_held(self, waiting: bool) -> None:
        return None

    def scale_down_pending(self) -> bool:
        return False

    def knobs(self) -> Knobs | None:
        return None

    def learned_speed(self) -> float | None:
        return None

    def decision(self) -> Decision | None:
        return None


class _MetricHpa(_Base):
    """An HPA on one metric read from the simulated Prometheus: `ratio(observation,
    current)` turns the observation into the HPA's usage ratio (None: metric missing, the
    HPA does not act)."""

    def __init__(
        self, fleet: Fleet, source: SimulatedSource, model: str, lo: int, hi: int, target: float
    ) -> None:
        self.fleet, self.source, self.model, self.target = fleet, source, model, target
        self.hpa = _HpaCore(lo, hi)

    def ratio(self, o: Observation, current: int) -> float | None:
        raise NotImplementedError

    def pods(self, current: int) -> int:
        """What the usage ratio multiplies (_HpaCore.desired): the ready replicas."""
        return self.fleet.ready_replicas

    def evaluate(self, now_s: float) -> int | None:
        o = self.source.observe([ModelQuery(self.model)], now_s)[self.model]
        current = self.fleet.active_replicas
        ratio = self.ratio(o, current) if isinstance(o, Observation) else None
        return self.hpa.desired(ratio, current, now_s, self.pods(current))

    def scale_down_pending(self) -> bool:
        return self.hpa.scale_down_pending()


def plain_metric_replicas(
    metrics: Mapping[int, float], ready: Iterable[int], unready: int, target: float, current: int
) -> int | None:
    """Kubernetes' replica calculator for a per-pod metric (`calcPlainMetricReplicas`,
    pkg/controller/podautoscaler/replica_calculator.go): `metrics` per pod id, `ready`
    the ids of pods that run (a pod of `ready` without a metric yet is "missing"; metrics
    of pods not in it, e.g. being deleted, are ignored), `unready` how many are pending.
    usageRatio = mean metric / `target`. Without missing pods, and unless pending pods
    meet a scale-up, ceil(usageRatio x pods with a metric) (`current` within the 10 %
    tolerance). Else the ratio is computed again with missing pods at `target` on a
    scale-down, at 0 on a scale-up, and pending pods at 0 on a scale-up; `current` if
    that is within the tolerance or reverses the direction. None: no metric at all (the
    HPA does not act)."""
    ready = list(ready)
    have = {i: metrics[i] for i in ready if i in metrics}
    if not have:
        return None
    ratio = sum(have.values()) / (target * len(have))
    missing = len(ready) - len(have)
    scale_up_unready = unready > 0 and ratio > 1.0
    if not scale_up_unready and not missing:
        return current if abs(1.0 - ratio) <= HPA_TOLERANCE else math.ceil(ratio * len(have))
    values = list(have.values()) + [target if ratio < 1.0 else 0.0] * missing
    if scale_up_unready:
        values += [0.0] * unready
    new = sum(values) / (target * len(values))
    if abs(1.0 - new) <= HPA_TOLERANCE or (ratio < 1.0 < new) or (ratio > 1.0 > new):
        return current
    n = math.ceil(new * len(values))
    if (new < 1.0 and n > current) or (new > 1.0 and n < current):
        return current
    return n


class HpaGpu(_MetricHpa):
    """HPA on the GPU busy fraction of each pod (a Pods metric), target 70 %: Kubernetes'
    `plain_metric_replicas` over the serving replicas' own busy fractions; replicas
    still starting are pending pods, draining ones are being deleted (ignored)."""

    name = "hpa-gpu"

    def __init__(self, fleet: Fleet, source: SimulatedSource, model: str, lo: int, hi: int):
        super().__init__(fleet, source, model, lo, hi, target=0.7)

    def evaluate(self, now_s: float) -> int | None:
        fleet = self.fleet
        current = fleet.active_replicas
        serving = [r.replica_id for r in fleet.replicas if r.state is ReplicaState.SERVING]
        pending = sum(1 for r in fleet.replicas if r.state is ReplicaState.STARTING)
        busy = self.source.busy_frac_by_replica(now_s)
        rec = plain_metric_replicas(busy, serving, pending, self.target, current)
        return self.hpa.settle(rec, current, now_s)


class HpaQueue(_MetricHpa):
    """HPA on fleet p95 queue time (a Value metric), target 500 ms."""

    name = "hpa-queue"

    def __init__(self, fleet: Fleet, source: SimulatedSource, model: str, lo: int, hi: int):
        super().__init__(fleet, source, model, lo, hi, target=500.0)

    def ratio(self, o: Observation, current: int) -> float | None:
        q = o.queue_time_p95_ms
        return None if q is None else q / self.target


class Keda(_MetricHpa):
    """KEDA Prometheus scaler: sum(vllm:num_requests_waiting), threshold 5, AverageValue."""

    name = "keda"

    def __init__(self, fleet: Fleet, source: SimulatedSource, model: str, lo: int, hi: int):
        super().__init__(fleet, source, model, lo, hi, target=5.0)

    def ratio(self, o: Observation, current: int) -> float | None:
        if o.waiting is None:
            return None
        waiting = o.waiting + o.extra.get("router_queue", 0.0)
        # AverageValue: usage ratio = value / (target * current replicas)
        return waiting / (self.target * max(1, current))

    def pods(self, current: int) -> int:
        """AverageValue: the desired count is ceil(value / target) whatever is ready."""
        return max(1, current)


class Kpa(_Base):
    """Knative KPA on in-flight concurrency (running + waiting + router queue)."""

    name = "kpa"
    interval_s = 2.0

    def __init__(
        self,
        fleet: Fleet,
        model: str,
        lo: int,
        hi: int,
        *,
        target_per_pod: float = 100.0,
        utilization: float = 0.7,
        stable_s: float = 60.0,
        panic_frac: float = 0.1,
        panic_threshold: float = 2.0,
        max_up_rate: float = 1000.0,
        max_down_rate: float = 2.0,
    ) -> None:
        self.fleet, self.model, self.lo, self.hi = fleet, model, lo, hi
        self.target = target_per_pod * utilization
        self.stable_s, self.panic_s = stable_s, stable_s * panic_frac
        self.panic_threshold, self.max_up, self.max_down = (
            panic_threshold,
            max_up_rate,
            max_down_rate,
        )
        self.samples: deque[tuple[float, float]] = deque()
        self.panic_since: float | None = None
        self.last_panic_ok: float | None = None
        self.desired_now: int | None = None

    def _concurrency(self) -> float:
        total = float(self.fleet.router_queue_len)
        for _, eng in self.fleet.live_engines():
            total += eng.num_running + eng.num_waiting
        return total

    def evaluate(self, now_s: float) -> int | None:
        self.samples.append((now_s, self._concurrency()))
        while self.samples and now_s - self.samples[0][0] >= self.stable_s:
            self.samples.popleft()
        stable = sum(c for _, c in self.samples) / len(self.samples)
        recent = [c for t, c in self.samples if now_s - t < self.panic_s]
        panic_c = sum(recent) / len(recent)
        ready = max(1, self.fleet.ready_replicas)
        d_stable = math.ceil(stable / self.target)
        d_panic = math.ceil(panic_c / self.target)
        # rate limits relative to ready pods
        up_cap = math.ceil(ready * self.max_up)
        down_floor = math.floor(ready / self.max_down)
        d_stable = min(max(d_stable, down_floor), up_cap)
        d_panic = min(max(d_panic, down_floor), up_cap)
        if d_panic / ready >= self.panic_threshold:
            self.panic_since = self.panic_since or now_s
            self.last_panic_ok = now_s
        elif (
            self.panic_since is not None
            and self.last_panic_ok is not None
            and now_s - self.last_panic_ok >= self.stable_s
        ):
            self.panic_since = None
        if self.panic_since is not None:
            want = max(d_panic, self.desired_now or 0)  # never scale down in panic
        else:
            want = d_stable
        self.desired_now = min(max(want, self.lo), self.hi)
        return self.desired_now

    def scale_down_pending(self) -> bool:
        return self.panic_since is not None  # the KPA never scales down in panic


class Static(_Base):
    """A fixed replica count."""

    name = "static"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def evaluate(self, now_s: float) -> int | None:
        return self.replicas


CEILING = "ceiling"


class Ceiling(Static):
    """Not a policy to compare: the most replicas, asked for at the first evaluation and
    held, from the cell's start. More replicas never lower attainment, and nothing asks
    sooner, so its attainment is the most any policy can reach in a cell (the matrix's
    "best possible"): what a start at one replica and a cold start cost whatever the
    policy. Its GPU-hours mean nothing."""

    name = CEILING


class _Capture:
    """Actuator that keeps the latest valid decision (what KEDA would read), and tells
    the loop whether the scenario holds the roll-out it asked for (RolloutGate)."""

    def __init__(self) -> None:
        self.latest: Decision | None = None
        self.waiting = False

    def rollout_waiting(self, model: str) -> bool:
        return self.waiting

    def apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if d.valid:
                self.latest = d


class Governor(_Base):
    """The real control loop (`controller.loop.ControlLoop`) on the simulated source."""

    name = "governor"
    passthrough = True

    def __init__(
        self,
        config: GovernorConfig,
        source: SimulatedSource,
        extra_actuators: Sequence[Actuator] = (),
        fleet: Fleet | None = None,
    ):
        self.capture = _Capture()
        # Like the service reading the Deployment's replicas: a first tick without data
        # starts from the fleet's actual size, not from min replicas.
        current = None if fleet is None else (lambda _m: fleet.active_replicas)
        self.loop = ControlLoop(
            config,
            source,
            [self.capture, *extra_actuators],
            metrics=GovernorMetrics(),
            logger=_NullLogger(),
            initial_replicas=current,
        )
        self.interval_s = config.policy.tick_interval_s

    def evaluate(self, now_s: float) -> int | None:
        self.loop.tick(now_s)
        d = self.capture.latest
        return None if d is None else d.replicas

    def knobs(self) -> Knobs | None:
        d = self.capture.latest
        return None if d is None else d.knobs

    def scale_down_pending(self) -> bool:
        # A lower raw count held by the stabilization window, a rate limit or a cooldown.
        d = self.capture.latest
        held = (Reason.SCALE_DOWN_STABILIZED, Reason.SCALE_DOWN_LIMITED, Reason.SCALE_DOWN_COOLDOWN)
        return d is not None and any(r in held for r in d.reasons)

    def rollout(self) -> bool:
        # A big knob change is rolled out (rolling restart, one surge replica at a time),
        # so replicas that would not start anyway also get the new knobs.
        d = self.capture.latest
        return d is not None and d.rollout

    def replicas_needed(self) -> float | None:
        # What the roll-out actuator holds a roll-out against (actuators.rollout).
        d = self.capture.latest
        return None if d is None else replicas_needed(d)

    def rollout_held(self, waiting: bool) -> None:
        self.capture.waiting = waiting

    def learned_speed(self) -> float | None:
        # The decider's learned speed (controller.plant), as its latest decision reports it.
        d = self.capture.latest
        return None if d is None else d.plant_speed

    def decision(self) -> Decision | None:
        return self.capture.latest


class _NullLogger:
    """Drops log lines: a simulation runs thousands of ticks."""

    def __getattr__(self, name: str):
        return lambda *a, **k: None
