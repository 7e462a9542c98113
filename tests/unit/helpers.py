"""Builders for observations and decider states used across unit tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.types import DataHealth
from estimators.types import Observation
from tests.conftest import ORIGIN_S


def obs(model: str = "llama", t: float = 0.0, rate: float = 40.0, **kw: Any) -> Observation:
    """A conversation-like observation: means 1155/211, p95 4083/451 tokens, healthy SLA."""
    base: dict[str, Any] = dict(
        prompt_tokens_mean=1155.0,
        prompt_tokens_p95=4083.0,
        output_tokens_mean=211.0,
        output_tokens_p95=451.0,
        itl_p95_ms=25.0,
        ttft_p95_ms=150.0,
        running=20.0,
        waiting=0.0,
        ready_replicas=None,
    )
    base.update(kw)
    return Observation(model=model, observed_at_s=t, arrival_rate_rps=rate, **base)


def long_history() -> DataHealth:
    """Health of a model with a long good history on a whole, calm fleet (since
    ORIGIN_S - 1000 s): the correction may judge and a surge may arm the burst memory."""
    since = ORIGIN_S - 1000
    return DataHealth(first_good_s=since, full_since_s=since, calm_since_s=since)


def itl_reading(read: Callable[[float], float | None], speed: float) -> float:
    """The mean ITL (ms) at which `read` (a window's speed at a mean ITL, monotone in
    it) reads `speed`, by bisection: what engines `speed` x slower than the profile
    would show."""
    lo, hi = 0.1, 2000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        s = read(mid)
        assert s is not None
        lo, hi = (mid, hi) if s < speed else (lo, mid)
    return (lo + hi) / 2
