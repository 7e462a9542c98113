"""What the tick thread's nice (`governor run --tick-nice`) buys and costs, on one core.

One `governor run` (1,000 models ticking every 5 s against the fake Prometheus, the
serving process on) is pinned with its serving process to CPU 0, as a pod limited to one
CPU; this process, its open loop and the fake Prometheus run on CPU 1. Two cases, each
run with every `--nices` value, alternated `--rounds` times:

- "serving saturated": an open loop of GetBatchingConfig at `--busy-rate` calls/s keeps
  the serving process busy enough to compete with the tick for CPU 0 (the case the nice
  is for: the engines' calls get the CPU first);
- "other work": a busy process at nice 0 shares CPU 0 (another workload in the same
  cgroup, as on a shared VM or in the real-engine tests), with calls at `--rate`.

Measured in each run: the serving p50/p99 (the open loop), admin GetTarget latency
sampled every 200 ms (p50/p99/max: the admin listener lives in the ticking process,
with the Lease elector and /metrics), and the ticks' mean duration (the governor's
/metrics). Each row: the median over the rounds. A run with a failed call stops the
bench (exit 1, naming it) rather than report numbers. Needs 2 CPUs (else it says so).

Run: `.venv/bin/python -m benchmarks.tick_nice [--rounds 2] [--seconds 40] [--json F]`.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from benchmarks.bench_grpc import TICK_S, batching_call, open_loop, scrape, wait_ticks
from benchmarks.common import Row, bench_args, median, percentile, print_rows, write_rows
from benchmarks.procs import fake_prometheus, governor_run, write_governor_config
from benchmarks.promreplay import model_names
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc

GOVERNOR_CPU, OTHER_CPU = 0, 1
ADMIN_EVERY_S = 0.2


def _busy() -> None:
    """A process at nice 0 that keeps CPU 0 busy (the "other work")."""
    os.sched_setaffinity(0, {GOVERNOR_CPU})
    while True:
        pass


def _pin(pids: list[int], cpu: int) -> None:
    """Every thread of `pids` onto `cpu` (threads started later inherit their creator's
    affinity)."""
    for p in pids:
        for task in Path(f"/proc/{p}/task").iterdir():
            os.sched_setaffinity(int(task.name), {cpu})


def _admin_loop(address: str, model: str, stop: threading.Event, out: list[float]) -> None:
    """GetTarget every ADMIN_EVERY_S until `stop`; latencies in s (inf: failed)."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AdminServiceStub(channel)
        while not stop.wait(ADMIN_EVERY_S):
            t0 = time.monotonic()
            try:
                stub.GetTarget(pb.GetTargetRequest(model=model), timeout=60)
                out.append(time.monotonic() - t0)
            except grpc.RpcError:
                out.append(float("inf"))


def _run(names: list[str], nice: int, rate: float, busy: int, seconds: float) -> dict[str, Any]:
    """One governor at `--tick-nice nice`, measured for `seconds` (module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        prom, url = fake_prometheus(write_governor_config(work / "fake.yaml", names))
        config = write_governor_config(work / "g.yaml", names, url, tick_interval_s=TICK_S)
        gov = governor_run(config, extra=["--insecure-admin", "--tick-nice", str(nice)])
        hogs: list[mp.Process] = []
        try:
            gov.port()
            _pin(gov.pids(), GOVERNOR_CPU)
            wait_ticks(gov, gov.ports[1], 2)
            address = f"127.0.0.1:{gov.ports[0]}"
            before = scrape(gov.ports[1])
            hogs = [mp.Process(target=_busy, daemon=True) for _ in range(busy)]
            for h in hogs:
                h.start()
            admin: list[float] = []
            stop = threading.Event()
            sampler = threading.Thread(target=_admin_loop, args=(address, names[0], stop, admin))
            sampler.start()
            try:
                serving = asyncio.run(open_loop(address, batching_call(names), rate, seconds))
            finally:
                stop.set()
                sampler.join()
            after = scrape(gov.ports[1])
        finally:
            for h in hogs:
                h.kill()
            gov.stop()
            prom.stop()
    count = "governor_tick_duration_seconds_count"
    total = "governor_tick_duration_seconds_sum"
    ticks = after[count] - before[count]
    return {
        "serving_p50_ms": serving["p50_ms"],
        "serving_p99_ms": serving["p99_ms"],
        "serving_errors": serving["errors"],
        "admin_p50_ms": 1e3 * percentile(admin, 0.5),
        "admin_p99_ms": 1e3 * percentile(admin, 0.99),
        "admin_max_ms": 1e3 * max(admin),
        "admin_calls": len(admin),
        "tick_mean_ms": 1e3 * (after[total] - before[total]) / max(ticks, 1.0),
    }


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--nices", default="10,0", help="tick nices compared, comma-separated")
    ap.add_argument("--rate", type=float, default=250.0, help="calls/s beside other work")
    ap.add_argument("--busy-rate", type=float, default=3500.0, help="calls/s to saturate")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.rounds, args.seconds = 10, 1, 6.0
    if len(os.sched_getaffinity(0)) < 2:
        print("tick_nice: needs 2 CPUs (one for the governor, one for the load)")
        return []
    os.sched_setaffinity(0, {OTHER_CPU})
    names = model_names(args.models)
    nices = [int(n) for n in args.nices.split(",")]
    cases = {"serving saturated": (args.busy_rate, 0), "other work": (args.rate, 1)}
    runs: dict[str, list[dict[str, Any]]] = {}
    for k in range(args.rounds):
        for case, (rate, busy) in cases.items():
            for nice in nices if k % 2 == 0 else reversed(nices):
                r = _run(names, nice, rate, busy, args.seconds)
                print(f"round {k} {case} nice {nice}: {r}", flush=True)
                if r["serving_errors"] or r["admin_max_ms"] == math.inf:
                    raise SystemExit(
                        f"tick_nice: calls failed in round {k}, {case}, nice {nice} "
                        f"({r['serving_errors']} serving errors, admin max "
                        f"{r['admin_max_ms']} ms): no numbers reported"
                    )
                runs.setdefault(f"{case} | {nice}", []).append(r)
    rows = []
    for key, rs in runs.items():
        case, nice = key.split(" | ")
        rate, busy = cases[case]

        def med(field: str, rs: list[dict[str, Any]] = rs) -> float:
            return median(r[field] for r in rs)

        rows.append(
            Row(
                "3 gRPC",
                f"tick nice {nice}, {case} ({rate:,.0f} calls/s, {args.models:,} models)",
                f"serving p99 {med('serving_p99_ms'):.1f} ms; admin p99 "
                f"{med('admin_p99_ms'):.0f} ms, max {med('admin_max_ms'):.0f} ms; tick mean "
                f"{med('tick_mean_ms'):.0f} ms (median of {len(rs)})",
            )
        )
    write_rows(args.json, "tick_nice", rows, {"runs": runs})
    return rows


if __name__ == "__main__":
    print_rows(main())
