"""Prometheus faults, end to end: fake vLLM exporters -> a real Prometheus -> a fault
proxy -> PrometheusSource (through `WallClockSource`, as `governor run` wires it) ->
ServiceCore -> the gRPC server (status, KEDA) and /metrics.

Cases: Prometheus SIGKILLed for 24 ticks (2 minutes of loop time) and restarted on the
same port and TSDB; answering slower than the query timeout; answering garbage; NaN
values; empty vectors; only some models. What must hold, for every affected model:

- no scale-down on missing data: every decision, and KEDA's metric, stays at or above
  the replicas before the fault;
- the fallback rule: NO_DATA_HOLD (no decision) for the first ticks, then after
  `no_data_ticks_before_fallback` ticks NO_DATA_FALLBACK re-asserts the last good
  count, or the configured `fallback_replicas` when higher;
- status says stale (GetStatus: no observation, with the reason) and so do the
  metrics (`governor_model_stale{model} 1` on /metrics);
- decisions resume from data within two ticks once Prometheus answers again.

The loop's monotonic clock is advanced by the test (5 s ticks); Prometheus is queried
at real wall time. Waits on the real Prometheus are bounded polls."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from prometheus_client import CollectorRegistry

from controller.config import GovernorConfig
from controller.types import Decision
from estimators.prometheus import PrometheusSource
from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.core import ServiceCore
from service.run import WallClockSource
from service.store import MemoryStore
from tests.faults.helpers import RealWallFakeMono
from tests.faults.promfaults import FaultProxy, RestartablePrometheus, data_ready
from tests.integration.conftest import A_E2E, A_ITL, A_OUTPUT, A_PROMPT, A_QUEUE, A_TTFT
from tests.integration.fake_vllm import EngineSpec, FakeVllmCollector, ModelSpec, serve_registry
from tests.integration.promserver import MISSING_BINARY, find_prometheus, wait_for
from tests.service.fakes import quiet_logger
from tests.service.harness import ServerThread, ServiceProcess

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

WINDOW_S = 5.0
TICK_S = 5.0
TIMEOUT_S = 1.0
FALLBACK_TICKS = 3
ALPHA, BETA = "alpha", "beta"
ALPHA_FALLBACK = 24


def _spec(name: str, completions: float) -> ModelSpec:
    return ModelSpec(
        name=name,
        engines=(EngineSpec(running=6, waiting=0, kv_usage=0.4), EngineSpec(6, 0, 0.5)),
        completions_per_batch=(("stop", completions),),
        ttft_s=A_TTFT,
        itl_s=A_ITL,
        e2e_s=A_E2E,
        queue_s=A_QUEUE,
        prompt_tokens=A_PROMPT,
        output_tokens=A_OUTPUT,
    )


@dataclass
class World:
    prom: RestartablePrometheus
    proxy: FaultProxy


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    binary = find_prometheus()
    if binary is None:
        pytest.fail(MISSING_BINARY, pytrace=False)
    registry = CollectorRegistry()
    # 10 batches/s x 2 engines: alpha 400 req/s, beta 160 req/s
    specs = (_spec(ALPHA, 20.0), _spec(BETA, 8.0))
    registry.register(FakeVllmCollector(specs, batches_per_s=10.0))
    served = serve_registry(registry)
    prom = RestartablePrometheus(binary, tmp_path_factory.mktemp("prom"), {"vllm": [served.target]})
    proxy: FaultProxy | None = None
    try:
        prom.start()
        wait_for(lambda: data_ready(prom, {ALPHA, BETA}, WINDOW_S), 40, "a rate window of data")
        proxy = FaultProxy(prom.url)
        yield World(prom, proxy)
    finally:
        if proxy is not None:
            proxy.stop()
        prom.stop()
        served.stop()


def _config() -> GovernorConfig:
    def model(name: str, **extra: Any) -> dict[str, Any]:
        return {
            "name": name,
            "deployment": name,
            "sla": {"ttft_p95_ms": 2000, "itl_p95_ms": 100},
            "replicas": {"min_replicas": 1, "max_replicas": 40},
            **extra,
        }

    return GovernorConfig.model_validate(
        {
            "models": [model(ALPHA, fallback_replicas=ALPHA_FALLBACK), model(BETA)],
            "policy": {
                "tick_interval_s": TICK_S,
                "window_s": WINDOW_S,
                "panic_window_s": WINDOW_S,
                "no_data_ticks_before_fallback": FALLBACK_TICKS,
                "cooldown_after_scale_up_s": 0,
                "knob_sustain_s": 0,
            },
            "prometheus": {"scrape_interval_s": 1.0},  # the test server scrapes every second
        }
    )


class Governor:
    """A served ServiceCore on the proxy, ticked by the test."""

    def __init__(self, proxy_url: str) -> None:
        self.clock = RealWallFakeMono()
        source = WallClockSource(
            PrometheusSource(
                proxy_url, window_s=WINDOW_S, timeout_s=TIMEOUT_S, short_window_s=WINDOW_S
            ),
            self.clock,
        )
        log = quiet_logger()
        self.core = ServiceCore(_config(), source, MemoryStore(), clock=self.clock, logger=log)
        self.thread = ServerThread(self.core, logger=log, metrics_listen="127.0.0.1:0")
        self.durations: list[float] = []

    def __enter__(self) -> Governor:
        self.thread.__enter__()
        self.channel = grpc.insecure_channel(self.thread.address)
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        self.thread.stop()

    def tick(self) -> dict[str, Decision]:
        started = time.monotonic()
        decisions = self.core.tick(self.clock.advance(TICK_S))
        self.durations.append(time.monotonic() - started)
        return {d.model: d for d in decisions}

    def status(self) -> dict[str, Any]:
        stub = pb_grpc.AdminServiceStub(self.channel)
        resp = stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        return {m.model: m for m in resp.models}

    def stale_metric(self, model: str) -> float:
        url = f"http://127.0.0.1:{self.thread.server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith(f'governor_model_stale{{model="{model}"}}'):
                return float(line.split()[-1])
        raise AssertionError(f"no governor_model_stale for {model}")

    def keda_replicas(self, model: str) -> int:
        stub = es_grpc.ExternalScalerStub(self.channel)
        ref = es.ScaledObjectRef(scalerMetadata={"model": model})
        resp = stub.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=5)
        return resp.metricValues[0].metricValue


def _from_data(d: Decision) -> bool:
    return d.valid and d.demand_rps is not None and not d.stages[0].reason.startswith("NO_DATA")


def _warm_up(gov: Governor) -> dict[str, int]:
    """Tick until both models decide from data and the replicas are steady."""
    last: dict[str, Decision] = {}
    for _ in range(12):
        last = gov.tick()
        if all(_from_data(d) for d in last.values()) and len(gov.durations) >= 4:
            break
    assert all(_from_data(d) for d in last.values()), {m: d.detail for m, d in last.items()}
    before = {m: d.replicas for m, d in last.items()}
    assert before[ALPHA] >= 3 and before[BETA] >= 2, before  # a scale-down would show
    assert before[ALPHA] < ALPHA_FALLBACK
    return before


def _check_fault_ticks(
    gov: Governor, before: dict[str, int], affected: set[str], ticks: int
) -> list[dict[str, Decision]]:
    history = [gov.tick() for _ in range(ticks)]
    for i, decisions in enumerate(history, start=1):
        for m, d in decisions.items():
            assert d.replicas >= before[m], f"tick {i}: {m} scaled down to {d.replicas}"
            if m not in affected:
                assert _from_data(d), f"tick {i}: unaffected {m} lost data: {d.detail}"
                continue
            reason = d.stages[0].reason
            if i < FALLBACK_TICKS:
                assert reason == "NO_DATA_HOLD" and not d.valid, (i, m, reason)
                assert d.replicas == before[m]
            else:
                assert reason == "NO_DATA_FALLBACK" and d.valid, (i, m, reason)
                want = max(before[m], ALPHA_FALLBACK) if m == ALPHA else before[m]
                assert d.replicas == want, (i, m, d.replicas, want)
    status = gov.status()
    for m in affected:
        obs = status[m].observation
        assert not obs.present and obs.no_data, (m, obs)
        assert gov.stale_metric(m) == 1.0
        assert gov.keda_replicas(m) >= before[m]
    for m in set(before) - affected:
        assert status[m].observation.present
        assert gov.stale_metric(m) == 0.0
    return history


def _check_recovery(gov: Governor, affected: set[str]) -> int:
    """Ticks after recovery until every affected model decides from data (<= 2)."""
    for n in (1, 2):
        decisions = gov.tick()
        if all(_from_data(decisions[m]) for m in affected):
            for m in affected:
                assert gov.stale_metric(m) == 0.0
                assert gov.status()[m].observation.present
            return n
    raise AssertionError(
        f"no decision from data within 2 ticks: { {m: decisions[m].detail for m in affected} }"
    )


CASES = {
    "slow": ("answering slower than the query timeout (2 s vs 1 s)", {"mode": "slow"}),
    "garbage": ("answering garbage (HTTP 200, an HTML body)", {"mode": "garbage"}),
    "nan": ("every sample NaN", {"mode": "nan"}),
    "empty": ("empty vectors", {"mode": "empty"}),
    "partial": ("only some models (beta's series missing)", {"mode": "drop", "hidden": {BETA}}),
}


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.fault_case(
    "Prometheus",
    "slow (past the query timeout) / garbage / NaN / empty vectors / only some models",
    "8 ticks of the fault: no scale-down (decisions and KEDA >= before), NO_DATA_HOLD then "
    "NO_DATA_FALLBACK after 3 ticks (alpha raised to its fallback 24, beta kept), GetStatus "
    "and governor_model_stale say stale, other models unaffected; ticks bounded by the "
    "timeout; decisions from data within 2 ticks of recovery",
)
def test_bad_answers(world: World, kind: str, fault_note: Any) -> None:
    setup = CASES[kind][1]
    affected = {BETA} if kind == "partial" else {ALPHA, BETA}
    world.proxy.set("pass")
    with Governor(world.proxy.url) as gov:
        before = _warm_up(gov)
        world.proxy.set(setup["mode"], hidden=setup.get("hidden"), delay_s=2 * TIMEOUT_S)
        n_before = len(gov.durations)
        _check_fault_ticks(gov, before, affected, ticks=8)
        worst = max(gov.durations[n_before:])
        assert worst < 3 * TIMEOUT_S + 1.0, f"a tick took {worst:.2f}s"
        world.proxy.set("pass")
        resumed = _check_recovery(gov, affected)
    fault_note(f"{kind}: before {before}, slowest fault tick {worst:.2f} s, resumed in {resumed}")


@pytest.mark.fault_case(
    "Prometheus",
    "killed (SIGKILL) mid-run, restarted 2 minutes later (24 ticks of loop time)",
    "no scale-down during the outage; NO_DATA_HOLD then NO_DATA_FALLBACK (alpha to its "
    "fallback, beta kept); status and governor_model_stale say stale; KEDA keeps serving "
    "the held values; after the restart (same port and TSDB) decisions from data within "
    "2 ticks of Prometheus answering again",
)
def test_killed_and_restarted(world: World, fault_note: Any) -> None:
    world.proxy.set("pass")
    with Governor(world.proxy.url) as gov:
        before = _warm_up(gov)
        killed_at = time.monotonic()
        world.prom.kill()
        _check_fault_ticks(gov, before, {ALPHA, BETA}, ticks=24)  # 24 x 5 s = 2 min
        world.prom.restart()
        wait_for(lambda: data_ready(world.prom, {ALPHA, BETA}, WINDOW_S), 60, "data again")
        outage = time.monotonic() - killed_at
        resumed = _check_recovery(gov, {ALPHA, BETA})
    fault_note(
        f"24 ticks (120 s loop time, {outage:.1f} s real) down; before {before}; "
        f"resumed in {resumed} tick(s) after Prometheus answered again"
    )


@pytest.mark.fault_case(
    "Prometheus",
    "`governor run` itself against the real Prometheus (then Prometheus killed)",
    "the entry point's source queries Prometheus at wall time (it used to pass the loop's "
    "monotonic clock, i.e. a time in 1970, and never saw data): decisions from data within "
    "20 s; after a SIGKILL of Prometheus, KEDA keeps the held value and status says no "
    "data; Prometheus is restarted for the cases after",
)
def test_governor_run_reads_prometheus_at_wall_time(
    world: World, tmp_path: Path, fault_note: Any
) -> None:
    cfg = _config().model_dump(mode="json", exclude_defaults=True)
    cfg["prometheus"] = {"url": world.prom.url, "timeout_s": TIMEOUT_S, "scrape_interval_s": 1.0}
    cfg["policy"]["tick_interval_s"] = 0.5
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    root = Path(__file__).resolve().parents[2]
    svc = ServiceProcess(
        ["-m", "service.cli", "run", "--config", str(tmp_path / "config.yaml"),
         "--store", "memory", "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--insecure-admin"],
        cwd=str(root),
    )  # fmt: skip
    try:
        with grpc.insecure_channel(f"127.0.0.1:{svc.port()}") as channel:
            keda = es_grpc.ExternalScalerStub(channel)
            admin = pb_grpc.AdminServiceStub(channel)

            def replicas() -> int | None:
                ref = es.ScaledObjectRef(scalerMetadata={"model": ALPHA})
                try:
                    resp = keda.GetMetrics(es.GetMetricsRequest(scaledObjectRef=ref), timeout=5)
                except grpc.RpcError:
                    return None  # UNAVAILABLE until a decision from data
                return resp.metricValues[0].metricValue

            started = time.monotonic()
            wait_for(lambda: replicas() is not None, 20, "a decision from Prometheus data")
            took = time.monotonic() - started
            status = admin.GetStatus(pb.GetStatusRequest(models=[ALPHA]), timeout=5).models[0]
            assert status.observation.present and status.observation.arrival_rate_rps > 100
            held = replicas()
            world.prom.kill()
            try:
                wait_for(
                    lambda: (
                        not admin.GetStatus(pb.GetStatusRequest(models=[ALPHA]), timeout=5)
                        .models[0]
                        .observation.present
                    ),
                    20,
                    "status to say no data",
                )
                assert (replicas() or 0) >= (held or 0)
            finally:
                world.prom.restart()
                wait_for(lambda: data_ready(world.prom, {ALPHA, BETA}, WINDOW_S), 60, "data")
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(15) == 0
    finally:
        svc.kill()
    fault_note(f"first decision from data {took:.1f} s after start; held {held} without data")
