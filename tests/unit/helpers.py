"""Builders for observations used across unit tests."""

from __future__ import annotations

from typing import Any

from estimators.types import Observation


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
