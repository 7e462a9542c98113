"""A deterministic vLLM-like metrics exporter for the Prometheus integration tests.

Owns: `ModelSpec`/`EngineSpec` (what each fake engine emits), `FakeVllmCollector` (a
prometheus_client collector on a fresh registry) and `serve_registry` (a tiny HTTP
server for it), plus the expected values the tests compare against.

Every counter grows linearly with time: at `t` seconds after start each engine has
seen `n(t) = t * batches_per_s` batches, each batch holding the model's fixed list of
observations. Counts are fractional on purpose: the per-second rates are then exact
(no step noise), and every bucket of a histogram is proportional to the same `n`, so
`rate(bucket)/rate(count)` equals the per-batch fraction exactly and the interpolated
quantiles are known in advance. Gauges are constant, or linear in time where a spec
says so (waiting growth, for the arrival-rate test).

Exposition is always the classic text format 0.0.4, whatever the scraper asks for:
prometheus_client 0.26's OpenMetrics output rewrites `vllm:` to `vllm_` in sample
names, which would change what Prometheus stores; a spec with `escaped_names=True`
produces those names deliberately instead.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from estimators.histogram import (
    E2E_BUCKETS_S,
    ITL_BUCKETS_S,
    PHASE_BUCKETS_S,
    QUEUE_BUCKETS_S,
    TPOT_BUCKETS_S,
    TTFT_BUCKETS_S,
    histogram_quantile,
    token_buckets,
)

MAX_MODEL_LEN = 4096
DECOY_ITL_S: tuple[float, ...] = (5.0,) * 10
DECOY_KV_USAGE = 0.99
TOKEN_BUCKETS: tuple[float, ...] = token_buckets(MAX_MODEL_LEN)
STEP_TOKEN_BUCKETS: tuple[float, ...] = token_buckets(16384)
"""`vllm:iteration_tokens_total`: 1-2-5 buckets up to max_num_batched_tokens (16,384)."""


@dataclass(frozen=True)
class EngineSpec:
    """One engine's gauges: requests running/waiting, KV usage fraction (1 = full).

    `waiting_growth_per_s`: waiting(t) = max(0, waiting + growth * t), requests.
    """

    running: float
    waiting: float
    kv_usage: float
    waiting_growth_per_s: float = 0.0


@dataclass(frozen=True)
class ModelSpec:
    """One model: its engines and the observations each engine makes per batch.

    Latencies in seconds, lengths in tokens; `*_per_batch` counters per engine.
    """

    name: str
    engines: tuple[EngineSpec, ...]
    completions_per_batch: tuple[tuple[str, float], ...]  # (finished_reason, count)
    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    queue_s: tuple[float, ...]
    prompt_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    decode_s: tuple[float, ...] = ()
    """Per-request decode times (`vllm:request_decode_time_seconds`); () = not exported."""
    prefill_s: tuple[float, ...] = ()
    """Per-request prefill times (`vllm:request_prefill_time_seconds`); () = not exported."""
    tpot_s: tuple[float, ...] = ()
    """Per-request TPOT (`vllm:request_time_per_output_token_seconds`); () = not exported."""
    step_tokens: tuple[float, ...] = ()
    """Tokens per engine step (`vllm:iteration_tokens_total`); () = not exported."""
    prefix_hits_per_batch: float = 0.0
    prefix_queries_per_batch: float = 0.0
    preemptions_per_batch: float = 0.0
    rejections_per_batch: float = 0.0
    """Requests the front end refused at its queue limit per batch, for the model
    (`vllm:admission_rejections_total{reason}`, no engine label); 0 = not exported."""
    legacy_names: bool = False
    """Export only the deprecated names (gpu_cache_usage_perc, time_per_output_token...)."""
    escaped_names: bool = False
    """Export `vllm_...` instead of `vllm:...` (what an OpenMetrics scrape stores)."""
    itl_only: bool = False
    """Of the histograms export only ITL: a cheap scrape for the 50-model fleet."""
    legacy_decoys: bool = False
    """Also export the deprecated names, with wrong values (`DECOY_*`), from the same
    engines: a correct query takes the current series per engine and never adds both."""

    def completions_rps(self, batches_per_s: float) -> float:
        """Completed requests per second over all engines."""
        per_batch = sum(c for _, c in self.completions_per_batch)
        return per_batch * batches_per_s * len(self.engines)

    def waiting_growth_rps(self) -> float:
        """Growth of the waiting queue over all engines, requests per second."""
        return sum(e.waiting_growth_per_s for e in self.engines)


def cumulative(values: Sequence[float], bounds: Sequence[float]) -> list[tuple[float, float]]:
    """Cumulative (bound, count) buckets of `values`, with the +Inf bucket last."""
    out = [(b, float(sum(1 for v in values if v <= b))) for b in bounds]
    out.append((math.inf, float(len(values))))
    return out


def bucket_quantile(q: float, values: Sequence[float], bounds: Sequence[float]) -> float:
    """PromQL-style interpolated q-quantile of `values` bucketed by `bounds`."""
    result = histogram_quantile(q, cumulative(values, bounds))
    assert result is not None
    return result


def true_quantile(q: float, values: Sequence[float]) -> float:
    """Nearest-rank q-quantile of the raw `values` (the truth buckets approximate)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def bucket_of(x: float, bounds: Sequence[float]) -> tuple[float, float]:
    """The (lower, upper] bucket of `bounds` that holds `x`."""
    lower = 0.0
    for b in bounds:
        if x <= b:
            return lower, b
        lower = b
    return lower, math.inf


