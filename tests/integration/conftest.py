"""Fixtures for the integration tests: a real Prometheus scraping fake vLLM exporters.

Owns the known fleet the tests observe (`MODELS`, `FLEET`) and the session fixture
`vllm_world` that serves them, starts Prometheus (1 s scrapes) and waits, by polling
with a deadline, until every model has more than a full rate window of samples.
A missing Prometheus binary FAILS the tests that need it, with instructions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.integration.fake_vllm import (
    EngineSpec,
    FakeVllmCollector,
    ModelSpec,
    ServedRegistry,
    serve_registry,
)
from tests.integration.promserver import (
    MISSING_BINARY,
    SCRAPE_INTERVAL_S,
    PrometheusServer,
    find_prometheus,
    wait_for,
)

BATCHES_PER_S = 10.0
"""Batches per engine per second in the fake exporters."""
WINDOW_S = 5.0
"""Rate window of the sources under test, seconds (short, so the suite is quick)."""

# Per-batch observation lists: the true distributions (seconds / tokens). Worked
# example, llama-a ITL: 100 gaps, cumulative 60 <= 25 ms, 90 <= 50 ms, 98 <= 75 ms; the
# 95th lies in (50, 75] ms: 50 + 25 * (95 - 90) / 8 = 65.625 ms (the true p95 is 60 ms).
A_TTFT = (0.03,) * 10 + (0.07,) * 6 + (0.2,) * 2 + (0.6,) * 2  # p95 625 ms, <=0.25 s: 0.9
A_ITL = (0.02,) * 60 + (0.04,) * 30 + (0.06,) * 8 + (0.09,) * 2  # p95 65.625 ms
A_E2E = (0.9,) * 50 + (1.8,) * 40 + (4.0,) * 8 + (12.0,) * 2  # p99 12.5 s
A_QUEUE = (0.1,) * 90 + (0.4,) * 10  # p95 400 ms
A_PROMPT = (150.0,) * 50 + (400.0,) * 45 + (1500.0,) * 5  # mean 330, p95 500
A_OUTPUT = (30.0,) * 80 + (300.0,) * 20  # mean 84, p95 425
# Per-request phases and TPOT (vLLM >= 0.9 / 0.11) and tokens per engine step.
A_DECODE = (0.4,) * 50 + (0.9,) * 40 + (1.8,) * 10  # mean 740 ms, p95 1.5 + 0.5 * 5/10
A_PREFILL = (0.05,) * 80 + (0.3,) * 20  # mean 100 ms
A_TPOT = (0.02,) * 50 + (0.04,) * 40 + (0.06,) * 10  # p95 62.5 ms, <= 0.05 s: 0.9
A_STEP_TOKENS = (64.0,) * 5 + (512.0,) * 5  # mean 288 tokens per step

B_TTFT = (0.015,) * 19 + (1.5,)  # p95 20 ms
B_ITL = (0.012,) * 50 + (0.03,) * 40 + (0.12,) * 10  # p95 125 ms, <=0.1 s: 0.9
B_E2E = (2.2,) * 99 + (30.0,)  # p99 2.5 s
B_QUEUE = (0.05,) * 100  # p95 285 ms (first bucket, interpolated from 0)
B_PROMPT = (800.0,) * 10 + (3000.0,) * 10  # mean 1900, p95 in +Inf bucket -> 2000
B_OUTPUT = (5.0,) * 19 + (900.0,)  # mean 49.75, p95 5
B_TPOT = (0.03,) * 19 + (0.2,)  # <= 0.1 s: 0.95

LEGACY_ITL = (0.03,) * 100  # p95 48.75 ms

MODEL_A = ModelSpec(
    name="llama-a",
    engines=(EngineSpec(running=3, waiting=1, kv_usage=0.25), EngineSpec(5, 0, 0.75)),
    completions_per_batch=(("stop", 1.5), ("length", 0.5)),  # 40 req/s over 2 engines
    ttft_s=A_TTFT,
    itl_s=A_ITL,
    e2e_s=A_E2E,
    queue_s=A_QUEUE,
    prompt_tokens=A_PROMPT,
    output_tokens=A_OUTPUT,
    decode_s=A_DECODE,
    prefill_s=A_PREFILL,
    tpot_s=A_TPOT,
    step_tokens=A_STEP_TOKENS,
    prefix_hits_per_batch=30,
    prefix_queries_per_batch=40,  # hit fraction 0.75
    preemptions_per_batch=0.1,  # 2 per second over 2 engines
)
MODEL_B = ModelSpec(
    name="qwen/qwen-b",  # a slash, as in real model names
    engines=(
        EngineSpec(running=4, waiting=2, kv_usage=0.1, waiting_growth_per_s=2.0),
        EngineSpec(4, 0, 0.2),
        EngineSpec(4, 0, 0.3),
    ),
    completions_per_batch=(("stop", 1.0),),  # 30 req/s; arrivals 30 + 2 (queue growth)
    ttft_s=B_TTFT,
    itl_s=B_ITL,
    e2e_s=B_E2E,
    queue_s=B_QUEUE,
    prompt_tokens=B_PROMPT,
    output_tokens=B_OUTPUT,
    tpot_s=B_TPOT,  # no decode/prefill/step histograms: those fields are None
    # no prefix-cache queries: the hit fraction is 0/0 = NaN in PromQL, i.e. no data
)
MODEL_DRAIN = ModelSpec(
    name="drain",
    engines=(EngineSpec(running=2, waiting=100_000, kv_usage=0.5, waiting_growth_per_s=-50),),
    completions_per_batch=(("stop", 1.0),),  # 10 req/s while the queue shrinks 50/s
    ttft_s=B_TTFT,
    itl_s=B_ITL,
    e2e_s=B_E2E,
    queue_s=B_QUEUE,
    prompt_tokens=B_PROMPT,
    output_tokens=B_OUTPUT,
)
MODEL_LEGACY = ModelSpec(
    name="legacy",
    engines=(EngineSpec(running=1, waiting=0, kv_usage=0.4),),
    completions_per_batch=(("stop", 1.0),),
    ttft_s=B_TTFT,
    itl_s=LEGACY_ITL,
    e2e_s=B_E2E,
    queue_s=B_QUEUE,
    prompt_tokens=B_PROMPT,
    output_tokens=B_OUTPUT,
    prefix_hits_per_batch=1,
    prefix_queries_per_batch=4,
    legacy_names=True,
)


def one_engine(name: str) -> ModelSpec:
    """Model `name` on one engine (3 running, none waiting, ITL histogram only): the
    exporter the dead-target and ingress tests start and stop on their own."""
    return ModelSpec(
        name=name,
        engines=(EngineSpec(running=3, waiting=0, kv_usage=0.4),),
        completions_per_batch=(("stop", 1.0),),
        ttft_s=A_TTFT,
        itl_s=A_ITL,
        e2e_s=A_E2E,
        queue_s=A_QUEUE,
        prompt_tokens=A_PROMPT,
        output_tokens=A_OUTPUT,
        itl_only=True,
    )


MODEL_ESCAPED = ModelSpec(
    name="escaped",
    engines=(EngineSpec(running=6, waiting=3, kv_usage=0.6),),
    completions_per_batch=(("stop", 1.0),),
    ttft_s=A_TTFT,
    itl_s=A_ITL,
    e2e_s=A_E2E,
    queue_s=A_QUEUE,
    prompt_tokens=A_PROMPT,
    output_tokens=A_OUTPUT,
    escaped_names=True,
)
MODEL_DUAL = ModelSpec(
    name="dual",
    engines=(EngineSpec(running=1, waiting=0, kv_usage=0.3),),
    completions_per_batch=(("stop", 1.0),),
    ttft_s=A_TTFT,
    itl_s=A_ITL,
    e2e_s=A_E2E,
    queue_s=A_QUEUE,
    prompt_tokens=A_PROMPT,
    output_tokens=A_OUTPUT,
    prefix_hits_per_batch=1,
    prefix_queries_per_batch=2,
    legacy_decoys=True,  # the same engine also exports the deprecated names, wrongly
)
MODEL_SHED = ModelSpec(
    name="shed",
    engines=(EngineSpec(running=4, waiting=200, kv_usage=0.9),),  # its queue at the limit
    completions_per_batch=(("stop", 1.0),),  # 10 req/s served
    rejections_per_batch=3.0,  # 30 req/s refused at the front end's queue limit
    ttft_s=B_TTFT,
    itl_s=B_ITL,
    e2e_s=B_E2E,
    queue_s=B_QUEUE,
    prompt_tokens=B_PROMPT,
    output_tokens=B_OUTPUT,
)
MODELS: tuple[ModelSpec, ...] = (
    MODEL_A,
    MODEL_B,
    MODEL_DRAIN,
    MODEL_SHED,
    MODEL_LEGACY,
    MODEL_ESCAPED,
    MODEL_DUAL,
)
FLEET: tuple[ModelSpec, ...] = tuple(
    ModelSpec(
        name=f"fleet-{i:02d}",
        engines=(EngineSpec(running=i % 7, waiting=0, kv_usage=0.5),),
        completions_per_batch=(("stop", 1.0),),
        ttft_s=A_TTFT,
        itl_s=A_ITL,
        e2e_s=A_E2E,
        queue_s=A_QUEUE,
        prompt_tokens=A_PROMPT,
        output_tokens=A_OUTPUT,
        itl_only=True,
    )
    for i in range(50)
)


@dataclass
class VllmWorld:
    """A running Prometheus scraping the `MODELS` exporter and the `FLEET` exporter."""

    prometheus: PrometheusServer
    window_s: float
    batches_per_s: float

    @property
    def url(self) -> str:
        """Prometheus base URL."""
        return self.prometheus.url


def _enough_samples(prom: PrometheusServer, models: set[str], window_s: float) -> bool:
    """True when every model has samples from before the start of a full rate window.

    Asked as "which models had a sample `window_s` + 1.5 scrapes ago": the series began
    when the exporter did, so that alone proves a long enough span, even if a scrape on
    a loaded machine was missed (counting samples would not).
    """
    at_s = time.time() - window_s - 1.5 * SCRAPE_INTERVAL_S
    rows = prom.query(
        "count by (model_name) (vllm:num_requests_running or vllm_num_requests_running)",
        at_s=at_s,
    )
    return models <= {r["metric"].get("model_name", "") for r in rows}


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    """The Prometheus binary; FAILS (not skips) when there is none."""
    binary = find_prometheus()
    if binary is None:
        pytest.fail(MISSING_BINARY, pytrace=False)
    return binary


@pytest.fixture(scope="session")
def vllm_world(
    prometheus_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmWorld]:
    """Exporters for `MODELS` and `FLEET`, and a Prometheus with enough data to query."""
    workdir: Path = tmp_path_factory.mktemp("prometheus")
    served: list[ServedRegistry] = []
    prom: PrometheusServer | None = None
    try:
        for specs in (MODELS, FLEET):
            registry = CollectorRegistry()
            registry.register(FakeVllmCollector(specs, batches_per_s=BATCHES_PER_S))
            served.append(serve_registry(registry))
        prom = PrometheusServer(
            prometheus_bin,
            workdir,
            {"vllm": [served[0].target], "fleet": [served[1].target]},
        )
        prom.start()
        names = {m.name for m in (*MODELS, *FLEET)}
        p = prom
        try:
            wait_for(
                lambda: _enough_samples(p, names, WINDOW_S),
                deadline_s=30.0,
                what="a full rate window of samples for every model",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nPrometheus log:\n{prom.log_tail()}") from None
        yield VllmWorld(prometheus=prom, window_s=WINDOW_S, batches_per_s=BATCHES_PER_S)
    finally:
        if prom is not None:
            prom.stop()
        for s in served:
            s.stop()
