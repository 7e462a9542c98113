"""The ceiling of the gRPC stack on this machine: a minimal grpcio (asyncio) server.

This owns the reference server the gRPC benchmark compares `governor run` against: the
same generated services and the same grpc.aio server as the governor's, with handlers
that return one constant, pre-built message each (BatchingService.GetBatchingConfig,
ExternalScaler.GetMetrics, WatchBatchingConfig sends one message and idles) and nothing
else: no validation, no board, no control loop, default server options.

Run: `python -m benchmarks.grpc_ceiling`; prints `grpc-ceiling: port N` on stdout once
listening and serves until killed (SIGTERM) or stdin closes.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import grpc

from governor_api import externalscaler_pb2 as es
from governor_api import externalscaler_pb2_grpc as es_grpc
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc

PORT_LINE = "grpc-ceiling: port "

CONFIG = pb.BatchingConfig(
    model="model-00000",
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    generation=1,
    reason="KNOBS_UNCHANGED",
    decided_at_unix_s=1_800_000_000.0,
    engine_args=["--max-num-seqs", "256", "--max-num-batched-tokens", "8192"],
)
METRICS = es.GetMetricsResponse(
    metricValues=[
        es.MetricValue(metricName="governor-model-00000", metricValue=3, metricValueFloat=3.0)
    ]
)


class Batching(pb_grpc.BatchingServiceServicer):
    async def GetBatchingConfig(self, request: Any, context: Any) -> pb.BatchingConfig:
        return CONFIG

    async def WatchBatchingConfig(self, request: Any, context: Any) -> Any:
        yield CONFIG
        await asyncio.Event().wait()


class Scaler(es_grpc.ExternalScalerServicer):
    async def GetMetrics(self, request: Any, context: Any) -> es.GetMetricsResponse:
        return METRICS


async def _serve() -> None:
    server = grpc.aio.server()
    pb_grpc.add_BatchingServiceServicer_to_server(Batching(), server)
    es_grpc.add_ExternalScalerServicer_to_server(Scaler(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"{PORT_LINE}{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main() -> int:
    asyncio.run(_serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
