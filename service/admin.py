"""The operators' gRPC API (`AdminService`) over a `ServiceCore`.

Every call runs the core's blocking work in a worker thread under the call's deadline
(capped at `ADMIN_CALL_TIMEOUT_S`); an `AdminError` becomes the call's gRPC status, and
any other failure INTERNAL naming the exception's type (logged), never an opaque UNKNOWN.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import json_format

from governor_api import governor_v1_pb2, governor_v1_pb2_grpc
from service.convert import (
    decision_to_pb,
    observation_to_pb,
    target_from_pb,
    target_to_pb,
    trace_to_pb,
)
from service.core import ServiceCore, StatusView
from service.errors import AdminError

pb = governor_v1_pb2

ADMIN_CALL_TIMEOUT_S = 10.0  # server-side cap on one admin call's store I/O


async def _abort_admin(context: grpc.aio.ServicerContext, exc: AdminError) -> None:
    await context.abort(exc.code, exc.message)


class _Blocking:
    """Runs a core call in a worker thread under the call's deadline (capped)."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    async def run(
        self, context: grpc.aio.ServicerContext, fn: Callable[..., Any], *args: Any
    ) -> Any:
        remaining = context.time_remaining()
        cap = ADMIN_CALL_TIMEOUT_S
        timeout = cap if remaining is None else min(remaining, cap)
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), max(timeout, 0.001))
        except AdminError as exc:
            await _abort_admin(context, exc)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the store did not answer within {timeout:.1f} s; the change may still apply",
            )
        except Exception as exc:
            call = getattr(fn, "__name__", "the call")
            self.core.log.error("admin_call_failed", call=call, error=repr(exc))
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"{call} failed unexpectedly ({type(exc).__name__}: {exc}); see the governor's log",
            )


class AdminServicer(governor_v1_pb2_grpc.AdminServiceServicer):
    """Operators' API over ServiceCore (see the .proto for each rpc's contract)."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self._blocking = _Blocking(core)

    async def SetTarget(
        self, request: governor_v1_pb2.SetTargetRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.TargetResponse:
        if not request.HasField("target"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target: required")
        try:
            data = target_from_pb(request.target)
        except json_format.Error as exc:  # NaN or Infinity in the policy Struct
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"target.policy: numbers must be finite ({exc})"
            )
        expected = request.expected_revision if request.HasField("expected_revision") else None
        model, rev = await self._blocking.run(
            context, self.core.set_target, data, expected, request.dry_run
        )
        return pb.TargetResponse(
            target=target_to_pb(model), revision=rev, paused=model.name in self.core.targets.paused
        )

    async def GetTarget(
        self, request: governor_v1_pb2.GetTargetRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.TargetResponse:
        model, rev, paused = await self._blocking.run(context, self.core.get_target, request.model)
        return pb.TargetResponse(target=target_to_pb(model), revision=rev, paused=paused)

    async def ListTargets(
        self, request: governor_v1_pb2.ListTargetsRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.ListTargetsResponse:
        items, rev = await self._blocking.run(context, self.core.list_targets)
        return pb.ListTargetsResponse(
            targets=[
                pb.TargetResponse(target=target_to_pb(m), revision=rev, paused=p) for m, p in items
            ],
            revision=rev,
        )

    async def DeleteTarget(
        self, request: governor_v1_pb2.DeleteTargetRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.DeleteTargetResponse:
        expected = request.expected_revision if request.HasField("expected_revision") else None
        rev = await self._blocking.run(context, self.core.delete_target, request.model, expected)
        return pb.DeleteTargetResponse(revision=rev)

    async def GetStatus(
        self, request: governor_v1_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.GetStatusResponse:
        if len(request.models) > self.core.max_models:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"models: at most {self.core.max_models} names (got {len(request.models)})",
            )
        view: StatusView = await self._blocking.run(context, self.core.status, list(request.models))
        models = []
        for m in view.models:
            p = m.published
            ms = pb.ModelStatus(
                model=m.model,
                paused=m.paused,
                observation=observation_to_pb(m.observation),
                published=pb.PublishedStatus(
                    has_replicas=p.replicas is not None,
                    replicas=p.replicas or 0,
                    max_num_seqs=p.knobs.max_num_seqs,
                    max_num_batched_tokens=p.knobs.max_num_batched_tokens,
                    generation=p.generation,
                    reason=p.reason,
                    decided_at_unix_s=p.decided_at_unix_s or 0.0,
                    origin=p.origin,
                    engines_seen=m.engines_seen,
                ),
                actuation=m.actuation,
            )
            if m.decision is not None:
                ms.decision.CopyFrom(decision_to_pb(m.decision))
            models.append(ms)
        return pb.GetStatusResponse(
            models=models,
            instance=view.instance,
            leader=view.leader,
            leader_identity=view.leader_identity,
            last_tick_unix_s=view.last_tick_unix_s or 0.0,
            store=view.store,
            targets_revision=view.targets_revision,
            targets_problem=view.targets_problem,
        )

    async def Explain(
        self, request: governor_v1_pb2.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.ExplainResponse:
        history = await self._blocking.run(context, self.core.explain, request.model, request.last)
        return pb.ExplainResponse(model=request.model, decisions=[trace_to_pb(d) for d in history])

    async def PauseActuation(
        self, request: governor_v1_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.PauseResponse:
        paused = await self._blocking.run(context, self.core.set_paused, request.model, True)
        return pb.PauseResponse(model=request.model, paused=paused)

    async def ResumeActuation(
        self, request: governor_v1_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.PauseResponse:
        paused = await self._blocking.run(context, self.core.set_paused, request.model, False)
        return pb.PauseResponse(model=request.model, paused=paused)
