"""Memory: resident set of `governor run` at N models with M open watch streams.

Set-up: the fake Prometheus answering the recording for `--models` models, `governor
run` for them (memory store, 5 s ticks, JSON logs drained), and, from this process, `--streams`
WatchBatchingConfig streams (one per model, round-robin when fewer models) over 8 HTTP/2
channels, as engines would hold them. Measured from /proc of the governor: resident
set (VmRSS, MB) after its first ticks without streams, then with every stream open and
answered and `--ticks` more ticks run (each tick wakes every watcher), and the peak
(VmHWM). Medians of `--samples` readings taken 1 s apart. `governor run` serves from a
process of its own (service/serving.py): the goal is judged on the memory of its
processes with the file pages they share (the interpreter, the libraries) counted once,
what a container holding them is charged; the RSS sum (shared pages counted in each, an
upper bound), each process's RSS and the PSS are reported beside it.

Goal (issue 7): <= 200 MB at 1,000 models with 1,000 open watch streams.
Run: `.venv/bin/python -m benchmarks.bench_memory [--models 1000 --streams 1000]`.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from benchmarks.bench_grpc import scrape, wait_ticks
from benchmarks.common import Row, bench_args, median, print_rows, write_rows
from benchmarks.procs import (
    Child,
    NoTickDataError,
    fake_prometheus,
    governor_run,
    write_governor_config,
)
from benchmarks.promreplay import model_names
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.listeners import MAX_WATCH_STREAMS

GOAL_MB = 200.0
CHANNELS = 8


def _rss(gov: Child, samples: int) -> tuple[float, float]:
    cur = []
    peak = 0.0
    for _ in range(samples):
        c, p = gov.rss_mb()
        cur.append(c)
        peak = max(peak, p)
        time.sleep(1.0)
    return median(cur), peak


async def _with_streams(
    gov: Child, names: list[str], n_streams: int, ticks: int, samples: int
) -> dict[str, Any]:
    address = f"127.0.0.1:{gov.ports[0]}"
    channels = [grpc.aio.insecure_channel(address) for _ in range(CHANNELS)]
    first = asyncio.Event()
    answered = 0
    received = 0
    errors: list[str] = []

    async def watch(i: int) -> None:
        nonlocal answered, received
        stub = pb_grpc.BatchingServiceStub(channels[i % CHANNELS])
        req = pb.GetBatchingConfigRequest(model=names[i % len(names)], engine_id=f"e{i}")
        got = False
        try:
            async for _ in stub.WatchBatchingConfig(req):
                received += 1
                if not got:
                    got = True
                    answered += 1
                    if answered == n_streams:
                        first.set()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                errors.append(f"{exc.code().name}: {exc.details()}")
                first.set()

    tasks = [asyncio.create_task(watch(i)) for i in range(n_streams)]
    try:
        await asyncio.wait_for(first.wait(), 120)
        if errors:
            raise RuntimeError(f"{len(errors)} streams failed, e.g. {errors[0]}")
        start = scrape(gov.ports[1])["governor_ticks_total"]
        while scrape(gov.ports[1])["governor_ticks_total"] < start + ticks:
            await asyncio.sleep(0.5)
        rss, peak = await asyncio.to_thread(_rss, gov, samples)
        return {
            "streams_open": answered,
            "messages_received": received,
            "rss_mb": rss,
            "peak_mb": peak,
            "rss_by_process_mb": {str(k): v for k, v in gov.rss_by_process().items()},
            "pss_mb": gov.pss_mb(),
            "unique_mb": gov.unique_mb(),
        }
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            await ch.close()


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--ticks", type=int, default=2)
    ap.add_argument("--samples", type=int, default=3)
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.streams, args.ticks, args.samples = 10, 10, 1, 1
    names = model_names(args.models)
    tmp = tempfile.TemporaryDirectory()
    prom, url = fake_prometheus(write_governor_config(Path(tmp.name) / "fake.yaml", names))
    gov = None
    try:
        # Every stream from this one host, standing in for the engines of many hosts.
        one_host = ["--max-watch-streams-per-client", str(MAX_WATCH_STREAMS)]
        gov = governor_run(write_governor_config(Path(tmp.name) / "g.yaml", names, url), one_host)
        gov.port()
        wait_ticks(gov, gov.ports[1], 2)
        base_rss, _ = _rss(gov, args.samples)
        print(f"{args.models} models, no streams: RSS {base_rss:.1f} MB", flush=True)
        res = asyncio.run(_with_streams(gov, names, args.streams, args.ticks, args.samples))
        split = ", ".join(
            f"pid {pid}: {cur:.1f} MB (peak {peak:.1f})"
            for pid, (cur, peak) in res["rss_by_process_mb"].items()
        )
        print(
            f"{args.models} models, {res['streams_open']} streams: RSS {res['rss_mb']:.1f} MB "
            f"(peak {res['peak_mb']:.1f} MB; {split}; PSS {res['pss_mb']:.1f} MB; "
            f"shared files once "
            f"{res['unique_mb']:.1f} MB), "
            f"{res['messages_received']} messages",
            flush=True,
        )
    finally:
        if gov is not None:
            gov.stop()
        prom.stop()
        tmp.cleanup()
    data = {"models": args.models, "rss_no_streams_mb": base_rss, **res}
    split = " + ".join(f"{cur:.0f}" for cur, _ in res["rss_by_process_mb"].values())
    per_stream_kb = (res["rss_mb"] - base_rss) / max(1, res["streams_open"]) * 1000
    rows = [
        Row(
            "4 memory",
            f"governor run memory, {args.models:,} models + {res['streams_open']:,} watch streams",
            f"{res['unique_mb']:.0f} MB with shared file pages once (RSS sum "
            f"{res['rss_mb']:.0f}, peak {res['peak_mb']:.0f}: {split}; PSS "
            f"{res['pss_mb']:.0f}; RSS sum {base_rss:.0f} MB without streams, "
            f"{per_stream_kb:.0f} kB/stream)",
            f"<= {GOAL_MB:g} MB",
            res["unique_mb"] <= GOAL_MB,
            data,
        )
    ]
    write_rows(args.json, "memory", rows, data)
    return rows


if __name__ == "__main__":
    try:
        print_rows(main())
    except NoTickDataError as exc:
        raise SystemExit(f"bench_memory: FAILED: {exc}") from None
