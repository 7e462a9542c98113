"""Load: 1,000 concurrent WatchBatchingConfig streams held open while 64 clients send a
burst of 20,000 GetBatchingConfig calls, against a real service process
(tests/faults/serve_governor.py) ticking every 0.5 s.

What must hold: no errors (every call answered OK, every stream gets its first value
and the update after a knob change, none breaks during the burst); memory bounded (the
server's peak RSS, VmHWM from /proc, stays under 512 MiB, and a second burst does not
grow it by more than 32 MiB); the controller's ticks stay on time (every tick starts
within half an interval of its schedule: `governor_tick_lateness_seconds`, and the tick
count matches the elapsed time). The clients run on grpc.aio in this process."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from tests.faults.helpers import vm_hwm_kib, vm_rss_kib
from tests.service.harness import ServiceProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 1000
CALLS = 20_000
CLIENTS = 64
STREAM_CHANNELS = 16
TICK_S = 0.5
TOKEN = "load-test-admin-token-31415926535"
MAX_HWM_MIB = 512
MAX_GROWTH_MIB = 32


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"{{le={s.labels['le']}}}" if "le" in s.labels else "")
            out[key] = s.value
    return out


async def _burst(address: str, calls: int, clients: int) -> tuple[int, list[float]]:
    """`calls` GetBatchingConfig calls from `clients` channels; (errors, latencies s)."""
    errors = 0
    latencies: list[float] = []
    per = [calls // clients + (1 if i < calls % clients else 0) for i in range(clients)]

    async def client(n: int) -> None:
        nonlocal errors
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.BatchingServiceStub(channel)
            req = pb.GetBatchingConfigRequest(model="demo", engine_id=f"engine-{n}")
            for _ in range(n):
                started = time.perf_counter()
                try:
                    resp = await stub.GetBatchingConfig(req, timeout=30)
                    if resp.max_num_seqs <= 0:
                        errors += 1
                except grpc.RpcError:
                    errors += 1
                latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(client(n) for n in per))
    return errors, latencies


async def _scenario(address: str, pid: int, metrics_port: int) -> dict[str, Any]:
    channels = [grpc.aio.insecure_channel(address) for _ in range(STREAM_CHANNELS)]
    received: list[list[int]] = [[] for _ in range(STREAMS)]
    failures: list[str] = []

    async def watch(i: int) -> None:
        stub = pb_grpc.BatchingServiceStub(channels[i % STREAM_CHANNELS])
        # No deadline: the streams stay open until the scenario cancels them at its end
        # (every wait in it has its own deadline). A fixed one (300 s) ended all 1,000
        # streams with DEADLINE_EXCEEDED when a loaded machine stretched the scenario
        # past it (burners at nice 10: 403 s).
        call = stub.WatchBatchingConfig(
            pb.GetBatchingConfigRequest(model="demo", engine_id=f"w{i}")
        )
        try:
            async for msg in call:
                received[i].append(msg.generation)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
                failures.append(f"stream {i}: {exc.code()}")  # type: ignore[attr-defined]

    rss_idle = vm_rss_kib(pid)
    tasks = [asyncio.create_task(watch(i)) for i in range(STREAMS)]

    async def until(pred: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    await until(lambda: all(received), 60, "every stream's first value")
    opened = _metrics(metrics_port)["governor_watch_streams"]
    rss_streams = vm_rss_kib(pid)
    # a knob change reaches every stream
    async with grpc.aio.insecure_channel(address) as channel:
        admin = pb_grpc.AdminServiceStub(channel)
        md = (("authorization", f"Bearer {TOKEN}"),)
        got = await admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=10, metadata=md)
        got.target.sla.itl_p95_ms = 15
        await admin.SetTarget(pb.SetTargetRequest(target=got.target), timeout=10, metadata=md)
    await until(lambda: all(len(r) >= 2 for r in received), 30, "the update on every stream")
    m0 = _metrics(metrics_port)
    t0 = time.monotonic()
    errors, latencies = await _burst(address, CALLS, CLIENTS)
    burst_s = time.monotonic() - t0
    rss_burst1 = vm_rss_kib(pid)
    errors2, _ = await _burst(address, CALLS, CLIENTS)  # the same again: a leak would grow
    rss_burst2 = vm_rss_kib(pid)
    m1 = _metrics(metrics_port)
    elapsed = time.monotonic() - t0
    broken = [t for t in tasks if t.done()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels:
        await ch.close()
    latencies.sort()
    return {
        "opened": opened,
        "failures": failures,
        "broken": len(broken),
        "updated": sum(1 for r in received if len(r) >= 2 and r[-1] > r[0]),
        "errors": errors + errors2,
        "burst_s": burst_s,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "rss_idle_mib": rss_idle / 1024,
        "rss_streams_mib": rss_streams / 1024,
        "rss_burst1_mib": rss_burst1 / 1024,
        "rss_burst2_mib": rss_burst2 / 1024,
        "ticks": m1["governor_ticks_total"] - m0["governor_ticks_total"],
        "late_count": m1["governor_tick_lateness_seconds_count"]
        - m0["governor_tick_lateness_seconds_count"],
        "late_ok": m1["governor_tick_lateness_seconds_bucket{le=0.25}"]
        - m0["governor_tick_lateness_seconds_bucket{le=0.25}"],
        "elapsed_s": elapsed,
    }


@pytest.mark.fault_case(
    "Load",
    "1,000 concurrent WatchBatchingConfig streams + 2 bursts of 20,000 GetBatchingConfig "
    "calls from 64 clients",
    "0 errors (every call OK, every stream gets its first value and the knob update, none "
    "breaks); server VmHWM < 512 MiB and the second burst grows RSS < 32 MiB; >= 95 % of "
    "ticks start within half an interval of schedule and the tick count matches the time",
)
def test_streams_and_burst(tmp_path: Path, fault_note: Any) -> None:
    (tmp_path / "token").write_text(TOKEN)
    config = {
        "models": [
            {
                "name": "demo",
                "deployment": "demo",
                "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 50},
                "replicas": {"min_replicas": 1, "max_replicas": 40},
            }
        ],
        "policy": {"tick_interval_s": TICK_S, "knob_sustain_s": 0},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "rates.json").write_text(json.dumps({"demo": 20.0}))
    svc = ServiceProcess(
        [
            "-m", "tests.faults.serve_governor",
            "--config", str(tmp_path / "config.yaml"),
            "--state-file", str(tmp_path / "state.json"),
            "--rates-file", str(tmp_path / "rates.json"),
            "--admin-token-file", str(tmp_path / "token"),
        ],
        cwd=str(ROOT),
    )  # fmt: skip
    try:
        port, metrics_port = svc.ports()
        r = asyncio.run(_scenario(f"127.0.0.1:{port}", svc.proc.pid, int(metrics_port)))
        hwm_mib = vm_hwm_kib(svc.proc.pid) / 1024
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(30) == 0
    finally:
        svc.kill()
    assert r["opened"] == STREAMS
    assert r["failures"] == [] and r["broken"] == 0
    assert r["updated"] == STREAMS
    assert r["errors"] == 0
    assert hwm_mib < MAX_HWM_MIB, hwm_mib
    assert r["rss_burst2_mib"] - r["rss_burst1_mib"] < MAX_GROWTH_MIB, r
    # On time = started within half an interval (250 ms) of schedule. A 2-core machine
    # shared with other work can delay a tick or two of 80 (seen in CI-like runs): the
    # bound is 95 %, and the note reports the measured share.
    assert r["late_count"] > 0 and r["late_ok"] >= 0.95 * r["late_count"], r
    expected = r["elapsed_s"] / TICK_S
    assert r["ticks"] >= 0.8 * expected - 1, (r["ticks"], expected)
    fault_note(
        f"{STREAMS} streams (all updated), {2 * CALLS} calls from {CLIENTS} clients, "
        f"0 errors; burst {r['burst_s']:.1f} s ({CALLS / r['burst_s']:.0f} calls/s, "
        f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms); server VmHWM "
        f"{hwm_mib:.0f} MiB (RSS idle {r['rss_idle_mib']:.0f}, with streams "
        f"{r['rss_streams_mib']:.0f}, after bursts {r['rss_burst1_mib']:.0f} / "
        f"{r['rss_burst2_mib']:.0f}); {r['ticks']:.0f} ticks in {r['elapsed_s']:.1f} s, "
        f"{r['late_ok']:.0f} of {r['late_count']:.0f} within 250 ms of schedule"
    )
