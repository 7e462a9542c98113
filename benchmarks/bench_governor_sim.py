"""Closed-loop simulator speed: one hour of the Azure conversation trace at x16 with the
real governor control loop (5 s ticks, HPA sync 15 s, scrapes every 5 s) deciding.

Run: `.venv/bin/python benchmarks/bench_governor_sim.py [--runs 3]`. Prints wall and CPU
seconds per run, their medians and the simulated/real-time ratio (goal: >= 200x on one
core, i.e. the hour in <= 18 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from controller.config import SLA
from simulator.scenario import Scenario, run_policy
from simulator.traces import load_trace


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    trace = load_trace("azure:conv", rate_multiplier=16, duration_s=args.duration, seed=0)
    sc = Scenario(trace=trace, sla=SLA(ttft_p95_ms=500, itl_p95_ms=50), start_replicas=4)
    walls, cpus = [], []
    for i in range(args.runs):
        w0, c0 = time.perf_counter(), time.process_time()
        r = run_policy("governor", sc)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        print(
            f"run {i + 1}: wall {walls[-1]:.1f} s  cpu {cpus[-1]:.1f} s  attainment "
            f"{100 * r.slo_attainment:.2f}%  gpu-hours {r.gpu_hours:.2f}"
        )
    simulated = sc.end_s
    out = {
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
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
