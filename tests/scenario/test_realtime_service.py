"""`governor run --simulated-fleet`: the whole service in real time on the embedded fleet.

A real `governor run` process (real gRPC, real APScheduler loop) against the simulated
fleet at 30x speed: KEDA's GetMetrics and the engine API come to report the governor's
decisions, and SIGTERM exits 0. Waits are bounded polls on observable state.
"""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
import pytest
import yaml

from controller.config import GovernorConfig
from controller.types import Decision, Knobs, Reason, Stage
from estimators.types import ModelQuery, Observation
from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from simulator.realtime import RealTimeSimulatedFleet
from simulator.traces import load_trace
from tests.service.harness import ServiceProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _config(path: Path) -> Path:
    cfg = {
        "models": [
            {
                "name": "demo",
                "deployment": "demo",
                "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50},
                "replicas": {"min_replicas": 1, "max_replicas": 12},
            }
        ],
        "policy": {"tick_interval_s": 0.5, "window_s": 60, "panic_window_s": 10},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_governor_run_on_the_simulated_fleet_serves_decisions(tmp_path: Path) -> None:
    svc = ServiceProcess(
        [
            "-m",
            "service.cli",
            "run",
            "--simulated-fleet",
            "synthetic:poisson:rate=60,duration=600",
            "--sim-speed",
            "30",
            "--config",
            str(_config(tmp_path / "c.yaml")),
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--shutdown-grace-s",
            "5",
        ],
        cwd=str(ROOT),
    )
    try:
        port = svc.port()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            keda = es_grpc.ExternalScalerStub(ch)
            ref = es.ScaledObjectRef(
                name="demo", namespace="default", scalerMetadata={"model": "demo"}
            )

            def replicas() -> float | None:
                try:
                    r = keda.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=2)
                except grpc.RpcError:
                    return None
                v = r.metricValues[0].metricValueFloat
                return v if v >= 3 else None  # 60 req/s needs several replicas

            want = wait_until(replicas, 60, "KEDA to report the governor's scale-up")
            assert 3 <= want <= 12
            engine = pb_grpc.BatchingServiceStub(ch)
            cfg = engine.GetBatchingConfig(pb.GetBatchingConfigRequest(model="demo"), timeout=2)
            assert cfg.max_num_seqs >= 8 and cfg.max_num_batched_tokens >= cfg.max_num_seqs
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(timeout=15) == 0
    finally:
        svc.kill()


def test_realtime_fleet_follows_the_clock_and_applies_decisions() -> None:
    """Simulated time = (clock - start) x speed; valid decisions resize the fleet and
    change knobs (rolled out), invalid ones change nothing."""
    t = [100.0]
    cfg = GovernorConfig.model_validate(
        {
            "models": [
                {
                    "name": "demo",
                    "deployment": "demo",
                    "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50},
                }
            ]
        }
    )
    trace = load_trace("synthetic:poisson:rate=20,duration=120", seed=1)
    rt = RealTimeSimulatedFleet(trace, cfg, speed=10.0, clock=lambda: t[0], start_replicas=2)
    t[0] = 106.0
    res = rt.observe([ModelQuery("demo"), ModelQuery("ghost")], t[0])
    assert rt.fleets["demo"].fleet.now_s == pytest.approx(60.0)
    assert isinstance(res["demo"], Observation) and res["demo"].arrival_rate_rps > 10
    assert not isinstance(res["ghost"], Observation)
    stage = (Stage("raw", 2, 4, Reason.CAPACITY),)
    k = Knobs(96, 2048)
    rt.apply([Decision("demo", 60.0, False, 9, k, stage, Reason.KNOBS_CHANGED)])
    assert rt.fleets["demo"].fleet.active_replicas == 2  # invalid: ignored
    rt.apply([Decision("demo", 60.0, True, 4, k, stage, Reason.KNOBS_CHANGED)])
    fleet = rt.fleets["demo"].fleet
    assert fleet.active_replicas == 4 and fleet.knobs == k and fleet.rollouts_started == 0
    k2 = Knobs(64, 1024)
    rt.apply([Decision("demo", 65.0, True, 4, k2, stage, Reason.KNOBS_CHANGED, rollout=True)])
    assert fleet.knobs == k2 and fleet.rollouts_started == 1
    # the trace loops: long after its span there is still traffic
    t[0] = 100.0 + 1000.0 / 10
    res = rt.observe([ModelQuery("demo")], t[0])
    assert isinstance(res["demo"], Observation) and res["demo"].arrival_rate_rps > 10
