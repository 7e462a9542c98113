"""simulator.replicas: a fleet's replica records and the accounting over them.

A `Replica` is one replica's lifecycle (requested -> STARTING for the cold start ->
SERVING -> DRAINING -> GONE; times in seconds on the simulation clock) and, once it
serves, its engine. `FleetAccounting` is what `simulator.fleet.Fleet` reports from
those records and its request log: GPU-seconds (each replica from its request until it
is GONE, cold start included), the replica timeline (t, ready, total) at every change
and sampled on a grid, and the fleet-level totals (`FleetStats`). Scheduling, routing
and lifecycle transitions stay in simulator.fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from controller.types import Knobs
from simulator.engine import Engine
from simulator.requests import RequestLog, RequestRecords


class ReplicaState(StrEnum):
    """Where a replica is in its lifecycle."""

    STARTING = "STARTING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    GONE = "GONE"


@dataclass(slots=True)
class Replica:
    """One replica: its lifecycle times (seconds) and, once serving, its engine."""

    replica_id: int
    knobs: Knobs
    requested_s: float
    ready_s: float
    """When the cold start ends (scheduled; the replica serves from then unless cancelled)."""
    state: ReplicaState = ReplicaState.STARTING
    engine: Engine | None = None
    drain_s: float | None = None
    gone_s: float | None = None

    def gpu_seconds(self, now_s: float) -> float:
        """GPU time held from request to gone (or `now_s`), seconds."""
        end = self.gone_s if self.gone_s is not None else now_s
        return max(0.0, min(end, now_s) - self.requested_s)


@dataclass(frozen=True, slots=True)
class FleetStats:
    """Fleet-level totals at `now_s`."""

    now_s: float
    submitted: int
    dispatched: int
    completed: int
    refused: int
    preemptions: int
    gpu_seconds: float
    peak_router_queue: int
    router_queued_total: int
    replicas_requested: int
    steps: int


class FleetAccounting:
    """The accounting half of `simulator.fleet.Fleet` (a mix-in: the fleet owns the
    state it reads: `replicas`, `now_s`, `log` and the router's queue counters)."""

    replicas: list[Replica]
    now_s: float
    log: RequestLog
    peak_router_queue: int
    router_queued_total: int

    def gpu_seconds(self, now_s: float | None = None) -> float:
        """GPU-seconds used up to `now_s` (default: the fleet's time), cold starts included."""
        t = self.now_s if now_s is None else now_s
        return sum(r.gpu_seconds(t) for r in self.replicas)

    def records(self) -> RequestRecords:
        """Per-request ground truth as numpy arrays."""
        return self.log.arrays()

    def timeline(self) -> list[tuple[float, int, int]]:
        """(t_s, ready replicas, total replicas) at every change up to now, from the
        replicas' lifecycle times (ready: SERVING; total: holding a GPU)."""
        deltas: dict[float, list[int]] = {}

        def add(t: float, ready: int, total: int) -> None:
            if t <= self.now_s:
                d = deltas.setdefault(t, [0, 0])
                d[0], d[1] = d[0] + ready, d[1] + total

        for r in self.replicas:
            add(r.requested_s, 0, 1)
            if r.gone_s is not None:
                add(r.gone_s, 0, -1)
            if r.engine is not None:  # it served from ready_s until drained or gone
                add(r.ready_s, 1, 0)
                end = r.drain_s if r.drain_s is not None else r.gone_s
                if end is not None:
                    add(end, -1, 0)
        out: list[tuple[float, int, int]] = []
        ready = total = 0
        for t in sorted(deltas):
            ready, total = ready + deltas[t][0], total + deltas[t][1]
            out.append((t, ready, total))
        return out

    def replica_series(self, step_s: float, until_s: float | None = None) -> np.ndarray:
        """(t, ready, total) sampled every `step_s` from the first change, shape (n, 3)."""
        tl = self.timeline()
        end = self.now_s if until_s is None else until_s
        if not tl:
            return np.zeros((0, 3))
        ts = np.arange(tl[0][0], end + 1e-9, step_s)
        times = np.array([e[0] for e in tl])
        idx = np.searchsorted(times, ts, side="right") - 1
        vals = np.array([e[1:] for e in tl], dtype=np.float64)[idx]
        return np.column_stack([ts, vals])

    def stats(self) -> FleetStats:
        """Totals at the fleet's current time."""
        engines = [r.engine for r in self.replicas if r.engine is not None]
        log = self.log
        return FleetStats(
            now_s=self.now_s,
            submitted=len(log),
            dispatched=sum(1 for x in log.dispatch_s if not math.isnan(x)),
            completed=sum(1 for x in log.finish_s if not math.isnan(x)),
            refused=sum(log.refused),
            preemptions=sum(e.metrics.preemptions for e in engines),
            gpu_seconds=self.gpu_seconds(),
            peak_router_queue=self.peak_router_queue,
            router_queued_total=self.router_queued_total,
            replicas_requested=len(self.replicas),
            steps=sum(e.steps for e in engines),
        )
