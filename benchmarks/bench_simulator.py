"""Simulator speed benchmark: one hour of the Azure conversation trace at x16 on a fixed
fleet, with a metric source scraping every 5 s (as a controller run would).

Run: `.venv/bin/python -m benchmarks.bench_simulator [--runs 3] [--replicas 6] [--json F]`.
Prints per-run wall and CPU time (seconds), the medians, the simulated/real-time ratio
(simulated seconds per wall second, from the median; also per CPU second, which a
loaded machine disturbs less), requests simulated and engine steps per wall second.
Target: >= 200x real time on one core (< 18 s for the hour).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks.common import Row, print_rows, span, write_rows
from simulator.fleet import Fleet
from simulator.metrics import SimulatedSource
from simulator.traces import load_trace


def one_run(args: argparse.Namespace, trace_spec: str) -> dict[str, float]:
    """Load nothing, simulate once; returns wall seconds and counts."""
    trace = load_trace(
        trace_spec, rate_multiplier=args.multiplier, duration_s=args.duration, seed=args.seed
    )
    t0 = time.perf_counter()
    c0 = time.process_time()
    fleet = Fleet(initial_replicas=args.replicas, seed=args.seed)
    if not args.no_source:
        SimulatedSource(fleet, "llama", window_s=60.0, scrape_interval_s=5.0)
    fleet.submit_trace(trace)
    fleet.advance_to(args.duration)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    st = fleet.stats()
    rec = fleet.records()
    done = rec.done
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": float(len(trace)),
        "completed": float(st.completed),
        "steps": float(st.steps),
        "preemptions": float(st.preemptions),
        "ttft_p50_s": float(np.median(rec.ttft_s[done])),
        "ttft_p95_s": float(np.percentile(rec.ttft_s[done], 95)),
        "itl_p95_ms": float(np.nanpercentile(rec.mean_itl_s[done], 95) * 1000),
    }


GOAL_X_REAL_TIME = 200.0


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", default="azure:conv")
    ap.add_argument("--multiplier", type=float, default=16.0)
    ap.add_argument("--duration", type=float, default=3600.0, help="simulated seconds")
    ap.add_argument("--replicas", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-source", action="store_true", help="do not attach a metric source")
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="60 simulated seconds, one run")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.runs = 60.0, 1

    t0 = time.perf_counter()
    trace = load_trace(
        args.trace, rate_multiplier=args.multiplier, duration_s=args.duration, seed=args.seed
    )
    print(
        f"trace {args.trace} x{args.multiplier:g}, {args.duration:.0f} s: {len(trace):,} requests "
        f"({trace.mean_rate_rps:.1f} req/s), loaded in {time.perf_counter() - t0:.2f} s"
    )
    results = []
    for i in range(args.runs):
        r = one_run(args, args.trace)
        results.append(r)
        print(
            f"run {i + 1}: wall {r['wall_s']:.2f} s (cpu {r['cpu_s']:.2f} s), "
            f"{r['completed']:,.0f}/{r['requests']:,.0f} completed, {r['steps']:,.0f} steps "
            f"({r['steps'] / r['wall_s']:,.0f} steps/s), {r['preemptions']:.0f} preemptions"
        )
    med = statistics.median(r["wall_s"] for r in results)
    med_cpu = statistics.median(r["cpu_s"] for r in results)
    last = results[-1]
    print(f"replicas: {args.replicas} fixed; metric source: {'off' if args.no_source else 'on'}")
    print(f"median wall time: {med:.2f} s (median cpu time {med_cpu:.2f} s)")
    print(
        f"simulated/real ratio: {args.duration / med:.0f}x wall, "
        f"{args.duration / med_cpu:.0f}x cpu (target >= 200x)"
    )
    print(f"requests simulated: {last['requests']:,.0f}")
    print(f"steps/s: {last['steps'] / med:,.0f}")
    print(
        f"latency (per-request truth): TTFT p50 {last['ttft_p50_s'] * 1000:.0f} ms, "
        f"p95 {last['ttft_p95_s'] * 1000:.0f} ms; mean ITL p95 {last['itl_p95_ms']:.1f} ms"
    )
    x_wall, x_cpu = args.duration / med, args.duration / med_cpu
    data = {
        "simulated_s": args.duration,
        "wall_median_s": med,
        "cpu_median_s": med_cpu,
        "x_real_time_wall": x_wall,
        "x_real_time_cpu": x_cpu,
        "requests": last["requests"],
        "steps_per_s": last["steps"] / med,
        "runs": results,
    }
    rows = [
        Row(
            "6 simulator",
            f"fixed fleet ({args.replicas} replicas), {span(args.duration)} {args.trace} "
            f"x{args.multiplier:g}",
            f"{x_cpu:.0f}x real time per CPU s ({x_wall:.0f}x wall; {med_cpu:.1f} s CPU, "
            f"{last['requests']:,.0f} requests)",
            f">= {GOAL_X_REAL_TIME:g}x",
            x_cpu >= GOAL_X_REAL_TIME,
            data,
        )
    ]
    write_rows(args.json, "simulator", rows, data)
    return rows


if __name__ == "__main__":
    print_rows(main())