@dataclass(frozen=True)
class _Series:
    """One exported series: value(t) = base + per_s * elapsed (gauges) or per_batch * n
    (counters), or cumulative buckets and sum per batch times n (histograms)."""

    kind: str  # "gauge", "counter" or "histogram"
    name: str
    label_names: tuple[str, ...]
    label_values: tuple[str, ...]
    base: float = 0.0
    per_s: float = 0.0
    per_batch: float = 0.0
    buckets_per_batch: tuple[tuple[str, float], ...] = ()


class FakeVllmCollector(Collector):
    """Collects vLLM-named metrics for `models`, computed from the time since start.

    `clock` returns unix seconds; `batches_per_s` batches per engine per second. The
    series and their per-batch buckets are laid out once, so a scrape only multiplies.

    `stamped`: every sample carries the time its value was computed at (the exposition's
    timestamp, which Prometheus honours by default), so a rate over a few scrapes is
    exact whatever the scrape's latency. Unstamped, Prometheus stamps a sample at the
    scrape's start, and a rate reads high when the last sample's value was read longer
    after that than the first's (a 5 s rate read 10.81 for 10.25 req/s once in a full
    test run: ~0.2 s more lag over ~4 s). Off by default: Prometheus does not mark a
    stamped series stale when its target goes down, and the tests of a vanished fleet
    need that.
    """

    def __init__(
        self,
        models: Iterable[ModelSpec],
        *,
        batches_per_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        model_label: str = "model_name",
        stamped: bool = False,
    ) -> None:
        self.models = tuple(models)
        self.stamped = stamped
        self.batches_per_s = batches_per_s
        self.clock = clock
        self.model_label = model_label
        self.series = [s for spec in self.models for s in self._layout(spec)]
        self.t0 = clock()

    def _layout(self, spec: ModelSpec) -> Iterator[_Series]:
        def named(current: str, legacy: str | None = None) -> str:
            name = legacy if (spec.legacy_names and legacy) else current
            return name.replace(":", "_") if spec.escaped_names else name

        histograms = [
            (named("vllm:time_to_first_token_seconds"), spec.ttft_s, TTFT_BUCKETS_S),
            (
                named("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
                spec.itl_s,
                ITL_BUCKETS_S,
            ),
            (named("vllm:e2e_request_latency_seconds"), spec.e2e_s, E2E_BUCKETS_S),
            (named("vllm:request_queue_time_seconds"), spec.queue_s, QUEUE_BUCKETS_S),
            (named("vllm:request_prompt_tokens"), spec.prompt_tokens, TOKEN_BUCKETS),
            (named("vllm:request_generation_tokens"), spec.output_tokens, TOKEN_BUCKETS),
        ]
        optional = [
            (named("vllm:request_decode_time_seconds"), spec.decode_s, PHASE_BUCKETS_S),
            (named("vllm:request_prefill_time_seconds"), spec.prefill_s, PHASE_BUCKETS_S),
            (
                named("vllm:request_time_per_output_token_seconds"),
                spec.tpot_s,
                TPOT_BUCKETS_S,
            ),
            (named("vllm:iteration_tokens_total"), spec.step_tokens, STEP_TOKEN_BUCKETS),
        ]
        histograms += [h for h in optional if h[1]]
        counters = [
            (
                named("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
                spec.prefix_hits_per_batch,
            ),
            (
                named("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
                spec.prefix_queries_per_batch,
            ),
            (named("vllm:num_preemptions"), spec.preemptions_per_batch),
        ]
        keys = (self.model_label, "engine")
        if spec.rejections_per_batch:
            yield _Series(
                "counter",
                named("vllm:admission_rejections"),
                (self.model_label, "reason"),
                (spec.name, "max_num_queued_reqs"),
                per_batch=spec.rejections_per_batch,
            )
        for i, eng in enumerate(spec.engines):
            lv = (spec.name, str(i))
            yield _Series("gauge", named("vllm:num_requests_running"), keys, lv, eng.running)
            yield _Series(
                "gauge",
                named("vllm:num_requests_waiting"),
                keys,
                lv,
                eng.waiting,
                per_s=eng.waiting_growth_per_s,
            )
            kv_name = named("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
            yield _Series("gauge", kv_name, keys, lv, eng.kv_usage)
            for reason, count in spec.completions_per_batch:
                yield _Series(
                    "counter",
                    named("vllm:request_success"),
                    (*keys, "finished_reason"),
                    (*lv, reason),
                    per_batch=count,
                )
            for name, per_batch in counters:
                yield _Series("counter", name, keys, lv, per_batch=per_batch)
            if spec.legacy_decoys:
                yield _Series("gauge", "vllm:gpu_cache_usage_perc", keys, lv, DECOY_KV_USAGE)
                yield _Series("counter", "vllm:gpu_prefix_cache_hits", keys, lv, per_batch=0)
                yield _Series("counter", "vllm:gpu_prefix_cache_queries", keys, lv, per_batch=99)
                decoy = (("vllm:time_per_output_token_seconds", DECOY_ITL_S, ITL_BUCKETS_S),)
                histograms += decoy
            for name, values, bounds in histograms[1:2] if spec.itl_only else histograms:
                template = tuple((floatToGoString(b), c) for b, c in cumulative(values, bounds))
                yield _Series(
                    "histogram",
                    name,
                    keys,
                    lv,
                    per_batch=sum(values),
                    buckets_per_batch=template,
                )

    def collect(self) -> Iterator[Metric]:
        """One family per metric name in use; deterministic in `clock() - t0`."""
        now = self.clock()
        elapsed = max(0.0, now - self.t0)
        n = elapsed * self.batches_per_s
        at = now if self.stamped else None
        families: dict[str, Metric] = {}
        classes = {
            "counter": CounterMetricFamily,
            "gauge": GaugeMetricFamily,
            "histogram": HistogramMetricFamily,
        }
        for s in self.series:
            fam = families.get(s.name)
            if fam is None:
                fam = classes[s.kind](s.name, f"fake {s.name}", labels=list(s.label_names))
                families[s.name] = fam
            labels = list(s.label_values)
            if s.kind == "gauge":
                value = max(0.0, s.base + s.per_s * elapsed)
                fam.add_metric(labels, value, timestamp=at)  # type: ignore[attr-defined]
            elif s.kind == "counter":
                fam.add_metric(labels, s.per_batch * n, timestamp=at)  # type: ignore[attr-defined]
            else:
                buckets = [(le, c * n) for le, c in s.buckets_per_batch]
                fam.add_metric(labels, buckets, s.per_batch * n, timestamp=at)  # type: ignore[attr-defined]
        yield from families.values()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class ServedRegistry:
    """A running exporter: its port and a `stop()` that shuts it down."""

    port: int
    server: WSGIServer
    thread: threading.Thread

    @property
    def target(self) -> str:
        """host:port for a scrape config."""
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop serving and release the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_registry(registry: CollectorRegistry) -> ServedRegistry:
    """Serve `registry` at http://127.0.0.1:<free port>/metrics in text format 0.0.4."""

    def app(environ: dict[str, object], start_response: Callable[..., object]) -> list[bytes]:
        body = generate_latest(registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [body]

    server = make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)  # type: ignore[arg-type]
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="fake-vllm", daemon=True
    )
    thread.start()
    return ServedRegistry(port=server.server_port, server=server, thread=thread)


@contextlib.contextmanager
def serving(specs: Sequence[ModelSpec], batches_per_s: float = 10.0) -> Iterator[list[str]]:
    """One exporter per spec (a pod each: its engines on one /metrics endpoint), their
    scrape targets (host:port) yielded in order; every exporter stopped on exit."""
    exporters: list[ServedRegistry] = []
    try:
        for spec in specs:
            registry = CollectorRegistry()
            registry.register(FakeVllmCollector([spec], batches_per_s=batches_per_s))
            exporters.append(serve_registry(registry))
        yield [e.target for e in exporters]
    finally:
        for e in exporters:
            e.stop()
