"""KEDA actuator: the `externalscaler.ExternalScaler` gRPC service (asyncio).

KEDA is the client. Each ScaledObject trigger of type `external` (or `external-push`)
carries metadata `scalerAddress` (ours), `model` (required) and `namespace` (optional:
when given it must be the model's configured namespace); KEDA sends the whole trigger
metadata map as `scalerMetadata` and other keys are ignored. The ScaledObject's own
namespace (`ScaledObjectRef.namespace`, which KEDA always sets: a ScaledObject lives
beside the workload it scales) must be the model's too, so a copy of a ScaledObject in
another namespace cannot scale its own workload to the model's count; an empty one (a
client other than KEDA) is not checked.

Answers, all from the decision board (last-known state; never waiting on Prometheus,
because KEDA's fallback does not cover an unreachable or slow external scaler):

- GetMetricSpec: one metric per ScaledObject, `governor-<model>` (sanitized),
  targetSize = 1 and targetSizeFloat = 1.
- GetMetrics: desired replicas R in metricValueFloat and metricValue (zero in both when
  zero: KEDA uses the float only when > 0). With the default AverageValue metric type
  and target 1 the HPA computes ceil(R / 1) = R replicas.
- IsActive: R > 0. StreamIsActive: the current value at stream open, then each change.
- StreamMetricSpec: UNIMPLEMENTED.

Before the first decision for a model (no restored state either) GetMetrics and
IsActive answer UNAVAILABLE: KEDA then leaves the workload as it is instead of reading
a zero. Bad metadata -> INVALID_ARGUMENT; unknown model or namespace -> NOT_FOUND; each
with a message naming what is wrong (echoed values are clipped to 80 characters). A
metadata map of more than `MAX_METADATA_ENTRIES` entries is refused. StreamIsActive
streams count against the server's watch-stream limit (`streams`): beyond it,
RESOURCE_EXHAUSTED, and KEDA retries with its own backoff.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from actuators.publisher import DecisionBoard, Published, StreamSlots, stream_slot
from governor_api import externalscaler_pb2 as pb
from governor_api import externalscaler_pb2_grpc as pb_grpc

METRIC_PREFIX = "governor-"
TARGET_SIZE = 1  # AverageValue target: 1 replica per replica -> HPA desired = metric
MAX_METADATA_ENTRIES = 256
ECHO_CHARS = 80


def _echo(value: Any) -> str:
    """repr of a client-sent value for an error message, at most ECHO_CHARS characters."""
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


class MetadataError(ValueError):
    """Bad trigger metadata; the message names each problem."""


@dataclass(frozen=True, slots=True)
class ScalerMetadata:
    """The trigger metadata KEDA sends: `model` (the model's name, as configured) and
    optional `namespace` (the model's namespace). Surrounding whitespace is removed;
    other keys (scalerAddress, ...) are ignored. Checked by hand, not by pydantic: the
    serving process (service/serving.py) imports this module and nothing else of it
    needs pydantic (about 11 MB of memory)."""

    model: str
    namespace: str | None = None

    @classmethod
    def parse(cls, metadata: Mapping[str, str]) -> ScalerMetadata:
        """The metadata of a trigger; MetadataError naming every problem."""
        problems: list[str] = []
        model = _field(metadata, "model", MAX_MODEL_CHARS, problems, required=True)
        namespace = _field(metadata, "namespace", MAX_NAMESPACE_CHARS, problems)
        if problems:
            raise MetadataError("; ".join(problems))
        assert model is not None
        return cls(model=model, namespace=namespace)


MAX_MODEL_CHARS = 253
MAX_NAMESPACE_CHARS = 63


def _field(
    metadata: Mapping[str, str], key: str, limit: int, problems: list[str], required: bool = False
) -> str | None:
    """`metadata[key]` stripped, or None when absent (a problem if `required`); a value
    that is empty or longer than `limit` characters adds a problem."""
    if key not in metadata:
        if required and f"{key}FromEnv" in metadata:
            problems.append(
                f"scalerMetadata.{key}: required; {key}FromEnv is not read (KEDA sends the "
                f"resolved value under that name): set {key} in the trigger's metadata"
            )
        elif required:
            problems.append(f"scalerMetadata.{key}: required (set it in the trigger's metadata)")
        return None
    raw = metadata[key]
    value = raw.strip()
    if not value:
        problems.append(f"scalerMetadata.{key}: must not be empty (got {_echo(raw)})")
    elif len(value) > limit:
        problems.append(
            f"scalerMetadata.{key}: at most {limit} characters (got {len(value)} characters)"
        )
    return value


def metric_name(model: str) -> str:
    """The external metric name for `model`: `governor-` + lower-case [a-z0-9-] form.

    Example: `meta-llama/Llama-3.1-8B` -> `governor-meta-llama-llama-3-1-8b`.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return f"{METRIC_PREFIX}{slug or 'model'}"[:200]


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    """KEDA's external scaler, answering from `board`. `streams`: an optional limit on
    open streams (`StreamSlots`)."""

    def __init__(self, board: DecisionBoard, *, streams: StreamSlots | None = None) -> None:
        self.board = board
        self.streams = streams

    # ------------------------------------------------------------------ helpers
    async def _resolve(self, ref: pb.ScaledObjectRef, context: grpc.aio.ServicerContext) -> str:
        if len(ref.scalerMetadata) > MAX_METADATA_ENTRIES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"scalerMetadata: at most {MAX_METADATA_ENTRIES} entries "
                f"(got {len(ref.scalerMetadata)})",
            )
        try:
            meta = ScalerMetadata.parse(ref.scalerMetadata)
        except MetadataError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            entry = self.board.get(meta.model)
        except KeyError:
            known = ", ".join(self.board.models()) or "none"
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"scalerMetadata.model {meta.model!r} is not a configured model "
                f"(configured: {known})",
            )
        for namespace, whose in (
            (meta.namespace, "scalerMetadata.namespace"),
            (ref.namespace.strip()[:80] or None, "the ScaledObject's namespace: a "
             "ScaledObject for this model belongs in the model's namespace"),
        ):  # fmt: skip
            if namespace is not None and namespace != entry.namespace:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"model {meta.model!r} is configured in namespace {entry.namespace!r}, "
                    f"not {namespace!r} ({whose})",
                )
        return meta.model

    async def _known(self, model: str, context: grpc.aio.ServicerContext) -> Published:
        try:
            entry = self.board.get(model)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {model!r} was removed")
        if entry.replicas is None:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"no decision yet for model {model!r}; keep the current replica count",
            )
        return entry

    # ------------------------------------------------------------------ rpcs
    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        model = await self._resolve(request, context)
        spec = pb.MetricSpec(
            metricName=metric_name(model),
            targetSize=TARGET_SIZE,
            targetSizeFloat=float(TARGET_SIZE),
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        model = await self._resolve(request.scaledObjectRef, context)
        expected = metric_name(model)
        if request.metricName and request.metricName != expected:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"metricName {_echo(request.metricName)} is not served for model {model!r} "
                f"(expected {expected!r}, from GetMetricSpec)",
            )
        entry = await self._known(model, context)
        replicas = max(0, int(entry.replicas or 0))
        value = pb.MetricValue(
            metricName=expected, metricValue=replicas, metricValueFloat=float(replicas)
        )
        return pb.GetMetricsResponse(metricValues=[value])

    async def IsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        model = await self._resolve(request, context)
        entry = await self._known(model, context)
        return pb.IsActiveResponse(result=bool(entry.active))

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """The current value at open (once one is known), then each change. Ends with OK
        when the server shuts down; with NOT_FOUND when the model is removed or moved to
        another namespace than the ScaledObject's (as GetMetrics and IsActive answer
        then: a stream that kept pushing would let KEDA scale a workload the model no
        longer governs)."""
        model = await self._resolve(request, context)
        async with stream_slot(self.streams, context, "StreamIsActive"):
            last: bool | None = None
            async for _ in self.board.watch():
                try:
                    active = self.board.get(model).active
                except KeyError:
                    await context.abort(grpc.StatusCode.NOT_FOUND, f"model {model!r} was removed")
                await self._resolve(request, context)  # its namespace, as configured now
                if active is None or active == last:
                    continue
                last = active
                yield pb.IsActiveResponse(result=active)

    async def StreamMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "StreamMetricSpec is not implemented: the metric spec never changes "
            "(one metric, target 1); use GetMetricSpec",
        )
        yield pb.GetMetricSpecResponse()  # pragma: no cover - abort raises
