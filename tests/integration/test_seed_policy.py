"""The source design's worked example end to end: a fake vLLM exporter with those values
-> a real Prometheus -> PrometheusSource -> the decider's `seed` policy -> the knobs an
engine reads over real gRPC (GetBatchingConfig).

The exporter's per-request distributions are built so the interpolated quantiles are the
example's inputs: prompt p95 512 tokens (463 of 488 prompts <= 500, 25 in (500, 1000]:
500 + 500 x (463.6 - 463) / 25 = 512), decode p95 380 ms (11 of 12 decodes <= 0.3 s,
1 in (0.3, 0.5]: 0.3 + 0.2 x (11.4 - 11) / 1 = 0.38 s), arrivals 10.25 req/s. With
`sla.e2e_p95_ms` 1,200: floor(1200 / 380) = 3 -> 512 x 4 = 2,048 tokens, and
min(256, int(1.8 x 10.25)) = 18 sequences.

The seed window is 300 s in production; here it is the test's 5 s rate window, because
Prometheus divides a rate by the whole window and this Prometheus holds seconds of data.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from controller.loop import SystemClock
from estimators.prometheus import PrometheusSource
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.core import ServiceCore
from service.run import WallClockSource
from service.store import MemoryStore
from tests.integration.conftest import B_E2E, B_ITL, B_QUEUE, B_TTFT, WINDOW_S
from tests.integration.fake_vllm import EngineSpec, FakeVllmCollector, ModelSpec, serve_registry
from tests.integration.promserver import SCRAPE_INTERVAL_S, PrometheusServer, wait_for
from tests.service.fakes import make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread

SEED = ModelSpec(
    name="seed-example",
    engines=(EngineSpec(running=4, waiting=0, kv_usage=0.3),),
    completions_per_batch=(("stop", 1.025),),  # x 10 batches/s = 10.25 req/s
    ttft_s=B_TTFT,
    itl_s=B_ITL,
    e2e_s=B_E2E,
    queue_s=B_QUEUE,
    prompt_tokens=(400.0,) * 463 + (600.0,) * 25,
    output_tokens=(100.0,) * 10,
    decode_s=(0.25,) * 11 + (0.45,),
)


@pytest.fixture(scope="module")
def seed_prometheus(prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    registry = CollectorRegistry()
    # Stamped: the worked example needs the rate to within 2 % (int(1.8 x 10.25) = 18
    # sequences), which a busy machine's scrape latency alone can spoil.
    registry.register(FakeVllmCollector((SEED,), batches_per_s=10.0, stamped=True))
    served = serve_registry(registry)
    prom = PrometheusServer(
        prometheus_bin, Path(tmp_path_factory.mktemp("seed")), {"vllm": [served.target]}
    )
    try:
        prom.start()

        def enough() -> bool:
            at_s = time.time() - WINDOW_S - 1.5 * SCRAPE_INTERVAL_S
            return bool(prom.query("vllm:num_requests_running", at_s=at_s))

        wait_for(enough, deadline_s=30.0, what="a full rate window of samples")
        yield prom.url
    finally:
        prom.stop()
        served.stop()


def test_seed_worked_example_through_prometheus_and_grpc(seed_prometheus: str) -> None:
    source = PrometheusSource(seed_prometheus, window_s=WINDOW_S, seed_window_s=WINDOW_S)
    cfg = make_config(
        model_entry(
            "seed-example",
            sla={"ttft_p95_ms": 1000, "itl_p95_ms": 50, "e2e_p95_ms": 1200},
            batching_policy="seed",
        ),
        knob_sustain_s=0,
    )
    core = ServiceCore(
        cfg, WallClockSource(source, SystemClock()), MemoryStore(), logger=quiet_logger()
    )
    core.tick()
    obs = core.loop.snapshot().models["seed-example"].observation
    assert obs.prompt_tokens_p95 == pytest.approx(512.0, abs=0.01)
    assert obs.decode_time_p95_ms == pytest.approx(380.0, abs=0.01)
    assert obs.arrival_rate_5m_rps == pytest.approx(10.25, rel=0.02)
    with ServerThread(core, logger=quiet_logger()) as srv:
        channel = grpc.insecure_channel(srv.address)
        got = pb_grpc.BatchingServiceStub(channel).GetBatchingConfig(
            pb.GetBatchingConfigRequest(model="seed-example"), timeout=5
        )
        channel.close()
    assert (got.max_num_batched_tokens, got.max_num_seqs) == (2048, 18)
    assert got.reason == "KNOBS_CHANGED"
