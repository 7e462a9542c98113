"""Closed-loop simulator speed: one hour of the Azure conversation trace at x16 with the
real governor control loop (5 s ticks, HPA sync 15 s, scrapes every 5 s) deciding.

Run: `.venv/bin/python -m benchmarks.bench_governor_sim [--runs 3] [--json F]`. Prints
wall and CPU seconds per run, their medians and the simulated/real-time ratio (goal:
>= 200x on one core, i.e. the hour in <= 18 s).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import Row, print_rows, span, write_rows
from controller.config import SLA
from simulator.scenario import Scenario, run_policy
from simulator.traces import load_trace

GOAL_X_REAL_TIME = 200.0


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="2 simulated minutes, one run")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.runs = 120.0, 1
    trace = load_trace("azure:conv", rate_multiplier=16, duration_s=args.duration, seed=0)
    sc = Scenario(trace=trace, sla=SLA(ttft_p95_ms=500, itl_p95_ms=50), start_replicas=4)
    walls: list[float] = []
    cpus: list[float] = []
    attainment: list[float] = []
    for i in range(args.runs):
        w0, c0 = time.perf_counter(), time.process_time()
        r = run_policy("governor", sc)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        attainment.append(r.slo_attainment)
        print(
            f"run {i + 1}: wall {walls[-1]:.1f} s  cpu {cpus[-1]:.1f} s  attainment "
            f"{100 * r.slo_attainment:.2f}%  gpu-hours {r.gpu_hours:.2f}"
        )
    simulated = sc.end_s
    out: dict[str, float] = {
        "requests": len(trace),
        "simulated_s": simulated,
        "wall_median_s": statistics.median(walls),
        "cpu_median_s": statistics.median(cpus),
        "x_real_time_wall": simulated / statistics.median(walls),
        "x_real_time_cpu": simulated / statistics.median(cpus),
    }
    print(
        f"governor closed loop, {len(trace):,} requests, {simulated:.0f} simulated s: "
        f"median wall {out['wall_median_s']:.1f} s ({out['x_real_time_wall']:.0f}x real time), "
        f"median cpu {out['cpu_median_s']:.1f} s ({out['x_real_time_cpu']:.0f}x)"
    )
    out["slo_attainment_median"] = statistics.median(attainment)
    rows = [
        Row(
            "6 simulator",
            f"governor closed loop, {span(args.duration)} azure:conv x16",
            f"{out['x_real_time_cpu']:.0f}x real time per CPU s "
            f"({out['x_real_time_wall']:.0f}x wall; {out['cpu_median_s']:.1f} s CPU; "
            f"attainment {out['slo_attainment_median']:.1%})",
            f">= {GOAL_X_REAL_TIME:g}x",
            out["x_real_time_cpu"] >= GOAL_X_REAL_TIME,
            out,
        )
    ]
    write_rows(args.json, "governor_sim", rows, out)
    return rows


if __name__ == "__main__":
    print_rows(main())
