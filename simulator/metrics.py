"""simulator.metrics: a `MetricSource` that reads the simulated engines' vLLM metrics
(`simulator.engine_metrics`) the way Prometheus would, and their text exposition.

Owns:

* `SimulatedSource`: registers a scraper with a `Fleet`, snapshots every live engine's
  cumulative values at scrape instants (every `scrape_interval_s` of simulated time) and
  evaluates an `Observation` over `window_s` like PromQL would (`rate`/`increase` from
  the samples in the window, `histogram_quantile` on summed bucket increases, exact
  attainment with `fraction_le` where the SLA is a bucket edge, gauges from the newest
  sample). `render_text()` renders the Prometheus text exposition of the engines' current
  values (for a later real-time /metrics mode).

Evaluation details (documented deviations from Prometheus):

* `increase` is last sample minus first sample in the window, without Prometheus's
  extrapolation to the window edges; rates divide by the time between those samples, so
  they equal Prometheus's extrapolated rate for a steadily growing counter. A series that
  appears inside the window counts from 0 (the simulator knows engines start at 0),
  one that disappears counts up to its last sample.
* arrival rate = completions rate + growth of (waiting + running), clamped at 0, like
  `PrometheusSource`: growth is the least-squares slope of the fleet's sum over the
  window's samples (PromQL `deriv` of a subquery of the sum) by default, or last minus
  first sample (`growth="delta"`, which makes the estimate exactly the arrivals between
  the two samples). With
  `include_router=True` (default) requests held at the fleet's router while no replica
  serves count as a waiting series too, so demand stays visible at zero replicas (like a
  gateway/activator metric); set it False for vLLM-only parity. `short_window_s`, when
  given, also fills `arrival_rate_short_rps` (the panic window; None with fewer than
  two scrapes in it, as PromQL's `rate` would be); `arrival_rate_5m_rps` is the same
  over 300 s.
* Means (`itl_mean_ms`, `ttft_mean_ms`, per-request prefill/decode times, tokens per
  step) are histogram sum increase / count increase; `ttft_dist` / `itl_dist` /
  `e2e_dist` are `histogram_quantile` at p50/p90/p95/p99; `tpot_attainment_frac` is the
  fraction of requests whose TPOT is within the ITL SLA (exact at a bucket edge).
* `targets_up` = engines scraped in the newest sample; `targets_down` = replicas serving
  or draining whose engine the scrape did not find (a real Prometheus's `up == 0`).
* GPU busy fraction = sum of step-execution seconds / sum of engine uptime seconds over
  the window, across engines (what DCGM's GPU utilization averages to); the step in
  flight at a scrape counts for its elapsed part.

Units: seconds (`_s`), milliseconds (`_ms`), tokens, fractions (`_frac`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from estimators.histogram import fraction_le, histogram_quantile
from estimators.types import (
    LatencyQuantiles,
    ModelQuery,
    NoDataError,
    Observation,
    ObservationResult,
)
from simulator.engine import Engine
from simulator.engine_metrics import HIST_ATTRS, hist_bounds
from simulator.fleet import Fleet

# --- snapshot layout ------------------------------------------------------------------

_SCALARS: tuple[str, ...] = (
    "success",
    "prompt_tokens",
    "generation_tokens",
    "preemptions",
    "refused",
    "busy_s",
    "steps",
    "prefix_queries",
    "prefix_hits",
)
_GAUGES: tuple[str, ...] = ("running", "waiting", "kv_usage", "uptime_s")


@dataclass(frozen=True, slots=True)
class SnapshotLayout:
    """Offsets of every value in a snapshot vector (see `snapshot_engine`).

    Scalars first, then the gauges, then per histogram its per-bucket counts (bounds + 1
    entries, the last +Inf) followed by its sum.
    """

    scalar: dict[str, int]
    gauge: dict[str, int]
    hist: dict[str, tuple[int, tuple[float, ...]]]
    """attribute -> (offset of the first bucket count, bounds); the sum follows the +Inf."""
    size: int

    @staticmethod
    def build(max_model_len: int) -> SnapshotLayout:
        off = 0
        scalar = {}
        for name in _SCALARS:
            scalar[name] = off
            off += 1
        gauge = {}
        for name in _GAUGES:
            gauge[name] = off
            off += 1
        hist = {}
        for name in HIST_ATTRS:
            bounds = hist_bounds(name, max_model_len)
            hist[name] = (off, bounds)
            off += len(bounds) + 2
        return SnapshotLayout(scalar, gauge, hist, off)


def snapshot_engine(engine: Engine, now_s: float) -> np.ndarray:
    """One engine's cumulative values at `now_s` as a flat float64 vector (SnapshotLayout)."""
    m = engine.metrics
    vals: list[float] = [
        m.success,
        m.prompt_tokens,
        m.generation_tokens,
        m.preemptions,
        m.refused,
        engine.busy_s_at(now_s),
        m.steps,
        m.prefix_queries,
        m.prefix_hits,
        engine.num_running,
        engine.num_waiting,
        engine.kv_usage_frac,
        max(0.0, now_s - engine.start_s),
    ]
    for name in HIST_ATTRS:
        vals.extend(getattr(m, name))
        vals.append(getattr(m, name + "_sum"))
    return np.asarray(vals, dtype=np.float64)


