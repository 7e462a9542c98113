"""Builders for observations and decider states used across unit tests."""

from __future__ import annotations

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
