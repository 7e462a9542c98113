"""Small fakes shared by the service tests: a fixed-origin clock and a metric source."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.config import GovernorConfig
from estimators.types import LatencyQuantiles, ModelQuery, NoDataError, Observation


@dataclass
class FakeClock:
    """Monotonic and wall time, seconds; advanced by the test only."""

    mono: float = 1000.0
    wall_origin: float = 1_800_000_000.0

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return self.wall_origin + self.mono

    def advance(self, seconds: float) -> float:
        self.mono += seconds
        return self.mono


@dataclass
class FakeSource:
    """`observe(models, now_s)` returns an Observation per model at the set arrival rate
    (req/s) with fixed request lengths, or NoDataError where the rate is None."""

    rates: dict[str, float | None] = field(default_factory=dict)
    prompt_tokens: float = 1000.0
    output_tokens: float = 200.0
    prefix_hit_frac: float | None = None
    """The prefix-cache hit share on every Observation (None: the counters absent)."""
    calls: int = 0
    dists: dict[str, LatencyQuantiles] = field(default_factory=dict)
    """Latency distributions by signal (ttft, itl, e2e) put on every Observation."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, model: str, rate: float | None) -> None:
        with self._lock:
            self.rates[model] = rate

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            out: dict[str, Any] = {}
            for q in models:
                rate = self.rates.get(q.name)
                if rate is None:
                    out[q.name] = NoDataError(q.name, "arrival_rate", "fake: no rate set")
                    continue
                out[q.name] = Observation(
                    model=q.name,
                    observed_at_s=now_s,
                    arrival_rate_rps=rate,
                    prompt_tokens_mean=self.prompt_tokens,
                    prompt_tokens_p95=self.prompt_tokens * 2,
                    output_tokens_mean=self.output_tokens,
                    output_tokens_p95=self.output_tokens * 2,
                    itl_p95_ms=20.0,
                    ttft_p95_ms=300.0,
                    running=rate,
                    waiting=0.0,
                    prefix_cache_hit_frac=self.prefix_hit_frac,
                    extra={"ttft_p50_ms": 120.0, "ttft_p90_ms": 250.0, "itl_p99_ms": 35.0},
                    ttft_dist=self.dists.get("ttft"),
                    itl_dist=self.dists.get("itl"),
                    e2e_dist=self.dists.get("e2e"),
                )
            return out


def quiet_logger() -> Any:
    """A structlog logger that drops everything (tests that capture stdout/stderr)."""
    import structlog

    return structlog.wrap_logger(structlog.ReturnLogger())


def model_entry(name: str = "demo", **over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "deployment": name.lower().replace("/", "-").replace(".", "-"),
        "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 50},
        "replicas": {"min_replicas": 1, "max_replicas": 20},
    }
    entry.update(over)
    return entry


def make_config(*models: dict[str, Any], **policy: Any) -> GovernorConfig:
    return GovernorConfig.model_validate(
        {"models": list(models) or [model_entry()], "policy": policy}
    )
