"""The robustness matrix: every policy over several traces and plant/metric conditions.

`governor simulate --matrix` runs the governor and every baseline over four traces
(Azure conversation x16, Azure code x4, `synthetic:long-context`, `synthetic:diurnal`)
under the default condition (start at min replicas, 15 s scrape, plant speed 1.0, the
calibrated per-request overhead, the configured cold start) and then one factor at a
time: start at 4 replicas; scrape every 5 s and 30 s; plant step times x0.7 and x1.3;
cold start 2x the configured one; engines that follow knob changes live (the chart's
default; in the other rows they restart to take new knobs); requests spread over the
replicas at random (kube-proxy's choice of endpoint behind a plain Service) instead of by
a gateway's least-outstanding balancing, which the decider's capacity model assumes; a
per-request overhead of 200 ms before the engines (a gateway, an auth hop, a loaded API
server) where the profile the decider starts from says 29; every engine 1.3x slower from
half the trace on (a plant that changes under the controller). A cell is (SLO
attainment, GPU-hours / oracle, flaps).

Cost: cells run in parallel worker processes (default 2); the oracle is computed once per
trace, plant speed (and its change midway), router and overhead (neither the start,
the scrape nor the cold start changes it), and `static` holds that oracle's peak.
`--matrix-quick` runs short slices of the same traces under two conditions (a smoke run).
`--matrix-combined` runs the full traces under several factors changed at once
(COMBINED_CONDITIONS: slower or faster plants with a 30 s scrape and a 2x cold start),
the same cells, goals and columns.

Goals checked per row (issue "Control that holds off its tuning point"): smooth traces
(conv, long-context, diurnal): governor attainment >= 99 %, GPU-h <= 1.3x the oracle, 0
flaps; the bursty code trace: attainment >= hpa-queue's with fewer GPU-hours and flaps
<= hpa-gpu's; every trace: no baseline reaches the governor's attainment with fewer
GPU-hours.

Each row also runs the `ceiling` (simulator.autoscalers.Ceiling): the most replicas,
asked for at once from the row's start. Its attainment is the row's "best possible": the
most any policy can reach there, so a goal above it is out of reach by construction (a
start at one replica under a full load misses the first minute whatever the policy).
For GPU-hours there is no such bound, only a yardstick: the oracle's per-minute counts
held through the scale-down window ("oracle held"), and those covered from the row's
start without a flap ("no flap", OracleResult.flap_free_ratio): what a policy with that
window pays for 0 flaps if it serves every minute as the oracle does. Where that is over
1.3x, "GPU-h <= 1.3x oracle" and "0 flaps" conflict for such a policy; one that lets some
minutes fall under 99 % (the goal is 99 % over the run) can pay less, so the table shows
the figure and marks nothing out of reach by it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from controller.config import SLA, ScalingPolicy
from simulator.autoscalers import CEILING, POLICY_NAMES
from simulator.fleet import ROUTERS
from simulator.oracle import OracleResult, scenario_oracle
from simulator.plant import Plant
from simulator.pool import process_pool
from simulator.scenario import (
    DEFAULT_MIN_REPLICAS,
    DEFAULT_SCRAPE_INTERVAL_S,
    FLAP_WINDOW_S,
    Scenario,
    policy_changes,
    run_policy,
)
from simulator.traces import Trace, load_trace

SMOOTH_ATTAINMENT_GOAL = 0.99
SMOOTH_ORACLE_RATIO_GOAL = 1.3
SMOOTH_ATTAINMENT_KEY = "attainment >= 99 %"
HOLD_S = ScalingPolicy().scale_down_stabilization_s
"""The scale-down window the governor keeps by default (s; the HPA's default too): the
"oracle held" column holds each minute's oracle count through the governor's window
(OracleResult.held_ratio), this long unless `--policy-from` sets another (`_hold_doc`)."""


OracleKey = tuple[str, float, str, float | None, float | None]
"""An oracle's key: (trace key, *Condition.oracle_plant)."""


@dataclass(frozen=True)
class MatrixTrace:
    """One trace row group: spec, rate multiplier, SLA (ms), whether it is smooth, and
    the seconds of it replayed (None: all)."""

    key: str
    spec: str
    rate_scale: float
    ttft_ms: float
    itl_ms: float
    smooth: bool
    duration_s: float | None = None


@dataclass(frozen=True)
class Condition:
    """One column of conditions: changes from the default scenario."""

    name: str
    start_replicas: int | None = None
    scrape_interval_s: float | None = None
    plant_speed: float = 1.0
    cold_start_factor: float = 1.0
    live_knobs: bool = False
    router: str = ROUTERS[0]
    overhead_ms: float | None = None
    """The plant's per-request overhead, ms (None: the spec's, by default the profile's)."""
    speed_midway: float | None = None
    """The plant's step-time factor from the middle of the trace on (`midway_s`), the
    decider not told; None: `plant_speed` throughout."""

    @property
    def oracle_plant(self) -> tuple[float, str, float | None, float | None]:
        """What of the condition changes the oracle (plant speed, router, overhead, the
        speed from midway): neither the start, the scrape, the cold start nor live knobs
        do (it runs warm fleets on fixed knobs, one per window)."""
        return self.plant_speed, self.router, self.overhead_ms, self.speed_midway

    @property
    def plant_text(self) -> str:
        """The plant's speed as the table's learned-speed column shows it: '1.3', or
        '1 -> 1.3' for a change midway."""
        mid = "" if self.speed_midway is None else f" -> {self.speed_midway:g}"
        return f"{self.plant_speed:g}{mid}"

    @property
    def scrape_s(self) -> float:
        """The metric source's scrape interval this condition runs at, s (the scenario's
        default, DEFAULT_SCRAPE_INTERVAL_S, where it sets none)."""
        return (
            DEFAULT_SCRAPE_INTERVAL_S if self.scrape_interval_s is None else self.scrape_interval_s
        )


def midway_s(trace: Trace) -> float:
    """When a `speed_midway` change comes: half the trace's span, down to a whole
    minute (so no oracle window is split), seconds."""
    return 60.0 * math.floor(trace.span_s / 120.0)


TRACES: tuple[MatrixTrace, ...] = (
    MatrixTrace("conv x16", "azure:conv", 16.0, 500.0, 50.0, smooth=True),
    MatrixTrace("code x4", "azure:code", 4.0, 500.0, 50.0, smooth=False),
    MatrixTrace("long-context", "synthetic:long-context", 1.0, 15_000.0, 50.0, smooth=True),
    MatrixTrace("diurnal", "synthetic:diurnal", 1.0, 500.0, 50.0, smooth=True),
)
CONDITIONS: tuple[Condition, ...] = (
    Condition("default"),
    Condition("start 4", start_replicas=4),
    Condition("scrape 5 s", scrape_interval_s=5.0),
    Condition("scrape 30 s", scrape_interval_s=30.0),
    Condition("speed 0.7", plant_speed=0.7),
    Condition("speed 1.3", plant_speed=1.3),
    Condition("cold start 2x", cold_start_factor=2.0),
    Condition("knobs live", live_knobs=True),
    Condition("random routing", router="random"),
    Condition("overhead 200 ms", overhead_ms=200.0),
    Condition("slows 1.3x midway", speed_midway=1.3),
)


def _quarter(t: MatrixTrace) -> MatrixTrace:
    """`t`'s first 5 minutes at a quarter of its rate, its key naming the rate it runs
    at ("conv x16" -> "conv x4")."""
    name, sep, _ = t.key.partition(" x")
    key = f"{name} x{t.rate_scale / 4:g}" if sep else t.key
    return dataclasses.replace(t, key=key, rate_scale=t.rate_scale / 4, duration_s=300.0)


QUICK_TRACES: tuple[MatrixTrace, ...] = tuple(_quarter(t) for t in TRACES)
QUICK_CONDITIONS: tuple[Condition, ...] = (CONDITIONS[0], CONDITIONS[5])
COMBINED_CONDITIONS: tuple[Condition, ...] = (
    Condition("slow + 30 s", scrape_interval_s=30.0, plant_speed=1.3),
    Condition("slow + cold 2x", plant_speed=1.3, cold_start_factor=2.0),
    Condition(
        "slow + 30 s + cold 2x", scrape_interval_s=30.0, plant_speed=1.3, cold_start_factor=2.0
    ),
    Condition(
        "fast + 30 s + cold 2x", scrape_interval_s=30.0, plant_speed=0.7, cold_start_factor=2.0
    ),
)
"""`--matrix-combined`: the one-factor conditions' worst factors together (a cluster that
scrapes every 30 s, engines 30 % slower or faster than the profile, cold starts twice the
configured one), where no single factor is the tuning point's."""


@dataclass(frozen=True)
class MatrixSpec:
    """What a matrix run covers."""

    traces: tuple[MatrixTrace, ...] = TRACES
    conditions: tuple[Condition, ...] = CONDITIONS
    policies: tuple[str, ...] = POLICY_NAMES
    seed: int = 0
    max_replicas: int = 64
    overhead_ms: float | None = None
    workers: int = 2
    plots_dir: str | None = None
    """Where to write a PNG per row with a goal missed (None: no plots)."""
    bound: bool = True
    """Run the `ceiling` per row for its best possible attainment (module doc)."""
    governor_policy: ScalingPolicy = field(default_factory=ScalingPolicy)
    """The governor's scaling policy in every cell (`knobs_live` set by each condition)."""

    @staticmethod
    def quick(**kw: Any) -> MatrixSpec:
        """The smoke matrix: 5-minute slices at a quarter of the rate, two conditions."""
        return MatrixSpec(traces=QUICK_TRACES, conditions=QUICK_CONDITIONS, **kw)

    @staticmethod
    def combined(**kw: Any) -> MatrixSpec:
        """The full traces under the combined conditions (COMBINED_CONDITIONS)."""
        return MatrixSpec(conditions=COMBINED_CONDITIONS, **kw)


def scenario_for(spec: MatrixSpec, tr: MatrixTrace, cond: Condition) -> Scenario:
    """The scenario of one (trace, condition) cell (static_replicas filled later)."""
    trace = load_trace(
        tr.spec, rate_multiplier=tr.rate_scale, duration_s=tr.duration_s, seed=spec.seed
    )
    mid = cond.speed_midway
    return Scenario(
        trace=trace,
        sla=SLA(ttft_p95_ms=tr.ttft_ms, itl_p95_ms=tr.itl_ms),
        start_replicas=cond.start_replicas,
        max_replicas=spec.max_replicas,
        seed=spec.seed,
        scrape_interval_s=cond.scrape_s,
        governor_policy=spec.governor_policy,
        plant=Plant(
            speed=cond.plant_speed,
            overhead_ms=spec.overhead_ms if cond.overhead_ms is None else cond.overhead_ms,
            cold_start_factor=cond.cold_start_factor,
            live_knobs=cond.live_knobs,
            router=cond.router,
            speed_change=None if mid is None else (midway_s(trace), mid),
        ),
    )


def _oracle_condition(
    speed: float, router: str, overhead_ms: float | None, speed_midway: float | None
) -> Condition:
    """The condition an oracle runs on (Condition.oracle_plant)."""
    return Condition(
        "oracle",
        plant_speed=speed,
        router=router,
        overhead_ms=overhead_ms,
        speed_midway=speed_midway,
    )


def _oracle_job(args: tuple[MatrixSpec, MatrixTrace, Condition]) -> OracleResult:
    spec, tr, cond = args
    return scenario_oracle(scenario_for(spec, tr, cond), workers=1)


_PLOTTED = ("governor", "hpa-queue")
"""The policies a missed row's plot shows (with the oracle)."""


def _cell_job(args: tuple[MatrixSpec, MatrixTrace, Condition, str, int | None]) -> dict[str, Any]:
    spec, tr, cond, policy, static = args
    sc = scenario_for(spec, tr, cond)
    if static is not None:
        sc = dataclasses.replace(sc, static_replicas=static)
    t0 = time.process_time()
    result = run_policy(policy, sc)
    summary: dict[str, Any] = result.summary()
    summary["cpu_s"] = time.process_time() - t0
    if spec.plots_dir is not None and policy in _PLOTTED:
        keep = ("t", "total", "ttft_p95_by_minute")
        summary["_series"] = {k: result.series[k] for k in keep if k in result.series}
    return summary


def run_matrix(spec: MatrixSpec, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every cell (see module doc); returns the JSON document."""
    t_start = time.perf_counter()
    say = log or (lambda _m: None)
    # Each oracle once, in the spec's order (deterministic, whatever the key's types).
    oracle_keys = list(
        dict.fromkeys((t.key, *c.oracle_plant) for t in spec.traces for c in spec.conditions)
    )
    by_key = {t.key: t for t in spec.traces}
    runs = (*spec.policies, CEILING) if spec.bound else spec.policies
    cells = [(t, c, p) for t in spec.traces for c in spec.conditions for p in runs]
    results: dict[tuple[str, str, str], dict[str, Any]] = {}
    oracles: dict[OracleKey, OracleResult] = {}
    with process_pool(spec.workers) as pool:
        ofut: dict[OracleKey, Future[OracleResult]] = {
            k: pool.submit(_oracle_job, (spec, by_key[k[0]], _oracle_condition(*k[1:])))
            for k in oracle_keys
        }
        cfut = {
            (t.key, c.name, p): pool.submit(_cell_job, (spec, t, c, p, None))
            for t, c, p in cells
            if p != "static"
        }
        for k, f in ofut.items():
            oracles[k] = f.result()
            say(f"oracle {k[0]} speed {k[1]:g} {k[2]}: {oracles[k].gpu_hours:.2f} GPU-h")
        for t, c, p in cells:
            if p == "static":
                peak = max(1, max(oracles[(t.key, *c.oracle_plant)].replicas, default=1))
                cfut[(t.key, c.name, p)] = pool.submit(_cell_job, (spec, t, c, p, peak))
        for key, f in cfut.items():
            results[key] = f.result()
            say(f"{key[0]:>12} | {key[1]:<13} | {key[2]:<9} done")
    series = {k: r.pop("_series") for k, r in results.items() if "_series" in r}
    doc = _document(spec, results, oracles, time.perf_counter() - t_start)
    if spec.plots_dir is not None:
        doc["plots"] = _plot_missed(spec, doc, series, oracles)
    return doc


def _plot_missed(
    spec: MatrixSpec,
    doc: Mapping[str, Any],
    series: Mapping[tuple[str, str, str], dict[str, list[float]]],
    oracles: Mapping[OracleKey, OracleResult],
) -> list[str]:
    """A PNG per row with a goal missed (load, replicas of the governor, hpa-queue and
    the oracle, p95 TTFT per minute), named `<trace>_<condition>.png`; their paths. A
    row that meets every goal has none: one an earlier run left there is removed."""
    from simulator.plotdir import claim_plots_dir
    from simulator.report import plot
    from simulator.scenario import PolicyResult

    assert spec.plots_dir is not None
    claim_plots_dir(spec.plots_dir, spec.traces)
    out = []
    known = {f.name for f in dataclasses.fields(PolicyResult)}  # a cell is its summary()
    by_key = {t.key: t for t in spec.traces}
    by_cond = {c.name: c for c in spec.conditions}
    for row in doc["rows"]:
        tr, cond = by_key[row["trace"]], by_cond[row["condition"]]
        path = pathlib.Path(spec.plots_dir, f"{tr.key}_{cond.name}".replace(" ", "-") + ".png")
        if all(row["goals"].values()):
            path.unlink(missing_ok=True)
            continue
        results = {}
        for p in _PLOTTED:
            s = series.get((tr.key, cond.name, p))
            if s is not None:
                r = row["policies"][p]
                cell = {k: v for k, v in r.items() if k in known}
                results[p] = PolicyResult(name=p, series=s, **cell)
        plot(scenario_for(spec, tr, cond), results, oracles[(tr.key, *cond.oracle_plant)], path)
        out.append(str(path))
    return out


def _document(
    spec: MatrixSpec,
    results: Mapping[tuple[str, str, str], dict[str, Any]],
    oracles: Mapping[OracleKey, OracleResult],
    wall_s: float,
) -> dict[str, Any]:
    rows = []
    hold_s = spec.governor_policy.scale_down_stabilization_s
    for t in spec.traces:
        for c in spec.conditions:
            orc = oracles[(t.key, *c.oracle_plant)]
            pol = {}
            for p in spec.policies:
                pol[p] = _with_ratios(dict(results[(t.key, c.name, p)]), orc.gpu_hours)
            row = {
                "trace": t.key,
                "condition": c.name,
                "smooth": t.smooth,
                "oracle_gpu_hours": orc.gpu_hours,
                "oracle_peak": max(orc.replicas, default=0),
                "oracle_held_ratio": orc.held_ratio(hold_s),
                "oracle_flap_free_ratio": orc.flap_free_ratio(
                    hold_s,
                    FLAP_WINDOW_S,
                    DEFAULT_MIN_REPLICAS if c.start_replicas is None else c.start_replicas,
                ),
                "policies": pol,
            }
            bound = results.get((t.key, c.name, CEILING))
            if bound is not None:
                row["attainment_bound"] = bound["slo_attainment"]
            row["goals"] = row_goals(row)
            rows.append(row)
    return {
        "spec": _spec_doc(spec),
        "rows": rows,
        "wall_s": wall_s,
        "cpu_s": sum(r.get("cpu_s", 0.0) for r in results.values()),
    }


def _with_ratios(cell: dict[str, Any], oracle_gpu_hours: float) -> dict[str, Any]:
    """`cell` with its GPU-hours over the oracle's: over the oracle's window (the trace)
    and over the whole run (+ tail); None without an oracle."""
    ok = oracle_gpu_hours > 0
    trace_h = cell.get("gpu_hours_trace")
    cell["oracle_ratio"] = trace_h / oracle_gpu_hours if ok and trace_h is not None else None
    cell["oracle_ratio_run"] = cell["gpu_hours"] / oracle_gpu_hours if ok else None
    return cell


def condition_doc(cond: Condition) -> dict[str, Any]:
    """A condition as the document records it; `speed_midway` only where set, so
    documents written before it existed compare equal (`--matrix-base`)."""
    doc = dataclasses.asdict(cond)
    if doc["speed_midway"] is None:
        del doc["speed_midway"]
    return doc


def _spec_doc(spec: MatrixSpec) -> dict[str, Any]:
    return {
        "traces": [dataclasses.asdict(t) for t in spec.traces],
        "conditions": [condition_doc(c) for c in spec.conditions],
        "policies": list(spec.policies),
        "seed": spec.seed,
        "max_replicas": spec.max_replicas,
        "overhead_ms": spec.overhead_ms,
        "workers": spec.workers,
        "bound": spec.bound,
        **_policy_doc(spec),
        **_hold_doc(spec.governor_policy.scale_down_stabilization_s),
    }


def _policy_doc(spec: MatrixSpec) -> dict[str, Any]:
    """The spec document's `governor_policy`: the fields off the defaults, and nothing at
    all for the defaults (a default run's document stays as it was before the policy
    could be chosen)."""
    changed = policy_changes(spec.governor_policy)
    return {"governor_policy": changed} if changed else {}


def _hold_doc(hold_s: float) -> dict[str, Any]:
    """The spec document's `oracle_hold_s`: the window (s) the rows' "oracle held" and
    "no flap" figures hold the oracle's counts through (the governor's scale-down
    window), recorded only off the default HOLD_S, as `_policy_doc` records the policy.
    A governor rerun keeps its base's: it reruns no oracle."""
    return {} if hold_s == HOLD_S else {"oracle_hold_s": hold_s}


def oracle_hold_s(doc: Mapping[str, Any]) -> float:
    """The window (s) the "oracle held" figures of matrix document `doc` hold the
    oracle's counts through (`_hold_doc`)."""
    return float(doc["spec"].get("oracle_hold_s", HOLD_S))


def row_goals(row: Mapping[str, Any]) -> dict[str, bool]:
    """The goals of one row (see module doc); only those its policies allow checking."""
    pol = row["policies"]
    gov = pol.get("governor")
    if gov is None:
        return {}
    goals: dict[str, bool] = {}
    if row["smooth"]:
        goals[SMOOTH_ATTAINMENT_KEY] = gov["slo_attainment"] >= SMOOTH_ATTAINMENT_GOAL
        ratio = gov.get("oracle_ratio")
        goals["GPU-h <= 1.3x oracle"] = ratio is not None and ratio <= SMOOTH_ORACLE_RATIO_GOAL
        goals["0 flaps"] = gov["flaps"] == 0
    else:
        if "hpa-queue" in pol:
            q = pol["hpa-queue"]
            goals["attainment >= hpa-queue"] = gov["slo_attainment"] >= q["slo_attainment"]
            goals["GPU-h < hpa-queue"] = gov["gpu_hours"] < q["gpu_hours"]
        if "hpa-gpu" in pol:
            goals["flaps <= hpa-gpu"] = gov["flaps"] <= pol["hpa-gpu"]["flaps"]
    dominated = [
        name
        for name, r in pol.items()
        if name not in ("governor", "static")
        and r["slo_attainment"] >= gov["slo_attainment"]
        and r["gpu_hours"] < gov["gpu_hours"]
    ]
    goals["not dominated" + (f" ({', '.join(dominated)})" if dominated else "")] = not dominated
    return goals


def out_of_reach(row: Mapping[str, Any], goal: str) -> bool:
    """Whether `goal` of `row` asks for more attainment than the row's best possible
    (the `ceiling`'s, module doc): missed by construction, whatever the policy."""
    bound = row.get("attainment_bound")
    return goal == SMOOTH_ATTAINMENT_KEY and bound is not None and bound < SMOOTH_ATTAINMENT_GOAL


def matrix_table(doc: Mapping[str, Any]) -> str:
    """Markdown table: one row per (trace, condition), a cell per policy (attainment,
    GPU-h / oracle over the trace, flaps), the best possible attainment (when run), the
    oracle's GPU-h, the oracle's counts held through the scale-down window (x its own
    GPU-h: what keeping that window costs even with foresight) and so held without a flap
    from the row's start (`oracle_flap_free_ratio`), the governor's GPU-h /
    oracle with the drain tail after the trace, the speed the governor learned of the
    plant (median step-time factor against its profile; the plant's own in brackets),
    then the goals missed (those out of reach marked)."""
    policies: Sequence[str] = doc["spec"]["policies"]
    plant = {c["name"]: Condition(**c).plant_text for c in doc["spec"].get("conditions", ())}
    bounded = any("attainment_bound" in row for row in doc["rows"])
    best = ["best possible"] if bounded else []
    head = [
        "trace",
        "condition",
        *policies,
        *best,
        "oracle GPU-h",
        f"oracle held {oracle_hold_s(doc):g} s / no flap",
        "governor + tail",
        "learned speed (plant)",
        "goals missed",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in doc["rows"]:
        cells = []
        for p in policies:
            cell = _cell_text(row["policies"][p])
            cells.append(f"**{cell}**" if p == "governor" else cell)
        if bounded:
            bound = row.get("attainment_bound")
            cells.append("-" if bound is None else f"{100 * bound:.2f} %")
        missed = [
            f"{g} (out of reach)" if out_of_reach(row, g) else g
            for g, ok in row["goals"].items()
            if not ok
        ]
        gov = row["policies"].get("governor", {})
        run, learned = gov.get("oracle_ratio_run"), gov.get("learned_speed")
        tail = "-" if run is None else f"{run:.2f}x"
        held = " / ".join(
            "-" if (v := row.get(k)) is None else f"{v:.2f}x"
            for k in ("oracle_held_ratio", "oracle_flap_free_ratio")
        )
        truth = plant.get(row["condition"])
        speed = "-" if learned is None else f"{learned:.2f}" + (f" ({truth})" if truth else "")
        lines.append(
            f"| {row['trace']} | {row['condition']} | "
            + " | ".join(cells)
            + f" | {row['oracle_gpu_hours']:.2f} | {held} | {tail} | {speed}"
            + f" | {'; '.join(missed) or 'none'} |"
        )
    return "\n".join(lines)


def _cell_text(cell: Mapping[str, Any]) -> str:
    """One policy's cell as the table shows it: attainment / GPU-h over the oracle's
    (over the trace) / flaps, e.g. '99.67 % / 1.56x / 0'."""
    ratio = cell.get("oracle_ratio")
    rs = "-" if ratio is None else f"{ratio:.2f}x"
    return f"{100 * cell['slo_attainment']:.2f} % / {rs} / {cell['flaps']}"


GOVERNOR = "governor"


def rerun_changes(base: Mapping[str, Any], doc: Mapping[str, Any]) -> list[str]:
    """What a governor rerun `doc` (`rerun_governor`) moved against its `base`: the goals
    met before and after (both checked by today's `row_goals`), then a line per row whose
    governor cell moved (attainment, GPU-h over the oracle, flaps), with the goals it
    gained (+) and lost (-). Example: 'diurnal / default: 99.67 % / 1.56x / 0 -> 99.60 %
    / 1.27x / 0 (+GPU-h <= 1.3x oracle)'."""
    was = {(r["trace"], r["condition"]): r for r in base["rows"]}
    moved, before, after = [], 0, 0
    for row in doc["rows"]:
        old = was[(row["trace"], row["condition"])]
        goals_was, goals_now = row_goals(old), row_goals(row)
        before, after = before + sum(goals_was.values()), after + sum(goals_now.values())
        a, b = old["policies"][GOVERNOR], row["policies"][GOVERNOR]
        if all(a.get(k) == b.get(k) for k in ("slo_attainment", "oracle_ratio", "flaps")):
            continue
        flips = [
            f"{'+' if goals_now[g] else '-'}{g}"
            for g in goals_now
            if goals_now[g] != goals_was.get(g, goals_now[g])
        ]
        note = f" ({', '.join(flips)})" if flips else ""
        moved.append(
            f"  {row['trace']} / {row['condition']}: {_cell_text(a)} -> {_cell_text(b)}{note}"
        )
    cells = "cell" if len(moved) == 1 else "cells"
    return [f"{len(moved)} governor {cells} moved; goals met {before} -> {after}", *moved]


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def _base_problem(base: Any) -> str | None:
    """What keeps `base` (a parsed JSON document) from being a matrix document
    `rerun_governor` can read: not an object, a spec that is not one, rows that are
    not a list of rows. None when it has that shape."""

    def kind(value: Any) -> str:
        return _JSON_TYPES.get(type(value), "number")

    if not isinstance(base, Mapping):
        return f"not a matrix document: a JSON {kind(base)}, not an object"
    if "spec" not in base:
        return "not a matrix document: it has no spec"
    if not isinstance(base["spec"], Mapping):
        return f"not a matrix document: its spec is a JSON {kind(base['spec'])}, not an object"
    rows = base.get("rows")
    keys = ("trace", "condition", "policies", "oracle_gpu_hours")
    if not isinstance(rows, list) or not all(
        isinstance(r, Mapping) and all(k in r for k in keys) and isinstance(r["policies"], Mapping)
        for r in rows
    ):
        return f"not a matrix document: its rows are not a list of objects with {', '.join(keys)}"
    return None


def rerun_governor(
    spec: MatrixSpec, base: Mapping[str, Any], log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The matrix document `base` with only the governor's cells run again (and each
    row's goals checked again): for iterating on the decider in a third of the time.

    Every other policy's cells, the oracles and the best-possible bounds are `base`'s:
    they do not depend on the decider, but they do on the simulator, so `base` must come
    from this simulator and the same spec (traces, conditions, seed, fleet bound,
    overhead; checked, ValueError naming what differs). No plots (`base` holds no
    oracle series). The document says so: `governor_rerun` is true, `wall_s` /
    `cpu_s` count the governor's cells only, and its spec's `governor_policy` is this
    run's (`spec.governor_policy`, the base's may differ: comparing two policies on the
    same cells is what the rerun is for).
    """
    if problem := _base_problem(base):
        raise ValueError(problem)
    want, got = _spec_doc(spec), base.get("spec", {})
    same = ("traces", "conditions", "seed", "max_replicas", "overhead_ms")
    diff = [k for k in same if got.get(k) != want[k]]
    if diff:
        raise ValueError(f"the base matrix has another {', '.join(diff)} than this run")
    if GOVERNOR not in got.get("policies", ()):
        raise ValueError("the base matrix has no governor cells")
    t_start = time.perf_counter()
    say = log or (lambda _m: None)
    with process_pool(spec.workers) as pool:
        futs = {
            (t.key, c.name): pool.submit(_cell_job, (spec, t, c, GOVERNOR, None))
            for t in spec.traces
            for c in spec.conditions
        }
        results: dict[tuple[str, str], dict[str, Any]] = {}
        for key, f in futs.items():
            results[key] = f.result()
            say(f"{key[0]:>12} | {key[1]:<13} | governor done")
    doc = copy.deepcopy(dict(base))
    for row in doc["rows"]:
        r = results[(row["trace"], row["condition"])]
        row["policies"][GOVERNOR] = _with_ratios(r, row["oracle_gpu_hours"])
        row["goals"] = row_goals(row)
    doc.pop("plots", None)
    doc["spec"].pop("governor_policy", None)  # the base's; this run's is the spec's
    doc["spec"].update(_policy_doc(spec))
    doc["governor_rerun"] = True
    doc["wall_s"] = time.perf_counter() - t_start
    doc["cpu_s"] = sum(r.get("cpu_s", 0.0) for r in results.values())
    return doc


@dataclass
class MatrixSummary:
    """Counts of goals met over the whole matrix."""

    rows: int = 0
    goals: int = 0
    met: int = 0
    missed: list[str] = field(default_factory=list)
    out_of_reach: int = 0
    """Misses above the row's best possible attainment (`out_of_reach`)."""

    @staticmethod
    def of(doc: Mapping[str, Any]) -> MatrixSummary:
        s = MatrixSummary()
        for row in doc["rows"]:
            s.rows += 1
            for g, ok in row["goals"].items():
                s.goals += 1
                s.met += int(ok)
                if not ok:
                    s.missed.append(f"{row['trace']} / {row['condition']}: {g}")
                    s.out_of_reach += int(out_of_reach(row, g))
        return s
