"""Shared fixtures: a fixed-origin fake clock and config builders."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.config import SLA, ModelConfig, ReplicaBounds, ScalingPolicy

ORIGIN_S = 1_000.0  # fixed origin of the fake monotonic clock
WALL_ORIGIN_S = 1_764_000_000.0  # fixed wall-clock origin (Unix seconds)


@dataclass
class FakeClock:
    """Monotonic and wall clocks that move only when told."""

    now: float = ORIGIN_S
    wall_offset: float = WALL_ORIGIN_S - ORIGIN_S

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self.wall_offset

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_model(
    name: str = "llama",
    *,
    min_replicas: int = 1,
    max_replicas: int = 20,
    ttft_p95_ms: float = 500.0,
    itl_p95_ms: float = 50.0,
    **kw: object,
) -> ModelConfig:
    return ModelConfig(
        name=name,
        deployment=name.lower().replace(".", "-").replace("/", "-"),
        sla=SLA(ttft_p95_ms=ttft_p95_ms, itl_p95_ms=itl_p95_ms),
        replicas=ReplicaBounds(min_replicas=min_replicas, max_replicas=max_replicas),
        **kw,  # type: ignore[arg-type]
    )


def make_policy(**kw: object) -> ScalingPolicy:
    return ScalingPolicy(**kw)  # type: ignore[arg-type]
