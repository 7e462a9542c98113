"""The engines' gRPC API (`BatchingService`): batching knobs from the decision board.

It sits beside KEDA's servicer (`actuators.keda`): both are read-only faces of the same
`DecisionBoard` (actuators.publisher) and answer from its last-known values without
waiting for a tick. Neither needs the service core: `BatchingServicer` gets the board,
an optional stream limit (`StreamSlots`), an optional `on_engine(model, engine_id)`
callback that records which engines asked (for status; an engine that holds a watch
stream is told again every `SEEN_REFRESH_S` while the stream is open, so it stays
counted as one that polls does), and an optional
`ceilings(model)` that gives the largest knobs the governor may choose for a model (the
start values of an engine that follows the knobs live).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from actuators.publisher import (
    DecisionBoard,
    LatencyDistribution,
    Published,
    StreamSlots,
    stream_slot,
)
from controller.types import Knobs
from estimators.types import LatencyQuantiles
from governor_api import governor_v1_pb2, governor_v1_pb2_grpc

pb = governor_v1_pb2
MAX_NAME_CHARS = 253  # model and engine names (Kubernetes object names)
SEEN_REFRESH_S = 60.0
"""Seconds between two `on_engine` calls for an open WatchBatchingConfig stream (status
forgets an engine after service.engines_seen.ENGINE_EXPIRY_S, 600 s, without one)."""


def _model_arg(name: str, what: str = "model") -> str | None:
    """A problem with a model argument, or None."""
    if not name:
        return f"{what}: must not be empty"
    if len(name) > MAX_NAME_CHARS:
        return f"{what}: at most {MAX_NAME_CHARS} characters (got {len(name)})"
    return None


class BatchingServicer(governor_v1_pb2_grpc.BatchingServiceServicer):
    """Engines' API: knobs from `board` (last-known values, never waits).
    `streams` bounds the open WatchBatchingConfig streams (shared with KEDA's);
    `on_engine(model, engine_id)` is told of every engine that asks (status), and again
    every `seen_refresh_s` seconds while its watch stream is open; `sleep`: the waits
    between (asyncio.sleep; tests inject their own)."""

    def __init__(
        self,
        board: DecisionBoard,
        streams: StreamSlots | None = None,
        *,
        on_engine: Callable[[str, str], None] | None = None,
        ceilings: Callable[[str], Knobs | None] | None = None,
        seen_refresh_s: float = SEEN_REFRESH_S,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.board = board
        self.streams = streams
        self.on_engine = on_engine
        self.ceilings = ceilings or (lambda model: None)
        self.seen_refresh_s = seen_refresh_s
        self.sleep = sleep

    async def _keep_seen(self, model: str, engine_id: str) -> None:
        """Tell `on_engine` of a watching engine every `seen_refresh_s` seconds (until
        cancelled at the end of its stream)."""
        assert self.on_engine is not None
        while True:
            await self.sleep(self.seen_refresh_s)
            self.on_engine(model, engine_id)

    async def _entry(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> Published:
        problem = _model_arg(request.model) or (
            f"engine_id: at most {MAX_NAME_CHARS} characters"
            if len(request.engine_id) > MAX_NAME_CHARS
            else None
        )
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            entry = self.board.get(request.model)
        except KeyError:
            known = ", ".join(self.board.models()) or "none"
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {request.model!r} is not configured (configured: {known})",
            )
        if self.on_engine is not None:
            self.on_engine(request.model, request.engine_id)
        return entry

    async def GetBatchingConfig(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.BatchingConfig:
        entry = await self._entry(request, context)
        return batching_to_pb(entry, self.ceilings(entry.model))

    async def GetLatencyDistribution(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.LatencyDistribution:
        entry = await self._entry(request, context)
        return latency_to_pb(entry.model, entry.latency)

    async def WatchBatchingConfig(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        await self._entry(request, context)
        async with stream_slot(self.streams, context, "WatchBatchingConfig"):
            keep_seen = None
            if self.on_engine is not None and request.engine_id:
                seen = self._keep_seen(request.model, request.engine_id)
                keep_seen = asyncio.ensure_future(seen)
            try:
                last: tuple[int, Knobs] | None = None
                async for _ in self.board.watch():
                    try:
                        entry = self.board.get(request.model)
                    except KeyError:
                        await context.abort(
                            grpc.StatusCode.NOT_FOUND, f"model {request.model!r} was removed"
                        )
                    key = (entry.generation, entry.knobs)
                    if key != last:
                        last = key
                        yield batching_to_pb(entry, self.ceilings(entry.model))
            finally:
                if keep_seen is not None:
                    keep_seen.cancel()


def batching_to_pb(p: Published, ceiling: Knobs | None = None) -> governor_v1_pb2.BatchingConfig:
    """A board entry as the engines' BatchingConfig message; `ceiling` (the model's
    largest knobs) fills the ceiling fields, 0 when unknown."""
    return pb.BatchingConfig(
        model=p.model,
        max_num_seqs=p.knobs.max_num_seqs,
        max_num_batched_tokens=p.knobs.max_num_batched_tokens,
        generation=p.generation,
        reason=p.reason,
        decided_at_unix_s=p.decided_at_unix_s or 0.0,
        engine_args=p.knobs.engine_args(),
        max_num_seqs_ceiling=ceiling.max_num_seqs if ceiling else 0,
        max_num_batched_tokens_ceiling=ceiling.max_num_batched_tokens if ceiling else 0,
    )


def quantiles_to_pb(q: LatencyQuantiles) -> governor_v1_pb2.LatencyQuantiles:
    """Latency quantiles (ms) as the API's message; unknown ones left unset."""
    out = pb.LatencyQuantiles()
    for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms"):
        v = getattr(q, k)
        if v is not None:
            setattr(out, k, float(v))
    return out


def latency_to_pb(
    model: str, dist: LatencyDistribution | None
) -> governor_v1_pb2.LatencyDistribution:
    """GetLatencyDistribution's answer; `present` False when nothing was observed yet."""
    if dist is None:
        return pb.LatencyDistribution(model=model, present=False)
    return pb.LatencyDistribution(
        model=model,
        present=True,
        observed_at_unix_s=dist.observed_at_unix_s,
        ttft=quantiles_to_pb(dist.ttft),
        itl=quantiles_to_pb(dist.itl),
        e2e=quantiles_to_pb(dist.e2e),
    )
