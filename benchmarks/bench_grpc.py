"""gRPC serving: GetBatchingConfig and KEDA GetMetrics against `governor run`, side by side
with the ceiling of the stack (benchmarks/grpc_ceiling.py), on loopback.

Set-up (processes besides this one, the client): the fake Prometheus answering the
recording for N models (benchmarks/fake_prometheus.py), a real `governor run --config`
for those N models (memory store, JSON logs drained) and the minimal grpc.aio server.
Phase A runs a governor whose loop is idle after its first tick (tick interval 300 s),
phase B one ticking every 5 s as in production.

Measured:
- closed loop (phase A), `--reps` times alternating the two servers, medians: `--concurrency`
  callers on 4 channels call as fast as they can for `--seconds`: calls/s, client-side
  p50/p99 latency (ms), and each server's CPU per call (us, from /proc). The Python client
  saturates before either server on 2 cores, so calls/s is client-bound; the goal is
  judged on capacity, the ceiling's CPU per call over the governor's;
- open loop at each of `--rates` calls/s for `--open-seconds` (GetBatchingConfig, and
  KEDA's GetMetrics): p50 and p99 latency from send to answer (ms) of the governor
  ticking every 5 s, of the governor with its loop idle (the same server, no ticks: what
  the ticks add; their ratio is issue 13's goal) and of the ceiling (GetBatchingConfig);
  and the ticks meanwhile: how many ran against the 5 s schedule, how late the
  latest started and how long they took (the governor's /metrics; on time: every tick
  started within 1 s of its schedule) and the longest gap between tick starts (from the
  arrival times of its log lines).

Fails (exit 1, naming the cause) rather than report numbers on errors: when a tick of
the governor had no data for a model (its /metrics: stale models, source errors; see
`benchmarks.procs.tick_data_problem`) or when calls failed other than by load shedding.
A closed-loop rep that completed no call is left out of the medians, named in its row,
and fails the goal (`closed_loop_medians`).

Goals (issue 7): GetBatchingConfig throughput >= 70 % of the ceiling's; p99 <= 5 ms at
1,000 calls/s while control ticks stay on time. Issue 13: GetBatchingConfig and GetMetrics
p99 while 1,000 models tick <= 2x the p99 with the loop idle, at 250 and 1,000 calls/s.
`governor run` serves from a process of its own (service/serving.py): CPU and memory
are the governor's processes together.
Run: `.venv/bin/python -m benchmarks.bench_grpc [--models 1000] [--json F]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import random
import re
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from actuators.keda import metric_name
from benchmarks.common import (
    Row,
    bench_args,
    median,
    nan_runs,
    percentile,
    print_rows,
    write_rows,
)
from benchmarks.procs import (
    Child,
    NoTickDataError,
    fake_prometheus,
    governor_run,
    grpc_ceiling,
    tick_data_problem,
    write_governor_config,
)
from benchmarks.promreplay import model_names
from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc

GOAL_FRAC_OF_CEILING = 0.70
GOAL_P99_MS = 5.0
TICK_S = 5.0
CHANNELS = 4

Call = Callable[[grpc.aio.Channel, int], Awaitable[Any]]


def batching_call(names: list[str]) -> Call:
    """GetBatchingConfig for a random configured model, as engines call it."""
    reqs = [
        pb.GetBatchingConfigRequest(model=n, engine_id=f"engine-{i % 64}")
        for i, n in enumerate(names)
    ]

    async def call(channel: grpc.aio.Channel, i: int) -> Any:
        return await pb_grpc.BatchingServiceStub(channel).GetBatchingConfig(
            reqs[i % len(reqs)], timeout=10
        )

    return call


def keda_call(names: list[str]) -> Call:
    """GetMetrics as KEDA sends it (the trigger's whole metadata map)."""
    reqs = [
        es.GetMetricsRequest(
            scaledObjectRef=es.ScaledObjectRef(
                name=f"so-{n}",
                namespace="default",
                scalerMetadata={"model": n, "scalerAddress": "governor:50051"},
            ),
            metricName=metric_name(n),
        )
        for n in names
    ]

    async def call(channel: grpc.aio.Channel, i: int) -> Any:
        return await es_grpc.ExternalScalerStub(channel).GetMetrics(reqs[i % len(reqs)], timeout=10)

    return call


async def closed_loop(
    address: str, call: Call, concurrency: int, seconds: float, server: Child
) -> dict[str, float]:
    """`concurrency` callers back to back for `seconds` (after 1 s of warm-up)."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(CHANNELS)]
    try:
        for ch in channels:
            await ch.channel_ready()
        lat: list[float] = []
        errors = 0
        codes: dict[str, int] = {}
        measuring = False
        stop_at = time.perf_counter() + 1.0 + seconds
        rng = random.Random(1)

        async def worker(k: int) -> None:
            nonlocal errors
            ch = channels[k % CHANNELS]
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                try:
                    await call(ch, rng.randrange(1 << 30))
                except grpc.aio.AioRpcError as exc:
                    errors += 1
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                    continue
                if measuring:
                    lat.append(time.perf_counter() - t0)

        tasks = [asyncio.create_task(worker(k)) for k in range(concurrency)]
        await asyncio.sleep(1.0)
        measuring = True
        cpu0, w0 = server.cpu_s(), time.perf_counter()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - w0
        cpu = server.cpu_s() - cpu0
    finally:
        for ch in channels:
            await ch.close()
    n = len(lat)
    return {
        "calls_per_s": n / wall,
        "p50_ms": percentile(lat, 0.5) * 1000 if n else float("nan"),
        "p99_ms": percentile(lat, 0.99) * 1000 if n else float("nan"),
        "server_cpu_us_per_call": cpu / n * 1e6 if n else float("nan"),
        "calls": n,
        "errors": errors,
        "error_codes": codes,
    }


async def open_loop(address: str, call: Call, rate: float, seconds: float) -> dict[str, float]:
    """Calls started at a fixed `rate` (calls/s) for `seconds`, whatever the answers do."""
    channels = [grpc.aio.insecure_channel(address) for _ in range(CHANNELS)]
    try:
        for ch in channels:
            await ch.channel_ready()
        lat: list[float] = []
        late: list[float] = []
        errors = 0
        codes: dict[str, int] = {}
        loop = asyncio.get_running_loop()
        total = int(rate * seconds)
        start = loop.time() + 0.05
        tasks = []

        async def one(i: int, due: float) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            late.append(loop.time() - due)
            try:
                await call(channels[i % CHANNELS], i)
            except grpc.aio.AioRpcError as exc:
                errors += 1
                codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                return
            lat.append(time.perf_counter() - t0)

        for i in range(total):
            due = start + i / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, due)))
        await asyncio.gather(*tasks)
    finally:
        for ch in channels:
            await ch.close()
    return {
        "rate_per_s": rate,
        "calls": len(lat),
        "errors": errors,
        "error_codes": codes,
        "p50_ms": percentile(lat, 0.5) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
        "max_ms": max(lat) * 1000,
        "client_send_lag_p99_ms": percentile(late, 0.99) * 1000,
    }


def scrape(port: int) -> dict[str, float]:
    """The governor's tick counters from its /metrics (one scrape)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out: dict[str, float] = {}
    for key in (
        "governor_ticks_total",
        "governor_tick_duration_seconds_sum",
        "governor_tick_duration_seconds_count",
    ):
        m = re.search(rf"^{key} (\S+)$", text, re.M)
        if m:
            out[key] = float(m.group(1))
    # Tick start lateness against the ticker's schedule (cumulative bucket counts).
    for le, count in re.findall(
        r'^governor_tick_lateness_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M
    ):
        out[f"lateness_le_{le}"] = float(count)
    return out


def max_lateness_s(before: dict[str, float], after: dict[str, float]) -> float:
    """Upper bound (a bucket bound, s) of the latest tick start between two scrapes;
    NaN when the governor does not report tick lateness."""
    bounds = sorted(
        (float(k.removeprefix("lateness_le_")), after[k] - before.get(k, 0.0))
        for k in after
        if k.startswith("lateness_le_")
    )
    if not bounds:
        return float("nan")
    total = bounds[-1][1]
    if total <= 0:
        return float("nan")
    for bound, count in bounds:
        if count >= total:
            return bound
    return float("inf")


def tick_gaps(line_times: list[float], since: float, until: float) -> list[float]:
    """Gaps (s) between the starts of consecutive ticks, from log line arrival times: a
    tick writes one line per model in a burst; a pause over 1 s starts a new burst."""
    starts: list[float] = []
    prev = None
    for t in line_times:
        if prev is None or t - prev > 1.0:
            starts.append(t)
        prev = t
    starts = [s for s in starts if since <= s <= until]
    return [b - a for a, b in itertools.pairwise(starts)]


def wait_ticks(gov: Child, metrics_port: int, n: int, timeout_s: float = 120.0) -> None:
    """Wait for `n` ticks of `gov`; NoTickDataError when they had no data."""
    deadline = time.monotonic() + timeout_s
    while scrape(metrics_port).get("governor_ticks_total", 0) < n:
        if time.monotonic() > deadline or gov.proc.poll() is not None:
            raise RuntimeError("governor did not tick:\n" + "\n".join(gov.kept[-20:]))
        time.sleep(0.5)
    check_tick_data(metrics_port)


def check_tick_data(metrics_port: int) -> None:
    """NoTickDataError when any tick of the governor so far had no data for a model."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    problem = tick_data_problem(urllib.request.urlopen(url, timeout=30).read().decode())
    if problem:
        raise NoTickDataError(problem)


SERVING: list[str] = []
"""Extra `governor run` arguments (`--serving inline` to compare with the old layout)."""


def _start_governor(names: list[str], url: str, workdir: Path, tick_s: float) -> Child:
    cfg = write_governor_config(
        workdir / f"governor-{tick_s:g}.yaml", names, url, tick_interval_s=tick_s
    )
    gov = governor_run(cfg, SERVING)
    gov.port()
    wait_ticks(gov, gov.ports[1], 1)  # every model has a decision on the board
    return gov


def throughput(
    names: list[str], url: str, workdir: Path, args: argparse.Namespace
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Phase A: closed loop, governor (its loop idle: tick interval 300 s, one tick done)
    against the ceiling, alternating, `args.reps` times per method."""
    gov = _start_governor(names, url, workdir, 300.0)
    ceiling = grpc_ceiling()
    try:
        addrs = {"governor": (f"127.0.0.1:{gov.ports[0]}", gov)}
        addrs["ceiling"] = (f"127.0.0.1:{ceiling.port()}", ceiling)
        results: dict[str, dict[str, list[dict[str, float]]]] = {}
        for method, make in (("GetBatchingConfig", batching_call), ("GetMetrics", keda_call)):
            call = make(names)
            per: dict[str, list[dict[str, float]]] = {"governor": [], "ceiling": []}
            for rep in range(args.reps):
                order = ("governor", "ceiling") if rep % 2 == 0 else ("ceiling", "governor")
                for label in order:
                    addr, child = addrs[label]
                    r = asyncio.run(closed_loop(addr, call, args.concurrency, args.seconds, child))
                    per[label].append(r)
                    print(
                        f"{method:17s} {label:8s} {r['calls_per_s']:7.0f} calls/s "
                        f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms, server "
                        f"{r['server_cpu_us_per_call']:.0f} us CPU/call, {r['errors']} errors",
                        flush=True,
                    )
            results[method] = per
        # The same open loops as phase B, against the governor whose loop is idle: what
        # the control ticks add to the latency (phase B) shows against this.
        for rate in args.rates:
            for method, make in OPEN_LOOP_METHODS.items():
                idle = asyncio.run(
                    open_loop(addrs["governor"][0], make(names), rate, args.open_seconds)
                )
                results.setdefault("open_loop_idle", {})[_key(method, rate)] = [idle]
                print(
                    f"open loop {method} {rate:.0f}/s, governor loop idle: p50 "
                    f"{idle['p50_ms']:.2f} p99 {idle['p99_ms']:.2f} ms ({idle['errors']} errors)",
                    flush=True,
                )
    finally:
        ceiling.stop()
        gov.stop()
    return results


def latency_under_ticks(
    names: list[str], url: str, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Phase B: open loop at each rate against the governor ticking every 5 s (and the
    ceiling at the same rates, for reference), with the ticks' timing meanwhile."""
    gov = _start_governor(names, url, workdir, TICK_S)
    ceiling = grpc_ceiling()
    out: dict[str, Any] = {}
    try:
        gov_addr, ceil_addr = f"127.0.0.1:{gov.ports[0]}", f"127.0.0.1:{ceiling.port()}"
        wait_ticks(gov, gov.ports[1], 2)
        for rate in args.rates:
            ref = asyncio.run(open_loop(ceil_addr, batching_call(names), rate, args.open_seconds))
            keda = asyncio.run(open_loop(gov_addr, keda_call(names), rate, args.open_seconds))
            out[_key("GetMetrics", rate)] = keda
            print(
                f"open loop GetMetrics {rate:.0f}/s: governor p50 {keda['p50_ms']:.2f} p99 "
                f"{keda['p99_ms']:.2f} max {keda['max_ms']:.1f} ms ({keda['errors']} errors "
                f"{keda['error_codes']})",
                flush=True,
            )
            call = batching_call(names)
            before = scrape(gov.ports[1])
            t0 = time.monotonic()
            ol = asyncio.run(open_loop(gov_addr, call, rate, args.open_seconds))
            t1 = time.monotonic()
            after = scrape(gov.ports[1])
            ticks = after["governor_ticks_total"] - before["governor_ticks_total"]
            dur = (
                after["governor_tick_duration_seconds_sum"]
                - before["governor_tick_duration_seconds_sum"]
            )
            gaps = tick_gaps(gov.line_times, t0 - TICK_S, t1)
            late = max_lateness_s(before, after)
            ol.update(
                {
                    "seconds": t1 - t0,
                    "ticks": ticks,
                    "ticks_expected": (t1 - t0) / TICK_S,
                    "tick_wall_s_mean": dur / ticks if ticks else float("nan"),
                    "tick_gap_max_s": max(gaps) if gaps else float("nan"),
                    "tick_gaps_s": [round(g, 3) for g in gaps],
                    "tick_lateness_max_s": late,
                    "ceiling": ref,
                }
            )
            out[f"{rate:g}"] = ol
            print(
                f"open loop {rate:.0f}/s, {t1 - t0:.1f} s: governor p50 {ol['p50_ms']:.2f} "
                f"p99 {ol['p99_ms']:.2f} max {ol['max_ms']:.1f} ms ({ol['errors']} errors "
                f"{ol['error_codes']}); "
                f"ceiling p50 {ref['p50_ms']:.2f} p99 {ref['p99_ms']:.2f} ms; {ticks:.0f} "
                f"ticks (schedule {ol['ticks_expected']:.1f}), tick {ol['tick_wall_s_mean']:.2f}"
                f" s wall, max gap {ol['tick_gap_max_s']:.2f} s",
                flush=True,
            )
        check_tick_data(gov.ports[1])  # every tick during the open loops had data
        out["governor_rss_mb"] = gov.rss_mb()[0]
    finally:
        ceiling.stop()
        gov.stop()
    return out


OPEN_LOOP_METHODS: dict[str, Callable[[list[str]], Call]] = {
    "GetBatchingConfig": batching_call,
    "GetMetrics": keda_call,
}
GOAL_TICK_RATIO = 2.0
"""Issue 13: p99 while 1,000 models tick <= 2x the p99 with the loop idle."""


def _key(method: str, rate: float) -> str:
    """The results key of an open loop: the rate alone for GetBatchingConfig (as before)."""
    return f"{rate:g}" if method == "GetBatchingConfig" else f"{method} {rate:g}"


def tick_ratio_rows(
    args: argparse.Namespace, lat: dict[str, Any], idle_runs: dict[str, Any]
) -> list[Row]:
    """Per method and rate: p99 with the loop ticking over p99 with it idle."""
    rows = []
    for rate in args.rates:
        for method in OPEN_LOOP_METHODS:
            ticking, idle = lat[_key(method, rate)], idle_runs[_key(method, rate)][0]
            ratio = ticking["p99_ms"] / idle["p99_ms"]
            rows.append(
                Row(
                    "3 gRPC",
                    f"{method} p99 ticking / idle, open loop {rate:,.0f}/s, {args.models:,} models",
                    f"{ticking['p99_ms']:.1f} / {idle['p99_ms']:.1f} ms = {ratio:.2f}x "
                    f"(p50 {ticking['p50_ms']:.1f} / {idle['p50_ms']:.1f} ms; errors "
                    f"{ticking['errors']} / {idle['errors']})",
                    f"<= {GOAL_TICK_RATIO:g}x",
                    ratio <= GOAL_TICK_RATIO,
                    {"ticking": ticking, "idle": idle, "ratio": ratio, "rate_per_s": rate},
                )
            )
    return rows


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rates", default="1000,250", help="open-loop rates, calls/s")
    ap.add_argument("--open-seconds", type=float, default=10.0)
    ap.add_argument(
        "--serving",
        choices=("process", "inline"),
        default="process",
        help="where governor run serves (inline: the listeners share the ticking process)",
    )
    args = ap.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    SERVING[:] = ["--serving", args.serving]
    if args.quick:
        args.models, args.seconds, args.reps, args.open_seconds = 10, 1.0, 1, 2.0
    names = model_names(args.models)
    tmp = tempfile.TemporaryDirectory()
    prom, url = fake_prometheus(write_governor_config(Path(tmp.name) / "fake.yaml", names))
    try:
        results = throughput(names, url, Path(tmp.name), args)
        lat = latency_under_ticks(names, url, Path(tmp.name), args)
    finally:
        prom.stop()
        tmp.cleanup()

    rows: list[Row] = []
    med: dict[str, dict[str, dict[str, float]]] = {}
    idle_runs = results.pop("open_loop_idle", {})
    for method, per in results.items():
        med[method], empty = closed_loop_medians(per)
        g, c = med[method]["governor"], med[method]["ceiling"]
        # On 2 cores the Python client saturates before either server does, so calls/s
        # is client-bound; server CPU per call is each server's own cost (its capacity
        # is 1 / that per core). The goal is judged on capacity.
        frac = c["server_cpu_us_per_call"] / g["server_cpu_us_per_call"]
        is_goal = method == "GetBatchingConfig"
        rows.append(
            Row(
                "3 gRPC",
                f"{method}, {args.models:,} models, {args.concurrency} callers: governor / ceiling",
                f"server CPU {g['server_cpu_us_per_call']:.0f} / "
                f"{c['server_cpu_us_per_call']:.0f} us/call = {frac:.0%} of ceiling capacity; "
                f"{g['calls_per_s']:,.0f} / {c['calls_per_s']:,.0f} calls/s (client-bound); "
                f"p50 {g['p50_ms']:.1f} / {c['p50_ms']:.1f} ms, p99 {g['p99_ms']:.1f} / "
                f"{c['p99_ms']:.1f} ms"
                + (f"; NO CALL COMPLETED in {empty}: medians over the other reps" if empty else ""),
                f">= {GOAL_FRAC_OF_CEILING:.0%} of ceiling" if is_goal else "",
                (frac >= GOAL_FRAC_OF_CEILING and not empty) if is_goal else None,
                {"governor": g, "ceiling": c, "capacity_fraction": frac, "runs": per},
            )
        )
    for rate in args.rates:
        ol = lat[f"{rate:g}"]
        ref = ol["ceiling"]
        idle = idle_runs[f"{rate:g}"][0]
        ol["governor_loop_idle"] = idle
        late = ol["tick_lateness_max_s"]
        on_time = ol["ticks"] >= int(ol["ticks_expected"]) and (
            late <= 1.0 if not math.isnan(late) else ol["tick_gap_max_s"] <= TICK_S + 1.0
        )
        is_goal = rate == 1000.0
        rows.append(
            Row(
                "3 gRPC",
                f"GetBatchingConfig open loop {rate:,.0f}/s, {args.models:,} models ticking",
                f"governor p50 {ol['p50_ms']:.1f} ms, p99 {ol['p99_ms']:.1f} ms "
                f"({ol['errors']} errors); loop idle: p99 {idle['p99_ms']:.1f} ms; ceiling "
                f"p99 {ref['p99_ms']:.1f} ms; ticks "
                f"{ol['ticks']:.0f}/{ol['ticks_expected']:.1f} due, started <= {late:g} s late"
                f" (max gap {ol['tick_gap_max_s']:.2f} s), {ol['tick_wall_s_mean']:.2f} s each",
                f"p99 <= {GOAL_P99_MS:g} ms, ticks on time" if is_goal else "",
                (ol["p99_ms"] <= GOAL_P99_MS and on_time and ol["errors"] == 0)
                if is_goal
                else None,
                ol,
            )
        )
    rows += tick_ratio_rows(args, lat, idle_runs)
    write_rows(args.json, "grpc", rows, {"medians": med, "open_loop": lat})
    failed = failed_calls(rows)
    if failed:
        print_rows(rows)
        listed = ", ".join(f"{n} {code}" for code, n in sorted(failed.items()))
        raise CallErrorsError(f"calls failed ({listed}): the numbers above are not on answers")
    return rows


def closed_loop_medians(
    per: dict[str, list[dict[str, Any]]],
) -> tuple[dict[str, dict[str, float]], str]:
    """Per server, the medians of its closed-loop reps, and which reps completed no call
    (their latencies and CPU per call are NaN: left out of the medians, named here, and
    the goal row fails on them; a median over a NaN depended on where it stood).
    Example: ("...", "governor rep 2") when the governor's third rep got no answer."""
    med: dict[str, dict[str, float]] = {}
    empty = []
    for label, runs in per.items():
        bad = nan_runs(runs, ("p50_ms", "p99_ms", "server_cpu_us_per_call"))
        empty += [f"{label} rep {i}" for i in bad]
        kept = [r for i, r in enumerate(runs) if i not in bad]
        med[label] = {
            k: median(r[k] for r in kept) if kept else math.nan
            for k in runs[0]
            if k != "error_codes"
        }
    return med, ", ".join(empty)


class CallErrorsError(RuntimeError):
    """Measured calls failed other than by load shedding (the governor could not answer:
    the latencies would be of errors)."""


SHED_CODES = frozenset({"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "CANCELLED"})
"""Failures of an overloaded server or client (refused over the RPC limit, too slow, or
given up by the client: 1,000 calls/s on a loaded 2-core machine ended calls CANCELLED
after seconds of latency): measurements, reported in the rows; any other code (e.g.
UNAVAILABLE: no data for the model) means the governor could not answer."""


def failed_calls(rows: list[Row]) -> dict[str, int]:
    """Failed calls by gRPC status code, load shedding left out (`SHED_CODES`), over
    every measured run in `rows` (governor, ceiling, loop idle)."""
    runs: list[dict[str, Any]] = []
    for r in rows:
        for per_server in r.data.get("runs", {}).values():  # closed loops
            runs.extend(per_server)
        if "ceiling" in r.data and "rate_per_s" in r.data:  # open loops
            runs += [r.data, r.data["ceiling"], r.data["governor_loop_idle"]]
        elif "ratio" in r.data and "GetMetrics" in r.name:  # the others: counted above
            runs += [r.data["ticking"], r.data["idle"]]
    out: dict[str, int] = {}
    for run in runs:
        for code, n in run.get("error_codes", {}).items():
            if code not in SHED_CODES:
                out[code] = out.get(code, 0) + int(n)
    return out


if __name__ == "__main__":
    try:
        print_rows(main())
    except (NoTickDataError, CallErrorsError) as exc:
        raise SystemExit(f"bench_grpc: FAILED: {exc}") from None
