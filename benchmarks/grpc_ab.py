"""Engine and KEDA call latency with the loop ticking against the loop idle, back to back.

On a shared machine bench_grpc's two phases (loop idle, then loop ticking, minutes
apart) see different loads. Here one `governor run` (1,000 models, ticking every 5 s,
its listeners in the serving process: service/serving.py) serves both sides, alternated
`--rounds` times at each rate and method: "idle" open loops run while the ticking
process is stopped (SIGSTOP; the serving process keeps answering from its mirror of the
board), "ticking" ones while it runs. The ratio of the p99s (ticking / idle) is issue
13's goal (<= 2x), at 250 and 1,000 calls/s, for GetBatchingConfig and GetMetrics;
reported as the median over the rounds, with every round's numbers and the minimal
grpc.aio server's p99 at the same rate, measured alongside, as the machine's noise floor.

Run: `.venv/bin/python -m benchmarks.grpc_ab [--models 1000] [--rounds 3] [--json F]`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_grpc import (
    OPEN_LOOP_METHODS,
    TICK_S,
    batching_call,
    open_loop,
    wait_ticks,
)
from benchmarks.common import Row, bench_args, median, print_rows, write_rows
from benchmarks.procs import fake_prometheus, governor_run, grpc_ceiling, write_governor_config
from benchmarks.promreplay import model_names

GOAL_RATIO = 2.0


def _round(
    gov_pid: int, address: str, ceiling: str, names: list[str], rate: float, args: Any, k: int
) -> dict[str, Any]:
    """One round at `rate`: per method an idle and a ticking open loop (order alternating
    by round), and the ceiling's GetBatchingConfig open loop."""
    out: dict[str, Any] = {
        "ceiling": asyncio.run(open_loop(ceiling, batching_call(names), rate, args.open_seconds))
    }
    for method, make in OPEN_LOOP_METHODS.items():
        for side in ("idle", "ticking") if k % 2 == 0 else ("ticking", "idle"):
            if side == "idle":
                os.kill(gov_pid, signal.SIGSTOP)
            try:
                res = asyncio.run(open_loop(address, make(names), rate, args.open_seconds))
            finally:
                if side == "idle":
                    os.kill(gov_pid, signal.SIGCONT)
            out[f"{method} {side}"] = res
            print(
                f"round {k} {rate:.0f}/s {method:17s} {side:7s}: p50 {res['p50_ms']:.2f} p99 "
                f"{res['p99_ms']:.2f} ms ({res['errors']} errors {res['error_codes']})",
                flush=True,
            )
    return out


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rates", default="250,1000", help="open-loop rates, calls/s")
    ap.add_argument("--open-seconds", type=float, default=10.0)
    args = ap.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    if args.quick:
        args.models, args.rounds, args.open_seconds = 10, 1, 2.0
    names = model_names(args.models)
    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    prom, url = fake_prometheus(write_governor_config(work / "fake.yaml", names))
    gov = governor_run(write_governor_config(work / "g.yaml", names, url, tick_interval_s=TICK_S))
    ceiling = grpc_ceiling()
    rounds: dict[str, list[dict[str, Any]]] = {}
    try:
        gov.port()
        wait_ticks(gov, gov.ports[1], 2)
        address, ceil_addr = f"127.0.0.1:{gov.ports[0]}", f"127.0.0.1:{ceiling.port()}"
        for k in range(args.rounds):
            for rate in rates:
                r = _round(gov.pid, address, ceil_addr, names, rate, args, k)
                rounds.setdefault(f"{rate:g}", []).append(r)
    finally:
        ceiling.stop()
        gov.stop()
        prom.stop()
        tmp.cleanup()
    rows = []
    for rate in rates:
        runs = rounds[f"{rate:g}"]
        ceil_p99 = median(r["ceiling"]["p99_ms"] for r in runs)
        for method in OPEN_LOOP_METHODS:
            ratios = [
                r[f"{method} ticking"]["p99_ms"] / r[f"{method} idle"]["p99_ms"] for r in runs
            ]
            tick_p99 = median(r[f"{method} ticking"]["p99_ms"] for r in runs)
            idle_p99 = median(r[f"{method} idle"]["p99_ms"] for r in runs)
            ratio = median(ratios)
            rows.append(
                Row(
                    "3 gRPC",
                    f"{method} p99 ticking / idle back to back, {rate:,.0f}/s, "
                    f"{args.models:,} models",
                    f"{ratio:.2f}x median of {len(runs)} rounds "
                    f"({', '.join(f'{x:.2f}' for x in ratios)}); p99 {tick_p99:.1f} / "
                    f"{idle_p99:.1f} ms; minimal server p99 {ceil_p99:.1f} ms",
                    f"<= {GOAL_RATIO:g}x",
                    ratio <= GOAL_RATIO,
                    {"ratios": ratios, "rounds": runs},
                )
            )
    write_rows(args.json, "grpc_ab", rows, {"rounds": rounds})
    return rows


if __name__ == "__main__":
    print_rows(main())