# --- the metric source ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScrapeSample:
    """What one scrape saw: per-engine vectors and fleet-level gauges."""

    t_s: float
    engines: dict[int, np.ndarray]
    """replica id -> snapshot vector (serving and draining engines)."""
    ready_replicas: int
    router_queue: int
    targets_down: int = 0
    """Replicas serving or draining whose engine was not scraped (a real Prometheus
    would see `up == 0` for them)."""


LONG_WINDOW_S = 300.0
"""Window of `arrival_rate_5m_rps` (the seed policy's 5-minute rate), seconds."""


class _WindowHistograms:
    """Histogram arithmetic on one window's summed increases (`SnapshotLayout` vector)."""

    def __init__(self, layout: SnapshotLayout, delta: np.ndarray) -> None:
        self.layout = layout
        self.delta = delta

    def buckets(self, name: str) -> list[tuple[float, float]]:
        """Cumulative (bound, count) pairs of histogram `name`, the last +Inf."""
        off, bounds = self.layout.hist[name]
        counts = np.cumsum(self.delta[off : off + len(bounds) + 1])
        pairs = [(b, float(c)) for b, c in zip(bounds, counts[:-1], strict=True)]
        pairs.append((math.inf, float(counts[-1])))
        return pairs

    def mean(self, name: str, scale: float = 1.0) -> float | None:
        """sum / count of histogram `name` x `scale` (None: no observation)."""
        off, bounds = self.layout.hist[name]
        n = len(bounds) + 1
        total, count = float(self.delta[off + n]), float(self.delta[off : off + n].sum())
        return total / count * scale if count > 0 else None

    def quantile(self, name: str, qv: float, scale: float = 1.0) -> float | None:
        """PromQL `histogram_quantile(qv, ...)` of histogram `name` x `scale`."""
        v = histogram_quantile(qv, self.buckets(name))
        return None if v is None else v * scale

    def dist(self, name: str) -> LatencyQuantiles | None:
        """p50/p90/p95/p99 of a seconds histogram, in ms (None: no observation)."""
        if self.mean(name) is None:
            return None
        return LatencyQuantiles(
            p50_ms=self.quantile(name, 0.50, 1000.0),
            p90_ms=self.quantile(name, 0.90, 1000.0),
            p95_ms=self.quantile(name, 0.95, 1000.0),
            p99_ms=self.quantile(name, 0.99, 1000.0),
        )

    def latency_fields(self, q: ModelQuery) -> dict[str, object]:
        """The latency fields of an Observation: quantiles, means (the online
        calibration's inputs), distributions and exact attainment at the SLA edges."""
        ttft_b, itl_b, tpot_b = self.buckets("ttft"), self.buckets("itl"), self.buckets("tpot")
        return {
            "itl_p95_ms": self.quantile("itl", 0.95, 1000.0),
            "ttft_p95_ms": self.quantile("ttft", 0.95, 1000.0),
            "ttft_attainment_frac": fraction_le(q.ttft_sla_s, ttft_b) if q.ttft_sla_s else None,
            "itl_attainment_frac": fraction_le(q.itl_sla_s, itl_b) if q.itl_sla_s else None,
            "itl_mean_ms": self.mean("itl", 1000.0),
            "ttft_mean_ms": self.mean("ttft", 1000.0),
            "decode_time_p95_ms": self.quantile("decode_t", 0.95, 1000.0),
            "decode_time_mean_ms": self.mean("decode_t", 1000.0),
            "prefill_time_mean_ms": self.mean("prefill_t", 1000.0),
            "queue_time_mean_ms": self.mean("queue", 1000.0),
            "e2e_mean_ms": self.mean("e2e", 1000.0),
            "tpot_p95_ms": self.quantile("tpot", 0.95, 1000.0),
            "tpot_attainment_frac": fraction_le(q.itl_sla_s, tpot_b) if q.itl_sla_s else None,
            "step_tokens_mean": self.mean("iter_tokens"),
            "ttft_dist": self.dist("ttft"),
            "itl_dist": self.dist("itl"),
            "e2e_dist": self.dist("e2e"),
        }


