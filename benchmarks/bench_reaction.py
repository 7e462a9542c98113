"""Reaction time in the simulator: from a step in load to the first scale-up decision.

Scenario: `synthetic:step` from `--low` to `--high` req/s at the middle of a `--duration`
s trace (a 10-minute settle before the step, which falls between evaluations), SLA TTFT
p95 1 s / ITL p95 50 ms, one replica at the start, the fleet and HPA sync (15 s) of
`simulator.scenario.run_policy`.
For each policy (governor; the baselines at their published defaults: HPA on GPU
utilisation and on queue time, KEDA's Prometheus scaler on the waiting queue, Knative
KPA) the time from the step to the first evaluation that asks for more replicas than the
fleet had at the step (the ask, not when the HPA applies it), in seconds and in governor
ticks (5 s); also when the fleet first grew (the ask applied at an HPA sync). Medians
over `--seeds` seeds of the trace; a seed in which a policy never asked (or never grew)
is left out of them and named, and fails the governor's row.

Run: `.venv/bin/python -m benchmarks.bench_reaction [--seeds 3] [--json F]`.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import simulator.scenario as scenario
from benchmarks.common import Row, bench_args, median, nan_runs, print_rows, write_rows
from controller.config import SLA
from simulator.fleet import Fleet
from simulator.metrics import SimulatedSource
from simulator.traces import load_trace

POLICIES = ("governor", "hpa-gpu", "hpa-queue", "keda", "kpa")
TICK_S = 5.0
GOAL_TICKS = 1.0  # "react within one tick" (issue 7)


def reaction(policy: str, sc: scenario.Scenario, step_at_s: float) -> dict[str, float]:
    """Seconds from the step to the first scale-up ask and to the first applied growth."""
    asked: list[float] = []
    grown: list[float] = []
    baseline: list[int] = []
    evals = [0]  # evaluations after the step, up to and including the first ask
    original = scenario.make_policy

    def make(name: str, s: scenario.Scenario, fleet: Fleet, source: SimulatedSource) -> Any:
        pol = original(name, s, fleet, source)
        evaluate = pol.evaluate

        def observed(now_s: float) -> int | None:
            if now_s >= step_at_s and not baseline:
                baseline.append(fleet.active_replicas)
            want = evaluate(now_s)
            if baseline and not asked:
                evals[0] += 1
                if want is not None and want > baseline[0]:
                    asked.append(now_s)
            return want

        pol.evaluate = observed
        return pol

    def on_sync(t: float, fleet: Fleet, pol: Any) -> None:
        if baseline and not grown and fleet.active_replicas > baseline[0]:
            grown.append(t)

    scenario.make_policy = make
    try:
        r = scenario.run_policy(policy, sc, on_sync=on_sync)
    finally:
        scenario.make_policy = original
    nan = math.nan
    return {
        "ask_s": asked[0] - step_at_s if asked else nan,
        "ask_evaluations": float(evals[0]) if asked else nan,
        "applied_s": grown[0] - step_at_s if grown else nan,
        "replicas_at_step": float(baseline[0]) if baseline else nan,
        "slo_attainment": r.slo_attainment,
        "interval_s": _interval(policy),
    }


def _interval(policy: str) -> float:
    return {"governor": TICK_S, "kpa": 2.0}.get(policy, 15.0)


MEASURED = ("ask_s", "ask_evaluations", "applied_s", "replicas_at_step", "slo_attainment")
"""The numbers of a run (`reaction`); NaN: the policy never asked, or never grew."""


def _row(policy: str, runs: list[dict[str, float]], args: argparse.Namespace) -> Row:
    """The row of `policy` over its runs (run k: seed k). A run with a NaN (the policy
    never asked for more replicas after the step, or the fleet never grew) is left out
    of the medians and named; the governor's row then fails (its goal is to react)."""
    never = nan_runs(runs, MEASURED)
    kept = [r for i, r in enumerate(runs) if i not in never]

    def med(key: str) -> float:
        return median(r[key] for r in kept) if kept else math.nan

    ask, evals, applied, att = (
        med("ask_s"),
        med("ask_evaluations"),
        med("applied_s"),
        med("slo_attainment"),
    )
    is_gov = policy == "governor"
    missed = ""
    if never:
        seeds = ", ".join(
            f"{i} ({'no ask' if math.isnan(runs[i]['ask_s']) else 'no growth'})" for i in never
        )
        missed = f"; NEVER REACTED in seed(s) {seeds}: medians over {len(kept)} of {len(runs)}"
    met = (evals <= GOAL_TICKS and ask <= GOAL_TICKS * TICK_S and not never) if is_gov else None
    return Row(
        "5 reaction",
        f"{policy}: step {args.low:g}->{args.high:g} req/s to first scale-up ask",
        f"{ask:.1f} s = {ask / TICK_S:.1f} ticks, at its evaluation no. {evals:.0f} "
        f"after the step (every {_interval(policy):g} s); applied +{applied:.0f} s at an "
        f"HPA sync; attainment {att:.1%}{missed}",
        f"first tick after the step (<= {GOAL_TICKS * TICK_S:g} s)" if is_gov else "",
        met,
        {
            "ask_s": ask,
            "ask_ticks": ask / TICK_S,
            "ask_evaluations": evals,
            "applied_s": applied,
            "slo_attainment": att,
            "never_reacted_seeds": never,
            "runs": runs,
        },
    )


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--low", type=float, default=10.0)
    ap.add_argument("--high", type=float, default=40.0)
    ap.add_argument("--duration", type=float, default=1200.0)
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.duration = 1, 300.0
    sla = SLA(ttft_p95_ms=1000, itl_p95_ms=50)
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    for seed in range(args.seeds):
        # A real step does not wait for a tick: seed k puts it (1 + 2k) % 5 + 0.5 s after
        # a governor tick (1.5, 3.5, 0.5, ... s), between the evaluations of every policy.
        duration = args.duration + 2 * ((1 + 2 * seed) % 5 + 0.5)
        step_at = duration * 0.5
        spec = f"synthetic:step:low={args.low:g},high={args.high:g},duration={duration:g},at=0.5"
        trace = load_trace(spec, seed=seed)
        sc = scenario.Scenario(trace=trace, sla=sla, start_replicas=1, drain_tail_s=120)
        for p in POLICIES:
            r = reaction(p, sc, step_at)
            runs[p].append(r)
            print(
                f"seed {seed} {p:9s}: ask +{r['ask_s']:.1f} s (evaluation "
                f"{r['ask_evaluations']:.0f}), applied +{r['applied_s']:.0f} s "
                f"(replicas at step {r['replicas_at_step']:.0f}), attainment "
                f"{r['slo_attainment']:.3f}",
                flush=True,
            )
    rows = [_row(p, runs[p], args) for p in POLICIES]
    write_rows(args.json, "reaction", rows, runs)
    return rows


if __name__ == "__main__":
    print_rows(main())
