"""Replay recorded Prometheus answers for N models through a fake query client.

This owns scaling the real recording (`benchmarks/data/prometheus_answers.json`, made
by `benchmarks/record_prometheus.py` from a real Prometheus) to any number of models,
and `ReplayClient`, a drop-in for `PrometheusConnect` in `PrometheusSource(client=...)`.

Scaling: model j of N (`model-00000`, ...) answers with the series of recorded model
`j % len(recorded)`, its model label rewritten; every other label and the
`[timestamp, "value"]` form stay as Prometheus wrote them, except the newest-sample times
(`gauge_sample_ts`, `counter_sample_ts`), set to one second before the query's evaluation
time so staleness reads as it would live. So that deciders see moving
inputs (as they do live: rates over a sliding window), each of `variants` tick variants
multiplies a model's rates (arrival, completions, bucket rates) and mean lengths by its
own factor in [1 - jitter, 1 + jitter] (seeded, deterministic).

Cost model: each variant's answers are serialized to JSON bytes once, at construction,
as the query API's whole body (`{"status": "success", "data": {"resultType": "vector",
"result": [...]}}`). `query_body` returns that body, as the source's default client does
(`estimators.prometheus.http_query_client`), and the source decodes it itself, so
decoding is counted in the observe cost; the HTTP round trip itself is not. Without
`query_body` (`body=False`) the source calls `custom_query`, which decodes the body with
`orjson.loads` on every call (as PrometheusConnect over the default client's session
does; its CPU summed in `decode_cpu_s`). With `decode=False` (implies `body=False`)
`custom_query` returns answers decoded once at construction (never mutated by the
source), so the cost of our own parsing can be told apart from the decoder's. Queries
are matched by text to the source's `TickQueries` names (`query_namer`: the SLA-edge
query by its shape, or exactly for the fake Prometheus); the variant advances on each
`demand` query (one per tick).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from estimators.promql import SIGNAL_LABEL, TickQueries

RECORDING = Path(__file__).resolve().parent / "data" / "prometheus_answers.json"
# Signals whose value is a rate or a mean length: jittered per model and variant.
SAMPLE_TS_SIGNALS = frozenset({"gauge_sample_ts", "counter_sample_ts"})
NOW = b"@NOW@"
"""Placeholder of the newest-sample times in rendered bodies; `fill_now` replaces it."""
JITTERED_SIGNALS = frozenset(
    {
        "arrival_rps",
        "arrival_short_rps",
        "arrival_seed_rps",
        "completions_rps",
        "prompt_tokens_mean",
        "output_tokens_mean",
    }
)


SLA_BUCKETS = "sla_buckets"
ENVELOPE = ('{"status":"success","data":{"resultType":"vector","result":[', "]}}")
"""The query API's answer around the `result` list (a rendered body is the whole answer)."""


def query_namer(queries: TickQueries, *, any_edges: bool = True) -> Callable[[str], str]:
    """Name a tick's query text: by `queries`, and (`any_edges`) any SLA-edge bucket
    query as `sla_buckets` (its text follows the SLAs of the models asked for, unknown
    to a client made before the first tick). KeyError for others."""
    names = {text: name for name, text in queries.items()}

    def name_of(text: str) -> str:
        name = names.get(text)
        if name is None:
            if not any_edges or "_bucket{le=~" not in text:
                raise KeyError(text[:200])
            name = SLA_BUCKETS
        return name

    return name_of


def load_recording(path: Path = RECORDING) -> dict[str, Any]:
    """The recording document (see benchmarks/record_prometheus.py)."""
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def model_names(n: int) -> list[str]:
    """The N synthetic model names, `model-00000` ... (valid ModelConfig names)."""
    return [f"model-{j:05d}" for j in range(n)]