class SimulatedSource:
    """`MetricSource` over a simulated `Fleet` serving one model.

    Construction registers a scraper with the fleet: every `scrape_interval_s` of
    simulated time (from the fleet's current time) the fleet calls back with all engines
    advanced exactly to that instant. `observe(models, now_s)` evaluates over the samples
    in `(now_s - window_s, now_s]`; fewer than two samples -> `NoDataError`.
    Samples older than `retention_s` (default 2 x window, at least 600 s) are dropped.
    """

    def __init__(
        self,
        fleet: Fleet,
        model_name: str,
        window_s: float = 60.0,
        scrape_interval_s: float = 5.0,
        *,
        include_router: bool = True,
        growth: str = "deriv",
        short_window_s: float | None = None,
        retention_s: float | None = None,
    ) -> None:
        if window_s <= 0 or scrape_interval_s <= 0:
            raise ValueError(
                f"window_s ({window_s}) and scrape_interval_s ({scrape_interval_s}) must be > 0"
            )
        self.fleet = fleet
        self.model_name = model_name
        self.window_s = float(window_s)
        self.scrape_interval_s = float(scrape_interval_s)
        self.include_router = include_router
        self.sees_demand_at_zero = include_router  # the router's queue shows it (loop)
        if growth not in ("deriv", "delta"):
            raise ValueError(f"growth must be 'deriv' or 'delta', got {growth!r}")
        self.growth = growth
        if short_window_s is not None and short_window_s <= 0:
            raise ValueError(f"short_window_s must be > 0, got {short_window_s}")
        self.short_window_s = short_window_s
        self.retention_s = (
            float(retention_s) if retention_s is not None else max(600.0, 2.0 * self.window_s)
        )
        self.layout = SnapshotLayout.build(fleet.max_model_len)
        self._samples: list[ScrapeSample] = []
        self._times: list[float] = []
        fleet.add_scraper(self.scrape_interval_s, self._scrape)

    # -- scraping ------------------------------------------------------------------------

    def _scrape(self, t_s: float) -> None:
        engines = {rid: snapshot_engine(eng, t_s) for rid, eng in self.fleet.live_engines()}
        fleet = self.fleet
        down = max(0, fleet.engines_expected - len(engines))
        sample = ScrapeSample(t_s, engines, fleet.ready_replicas, fleet.router_queue_len, down)
        self._samples.append(sample)
        self._times.append(t_s)
        cut = bisect.bisect_left(self._times, t_s - self.retention_s)
        if cut > 64:  # prune in batches
            del self._samples[:cut]
            del self._times[:cut]

    @property
    def samples(self) -> Sequence[ScrapeSample]:
        """The retained scrape samples, oldest first."""
        return self._samples

    # -- evaluation ----------------------------------------------------------------------

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        """Observe `models` at `now_s` (simulated seconds); other model names get NoDataError."""
        out: dict[str, ObservationResult] = {}
        for q in models:
            if q.name != self.model_name:
                out[q.name] = NoDataError(q.name, "arrival_rate", "model not served by this fleet")
                continue
            out[q.name] = self._evaluate(q, now_s)
        return out

    def _window(self, now_s: float, window_s: float | None = None) -> list[ScrapeSample]:
        w = self.window_s if window_s is None else window_s
        hi = bisect.bisect_right(self._times, now_s)
        lo = bisect.bisect_right(self._times, now_s - w)
        return self._samples[lo:hi]

    def busy_frac_by_replica(self, now_s: float) -> dict[int, float]:
        """Per engine, its GPU busy fraction over the window ending at `now_s`: increase
        of busy seconds / increase of uptime between its first and last sample there (a
        per-pod `rate` ratio, so an engine scraped fewer than two times in the window has
        none). What an HPA on a per-pod GPU metric (DCGM through a metrics adapter) reads
        for each pod."""
        b, u = self.layout.scalar["busy_s"], self.layout.gauge["uptime_s"]
        first: dict[int, np.ndarray] = {}
        last: dict[int, np.ndarray] = {}
        for s in self._window(now_s):
            for rid, v in s.engines.items():
                first.setdefault(rid, v)
                last[rid] = v
        out = {}
        for rid, v1 in last.items():
            v0 = first[rid]
            du = float(v1[u] - v0[u])
            if v0 is not v1 and du > 0:
                out[rid] = min(1.0, float(v1[b] - v0[b]) / du)
        return out

    def _held(self, s: ScrapeSample) -> float:
        """The fleet's waiting + running in sample `s` (the router's queue included with
        `include_router`), requests."""
        g = self.layout.gauge
        total = float(sum(v[g["running"]] + v[g["waiting"]] for v in s.engines.values()))
        return total + (float(s.router_queue) if self.include_router else 0.0)

    def _arrival_rate(self, win: list[ScrapeSample]) -> tuple[float, float]:
        """(arrival rate, completion rate) over the samples `win` (>= 2), requests/s.

        completions: increase of the success counter / time between first and last
        sample. growth of the fleet's waiting + running (the router's queue included
        with `include_router`; an engine absent from a sample counts 0 there): `deriv`
        = the least-squares slope of that sum over the samples (PromQL `deriv` over a
        subquery of the per-model sum, `QueryBuilder.demand`), `delta` = last minus
        first: exact arrivals. Not the sum of each engine's own slope: a replica added
        inside the window would count its fill from the others' queue as arrivals.
        """
        first, last = win[0], win[-1]
        dt = last.t_s - first.t_s
        ok = self.layout.scalar["success"]
        done = 0.0
        ids: set[int] = set()
        for s in win:
            ids.update(s.engines)
        for rid in ids:
            v_last = next(s.engines[rid] for s in reversed(win) if rid in s.engines)
            v_first = first.engines.get(rid)
            done += v_last[ok] - (v_first[ok] if v_first is not None else 0.0)
        held = np.array([self._held(s) for s in win])
        if self.growth == "delta":
            growth = float(held[-1] - held[0]) / dt
        else:
            ts = np.array([s.t_s for s in win])
            tc = ts - ts.mean()
            growth = float((tc * (held - held.mean())).sum() / (tc * tc).sum())
        completions = done / dt
        return max(0.0, completions + growth), completions

    def _delta(self, win: list[ScrapeSample]) -> np.ndarray:
        """Increase of every value over `win`, summed over engine series (a series that
        appears inside the window counts from 0, one that vanishes up to its last sample)."""
        first = win[0]
        delta = np.zeros(self.layout.size, dtype=np.float64)
        ids: set[int] = set()
        for s in win:
            ids.update(s.engines)
        for rid in ids:
            v_last = None
            for s in reversed(win):
                v_last = s.engines.get(rid)
                if v_last is not None:
                    break
            assert v_last is not None
            v_first = first.engines.get(rid)
            delta += v_last if v_first is None else v_last - v_first
        return delta

    def _evaluate(self, q: ModelQuery, now_s: float) -> ObservationResult:
        win = self._window(now_s)
        if len(win) < 2:
            return NoDataError(q.name, "arrival_rate", f"{len(win)} scrape(s) in the window")
        first, last = win[0], win[-1]
        dt = last.t_s - first.t_s
        if dt <= 0:
            return NoDataError(q.name, "arrival_rate", "window samples share one timestamp")
        if not self.include_router and not (first.engines or last.engines):
            return NoDataError(q.name, "arrival_rate", "no engine series in the window")
        lay = self.layout
        h = _WindowHistograms(lay, self._delta(win))
        g = lay.gauge

        def gauge_sum(s: ScrapeSample, name: str) -> float:
            return float(sum(v[g[name]] for v in s.engines.values()))

        sc = lay.scalar
        delta = h.delta
        arrival, completions_rps = self._arrival_rate(win)
        queries = delta[sc["prefix_queries"]]
        uptime = delta[g["uptime_s"]]
        n_last = len(last.engines)
        kv = (gauge_sum(last, "kv_usage") / n_last) if n_last else None
        return Observation(
            model=q.name,
            observed_at_s=now_s,
            arrival_rate_rps=arrival,
            arrival_rate_short_rps=self._rate_over(now_s, self.short_window_s),
            arrival_rate_5m_rps=self._rate_over(now_s, LONG_WINDOW_S),
            staleness_s=max(0.0, now_s - last.t_s),
            prompt_tokens_mean=h.mean("req_prompt"),
            prompt_tokens_p95=h.quantile("req_prompt", 0.95),
            output_tokens_mean=h.mean("req_gen"),
            output_tokens_p95=h.quantile("req_gen", 0.95),
            e2e_p99_ms=h.quantile("e2e", 0.99, 1000.0),
            queue_time_p95_ms=h.quantile("queue", 0.95, 1000.0),
            running=gauge_sum(last, "running") if n_last else None,
            waiting=gauge_sum(last, "waiting") if n_last else None,
            kv_usage_frac=kv,
            prefix_cache_hit_frac=(delta[sc["prefix_hits"]] / queries) if queries > 0 else None,
            preemption_rate_per_s=delta[sc["preemptions"]] / dt,
            gpu_busy_frac=min(1.0, delta[sc["busy_s"]] / uptime) if uptime > 0 else None,
            ready_replicas=last.ready_replicas,
            targets_up=n_last,
            targets_down=last.targets_down,
            **h.latency_fields(q),
            extra={
                "router_queue": float(last.router_queue),
                "completions_rps": completions_rps,
                "refused_rate_rps": delta[sc["refused"]] / dt,
                "engines": float(n_last),
                "window_s": dt,
            },
        )

    def _rate_over(self, now_s: float, window_s: float | None) -> float | None:
        """Arrival rate over the last `window_s` (None: no window or < 2 samples)."""
        if window_s is None:
            return None
        win = self._window(now_s, window_s)
        if len(win) < 2 or win[-1].t_s <= win[0].t_s:
            return None
        return self._arrival_rate(win)[0]

    # -- exposition ----------------------------------------------------------------------

    def render_text(self) -> str:
        """Prometheus text exposition (format 0.0.4) of every live engine's current values,
        labelled `model_name` and `engine`."""
        now = self.fleet.now_s
        engines = list(self.fleet.live_engines())
        return render_text(self.model_name, engines, now)


