"""The operators' gRPC API (`AdminService`) over a `ServiceCore`.

Every call runs the core's blocking work in a worker thread under the call's deadline
(capped at `ADMIN_CALL_TIMEOUT_S`); an `AdminError` becomes the call's gRPC status, and
any other failure INTERNAL naming the exception's type (logged), never an opaque UNKNOWN.
A mutation whose request holds a field this server does not know (a newer client's,
which protobuf would keep and ignore) is refused with INVALID_ARGUMENT naming it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format, unknown_fields
from google.protobuf.message import Message

from governor_api import governor_v1_pb2, governor_v1_pb2_grpc
from service.convert import (
    decision_to_pb,
    observation_to_pb,
    target_from_pb,
    target_to_pb,
    trace_to_pb,
)
from service.core import ServiceCore
from service.errors import AdminError
from service.views import StatusView

pb = governor_v1_pb2

ADMIN_CALL_TIMEOUT_S = 10.0  # server-side cap on one admin call's store I/O


async def _abort_admin(context: grpc.aio.ServicerContext, exc: AdminError) -> None:
    await context.abort(exc.code, exc.message)


def unknown_field(msg: Message, where: str) -> str | None:
    """The first field in `msg` or a message inside it (walked depth-first: singular,
    repeated, map values, Struct values) that this server's proto does not define, as
    `where.path (message type): unknown field number N`; None when there is none."""
    for f in unknown_fields.UnknownFieldSet(msg):
        return f"{where} ({msg.DESCRIPTOR.full_name}): unknown field number {f.field_number}"
    for fd, value in msg.ListFields():
        if fd.type != fd.TYPE_MESSAGE:
            continue
        if fd.message_type.GetOptions().map_entry:
            if fd.message_type.fields_by_name["value"].type != fd.TYPE_MESSAGE:
                continue  # a map of scalars: nothing inside to walk
            subs = [(f"{where}.{fd.name}[{k!r}]", v) for k, v in value.items()]
        elif fd.is_repeated:
            subs = [(f"{where}.{fd.name}[{i}]", v) for i, v in enumerate(value)]
        else:
            subs = [(f"{where}.{fd.name}", value)]
        for path, sub in subs:
            found = unknown_field(sub, path)
            if found is not None:
                return found
    return None


_Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def _known_fields_only(method: _Handler) -> _Handler:
    """An admin mutation that refuses a request holding an unknown field (INVALID_ARGUMENT
    naming it) before anything runs: applying the rest would silently drop what the
    client asked for."""

    @functools.wraps(method)
    async def checked(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        problem = unknown_field(request, type(request).__name__)
        if problem is not None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{problem}: this server does not know it (a newer client?); nothing was changed",
            )
        return await method(self, request, context)

    return checked


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

    @_known_fields_only
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

    @_known_fields_only
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
                    replicas=p.replicas,  # None: unset (no decision yet), never 0
                    max_num_seqs=p.knobs.max_num_seqs,
                    max_num_batched_tokens=p.knobs.max_num_batched_tokens,
                    generation=p.generation,
                    reason=p.reason,
                    decided_at_unix_s=p.decided_at_unix_s,
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

    @_known_fields_only
    async def PauseActuation(
        self, request: governor_v1_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.PauseResponse:
        paused = await self._blocking.run(context, self.core.set_paused, request.model, True)
        return pb.PauseResponse(model=request.model, paused=paused)

    @_known_fields_only
    async def ResumeActuation(
        self, request: governor_v1_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.PauseResponse:
        paused = await self._blocking.run(context, self.core.set_paused, request.model, False)
        return pb.PauseResponse(model=request.model, paused=paused)