def render_answers(
    recording: Mapping[str, Any],
    n_models: int,
    *,
    factors: Mapping[str, float] | None = None,
) -> dict[str, bytes]:
    """query name -> the query API's JSON body for `n_models` models (module doc).

    `factors`: model -> multiplier of its rates and mean lengths (default 1). Rendered
    from per-series text templates (not through dicts), so 5,000 models take seconds.
    """
    label = recording["model_label"]
    recorded: list[str] = list(recording["models"])
    names = model_names(n_models)
    quoted = [json.dumps(n) for n in names]
    out: dict[str, bytes] = {}
    for qname, result in recording["answers"].items():
        is_buckets = qname == SLA_BUCKETS
        # per recorded model: (metric JSON with a placeholder, timestamp, value, jittered)
        templates: dict[str, list[tuple[str, str, str, bool]]] = {m: [] for m in recorded}
        for item in result:
            metric = dict(item["metric"])
            model = metric.get(label, "")
            metric[label] = "\x00MODEL\x00"
            text = json.dumps(metric).replace('"\\u0000MODEL\\u0000"', "{model}")
            ts, value = item["value"]
            if metric.get(SIGNAL_LABEL) in SAMPLE_TS_SIGNALS:
                value = NOW.decode()  # the recording's sample times are long past
            jitter = is_buckets or metric.get(SIGNAL_LABEL) in JITTERED_SIGNALS
            templates.setdefault(model, []).append((text, json.dumps(ts), value, jitter))
        parts: list[str] = []
        for j, name in enumerate(names):
            f = 1.0 if factors is None else factors.get(name, 1.0)
            q = quoted[j]
            for text, ts, value, jitter in templates[recorded[j % len(recorded)]]:
                v = repr(float(value) * f) if jitter and f != 1.0 else value
                parts.append(f'{{"metric":{text.replace("{model}", q)},"value":[{ts},"{v}"]}}')
        out[qname] = (ENVELOPE[0] + ",".join(parts) + ENVELOPE[1]).encode()
    return out


def fill_now(body: bytes, eval_time_s: float, age_s: float = 1.0) -> bytes:
    """`body` with the newest-sample times set to `eval_time_s - age_s` (Unix seconds)."""
    if NOW not in body:
        return body
    return body.replace(NOW, repr(eval_time_s - age_s).encode())


class ReplayClient:
    """`custom_query(query, params=None, timeout=None)` answering from the recording.

    `queries`: the source's `TickQueries` (to name each query text). Counts every call
    in `calls`. Raises KeyError for a query that is not one of the tick's queries.
    """

    def __init__(
        self,
        queries: TickQueries,
        n_models: int,
        *,
        recording: Mapping[str, Any] | None = None,
        variants: int = 4,
        jitter_frac: float = 0.05,
        seed: int = 0,
        decode: bool = True,
        body: bool = True,
    ) -> None:
        rec = recording if recording is not None else load_recording()
        self.name_of = query_namer(queries)
        rng = random.Random(seed)
        self._bodies: list[dict[str, bytes]] = []
        for v in range(max(1, variants)):
            factors = (
                None
                if v == 0 or jitter_frac == 0
                else {m: 1.0 + jitter_frac * rng.uniform(-1.0, 1.0) for m in model_names(n_models)}
            )
            self._bodies.append(render_answers(rec, n_models, factors=factors))
        self.decode = decode
        self._decoded = (
            []
            if decode
            else [
                {
                    q: json.loads(fill_now(b, time.time()))["data"]["result"]
                    for q, b in bodies.items()
                }
                for bodies in self._bodies
            ]
        )
        self.calls = 0
        self.tick = -1
        self.decode_cpu_s = 0.0
        """CPU seconds spent in `orjson.loads` (decode=True), summed over calls."""
        self.bytes_per_tick = sum(len(b) for b in self._bodies[0].values())
        if body and decode:
            self.query_body = self._body

    def _body(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bytes:
        """The HTTP body of `query`'s answer (`BodyQueryClient.query_body`), undecoded."""
        return self._answer(query, params)

    def _answer(self, query: str, params: dict[str, Any] | None) -> bytes:
        """The body of `query`'s answer in the current variant (counts the call)."""
        name = self.name_of(query)
        self.calls += 1
        if name == "demand":
            self.tick += 1
        body = self._bodies[max(0, self.tick) % len(self._bodies)][name]
        if name == "state":
            body = fill_now(body, float((params or {}).get("time", time.time())))
        return body

    def custom_query(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        if not self.decode:
            name = self.name_of(query)
            self.calls += 1
            if name == "demand":
                self.tick += 1
            return self._decoded[max(0, self.tick) % len(self._bodies)][name]
        body = self._answer(query, params)
        c0 = time.process_time()
        result = orjson.loads(body)["data"]["result"]
        self.decode_cpu_s += time.process_time() - c0
        return result