_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("vllm:request_success_total", "success", "Count of successfully processed requests."),
    ("vllm:prompt_tokens_total", "prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens_total", "generation_tokens", "Number of generation tokens."),
    ("vllm:num_preemptions_total", "preemptions", "Cumulative number of preemptions."),
    ("vllm:prefix_cache_queries_total", "prefix_queries", "Prefix cache queries, in tokens."),
    ("vllm:prefix_cache_hits_total", "prefix_hits", "Prefix cache hits, in tokens."),
    (
        "governor_sim_refused_requests_total",
        "refused",
        "Requests refused (prompt longer than max_model_len).",
    ),
    (
        "governor_sim_gpu_busy_seconds_total",
        "busy_s",
        "Seconds the GPU spent executing engine steps (DCGM GPU utilization integral).",
    ),
)
_HISTS: tuple[tuple[str, str, str], ...] = (
    ("vllm:time_to_first_token_seconds", "ttft", "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", "itl", "Histogram of inter-token latency in seconds."),
    ("vllm:e2e_request_latency_seconds", "e2e", "Histogram of e2e request latency in seconds."),
    ("vllm:request_queue_time_seconds", "queue", "Time spent in the WAITING phase, seconds."),
    ("vllm:request_prompt_tokens", "req_prompt", "Number of prefill tokens per request."),
    ("vllm:request_generation_tokens", "req_gen", "Number of generation tokens per request."),
    ("vllm:iteration_tokens_total", "iter_tokens", "Number of tokens per engine step."),
    (
        "vllm:request_prefill_time_seconds",
        "prefill_t",
        "Time spent in the PREFILL phase, seconds.",
    ),
    ("vllm:request_decode_time_seconds", "decode_t", "Time spent in the DECODE phase, seconds."),
    (
        "vllm:request_time_per_output_token_seconds",
        "tpot",
        "Per-request mean time per output token, seconds.",
    ),
)


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def render_text(model_name: str, engines: Sequence[tuple[int, Engine]], now_s: float) -> str:
    """Prometheus text exposition of `engines` (replica id, engine) at `now_s`."""
    lines: list[str] = []

    def labels(rid: int, extra: str = "") -> str:
        base = f'engine="{rid}",model_name="{model_name}"'
        return "{" + base + ("," + extra if extra else "") + "}"

    gauges: tuple[tuple[str, Callable[[Engine], float], str], ...] = (
        ("vllm:num_requests_running", lambda e: e.num_running, "Requests in model execution."),
        ("vllm:num_requests_waiting", lambda e: e.num_waiting, "Requests waiting."),
        ("vllm:kv_cache_usage_perc", lambda e: e.kv_usage_frac, "KV-cache usage, 1 = full."),
    )
    for name, fn, help_ in gauges:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} gauge")
        for rid, eng in engines:
            lines.append(f"{name}{labels(rid)} {_fmt(float(fn(eng)))}")
    for name, attr, help_ in _COUNTERS:
        # Text format 0.0.4 declares a counter under its full sample name.
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} counter")
        for rid, eng in engines:
            lines.append(f"{name}{labels(rid)} {_fmt(float(getattr(eng.metrics, attr)))}")
    for name, attr, help_ in _HISTS:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} histogram")
        for rid, eng in engines:
            m = eng.metrics
            counts: list[int] = getattr(m, attr)
            bounds = hist_bounds(attr, eng.max_model_len)
            cum = 0
            for b, c in zip((*bounds, math.inf), counts, strict=True):
                cum += c
                le = "+Inf" if math.isinf(b) else repr(float(b))
                le_label = 'le="' + le + '"'
                lines.append(f"{name}_bucket{labels(rid, le_label)} {cum}")
            lines.append(f"{name}_sum{labels(rid)} {_fmt(float(getattr(m, attr + '_sum')))}")
            lines.append(f"{name}_count{labels(rid)} {cum}")
    _ = now_s
    return "\n".join(lines) + "\n"
