"""`GovernorServer`: the gRPC server (asyncio), /metrics and the ticker around a ServiceCore.

Serves the engines' `BatchingService` and KEDA's `ExternalScaler` (actuators.engines,
actuators.keda: read-only views of the decision board), the operators' `AdminService`
(service.admin) and the standard health and reflection services.

Graceful shutdown: health NOT_SERVING -> stop accepting -> end streams (board closed)
-> let in-flight calls finish within the grace period -> final state flush -> release
the Lease. Security (service.security): the admin API needs `authorization: Bearer
<token>` (the token from `--admin-token-file`, a mounted Secret); without a token it is
disabled. The engines' and KEDA's read-only APIs need none. TLS from PEM files,
optionally mTLS. Every unary request is parsed by the server itself (malformed bytes:
INVALID_ARGUMENT) and error messages are clipped.

Limits (each refusal names the limit): request message size (`MAX_REQUEST_BYTES`),
concurrent RPCs, concurrent watch streams (`MAX_WATCH_STREAMS`), configured models
(`service.core.MAX_MODELS`, for admin additions), models per GetStatus, string lengths
(model and engine names: 253 characters; everything else through the config models).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from typing import Any

import grpc
import structlog

from actuators.engines import BatchingServicer
from actuators.keda import ExternalScalerService
from controller.types import Knobs
from governor_api import externalscaler_pb2_grpc, governor_v1_pb2, governor_v1_pb2_grpc
from service.admin import AdminServicer
from service.core import ServiceCore
from service.security import (
    AdminAuthInterceptor,
    AdminToken,
    HardeningInterceptor,
    StreamLimiter,
    TlsFiles,
    server_credentials,
)
from service.ticker import TickScheduler

DEFAULT_GRPC_LISTEN = "0.0.0.0:50051"
DEFAULT_METRICS_LISTEN = "0.0.0.0:9464"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # largest response (GetStatus of many models), bytes
MAX_REQUEST_BYTES = 1024 * 1024  # largest request a client may send, bytes
MAX_CONCURRENT_RPCS = 2048
MAX_WATCH_STREAMS = 1024  # WatchBatchingConfig + StreamIsActive streams open at once
SHUTDOWN_GRACE_S = 10.0


def parse_listen(value: str, what: str = "address") -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::]:PORT`) -> (host, port); ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what} must be HOST:PORT (got {value!r})")
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what}: port must be 0-65535 (got {port!r} in {value!r})")
    return host, int(port)


class GovernorServer:
    """The gRPC server (asyncio), /metrics and the ticker around one ServiceCore.

    `grpc_listen`/`metrics_listen`: HOST:PORT (port 0: pick one; see `port` and
    `metrics_port` after `start`); `metrics_listen` None: no HTTP server.
    `autotick` False: the caller drives `core.tick()` (tests).
    `admin_token`: required on AdminService calls (service.security); None: the admin
    API is disabled unless `allow_unauthenticated_admin` (tests, loopback development).
    `tls`: serve TLS (mTLS with a client CA) instead of plaintext.
    `admin_listen`: HOST:PORT serving the AdminService (and health) alone, e.g. a
    loopback address reached with `kubectl port-forward`; the `grpc_listen` listener
    then serves only the engines' and KEDA's read-only APIs (admin calls there:
    UNIMPLEMENTED). None: everything on `grpc_listen`.
    `max_watch_streams`: open WatchBatchingConfig + StreamIsActive streams at most.
    `max_request_bytes`/`max_message_bytes`: largest request received / response sent.
    """

    def __init__(
        self,
        core: ServiceCore,
        *,
        grpc_listen: str = DEFAULT_GRPC_LISTEN,
        metrics_listen: str | None = DEFAULT_METRICS_LISTEN,
        autotick: bool = True,
        tick_interval_s: float | None = None,
        max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        max_watch_streams: int = MAX_WATCH_STREAMS,
        admin_token: AdminToken | None = None,
        allow_unauthenticated_admin: bool = False,
        tls: TlsFiles | None = None,
        admin_listen: str | None = None,
        logger: Any = None,
    ) -> None:
        self.core = core
        self.admin_listen = admin_listen
        self.max_request_bytes = max_request_bytes
        self.admin_token = admin_token
        self.allow_unauthenticated_admin = allow_unauthenticated_admin
        self.tls = tls
        self.streams = StreamLimiter(max_watch_streams, on_refused=core.m_streams_refused.inc)
        self.grpc_listen = grpc_listen
        self.metrics_listen = metrics_listen
        self.autotick = autotick
        self.tick_interval_s = tick_interval_s or core.config.policy.tick_interval_s
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.max_message_bytes = max_message_bytes
        self.log = logger or structlog.get_logger("governor.server")
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._admin_server: grpc.aio.Server | None = None
        self.admin_port: int | None = None
        self._health: Any = None
        self._httpd: Any = None
        self._ticker: TickScheduler | None = None
        parse_listen(grpc_listen, "--grpc-listen")
        if admin_listen is not None:
            parse_listen(admin_listen, "--admin-listen")
        if metrics_listen is not None:
            parse_listen(metrics_listen, "--metrics-listen")

    def _new_servers(self) -> tuple[grpc.aio.Server, grpc.aio.Server]:
        """The main server and the admin one (the same object without --admin-listen),
        with the interceptors (admin auth, hardening) and the channel options."""
        interceptors = [
            AdminAuthInterceptor(
                self.admin_token,
                allow_unauthenticated=self.allow_unauthenticated_admin,
                on_denied=self.core.m_admin_denied.inc,
            ),
            HardeningInterceptor(),
        ]
        options = [
            ("grpc.max_receive_message_length", self.max_request_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            ("grpc.so_reuseport", 0),
        ]

        def new_server() -> grpc.aio.Server:
            return grpc.aio.server(
                options=options,
                maximum_concurrent_rpcs=self.max_concurrent_rpcs,
                interceptors=interceptors,
            )

        server = new_server()
        return server, (server if self.admin_listen is None else new_server())

    async def start(self) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection

        streams = self.streams
        self.core.m_watch_streams.set_function(lambda: streams.active)
        server, admin_server = self._new_servers()
        governor_v1_pb2_grpc.add_BatchingServiceServicer_to_server(
            BatchingServicer(
                self.core.board,
                self.streams,
                on_engine=self.core.record_engine,
                ceilings=self._knob_ceiling,
            ),
            server,
        )
        governor_v1_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(self.core), admin_server
        )
        externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(
            ExternalScalerService(self.core.board, streams=self.streams), server
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        admin_name = governor_v1_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
        names = [
            governor_v1_pb2.DESCRIPTOR.services_by_name["BatchingService"].full_name,
            "externalscaler.ExternalScaler",
        ]
        if admin_server is server:
            names.insert(1, admin_name)
        else:
            health_pb2_grpc.add_HealthServicer_to_server(self._health, admin_server)
            reflection.enable_server_reflection(
                [admin_name, health.SERVICE_NAME, reflection.SERVICE_NAME], admin_server
            )
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.port = self._bind(server, self.grpc_listen, "--grpc-listen")
        if admin_server is not server:
            assert self.admin_listen is not None
            self.admin_port = self._bind(admin_server, self.admin_listen, "--admin-listen")
            await admin_server.start()
            self._admin_server = admin_server
        await server.start()
        self._server = server
        for name in ["", *names, admin_name]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._start_metrics_and_ticks()
        self._log_serving()

    def _knob_ceiling(self, model: str) -> Knobs | None:
        """The largest knobs the governor may choose for `model` (its knob bounds'
        maxima), served to engines that follow the knobs live; None if not configured."""
        try:
            kb = self.core.config.model(model).knobs
        except KeyError:
            return None
        return Knobs(kb.max_num_seqs_max, kb.max_num_batched_tokens_max)

    def _start_metrics_and_ticks(self) -> None:
        """The /metrics HTTP server, the elector and (with `autotick`) the ticker."""
        if self.metrics_listen is not None:
            from prometheus_client import start_http_server

            mhost, mport = parse_listen(self.metrics_listen, "--metrics-listen")
            self._httpd, _ = start_http_server(
                mport, addr=mhost, registry=self.core.metrics.registry
            )
            self.metrics_port = self._httpd.server_address[1]
        self.core.elector.start()
        if self.autotick:
            self._ticker = TickScheduler(
                self.core.tick,
                self.tick_interval_s,
                self.log,
                on_late=self.core.m_tick_lateness.observe,
            )
            self._ticker.start()

    def _log_serving(self) -> None:
        if self.admin_token is not None:
            admin = f"token from {self.admin_token.path}"
        elif self.allow_unauthenticated_admin:
            admin = "UNAUTHENTICATED (development only)"
        else:
            admin = "disabled (no admin token)"
        self.log.info(
            "serving",
            grpc_port=self.port,
            metrics_port=self.metrics_port,
            store=self.core.store.description,
            models=[m.name for m in self.core.config.models],
            identity=self.core.elector.identity,
            tls="mtls" if self.tls and self.tls.client_ca_file else ("tls" if self.tls else "off"),
            admin_api=admin,
            admin_port=self.admin_port or self.port,
            max_watch_streams=self.streams.limit,
        )

    def _bind(self, server: grpc.aio.Server, listen: str, flag: str) -> int:
        """Add the listener `listen` (TLS when configured); its port. OSError when it
        cannot listen."""
        host, port = parse_listen(listen, flag)
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self.tls is not None:
                return int(server.add_secure_port(bind, server_credentials(self.tls)))
            return int(server.add_insecure_port(bind))
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {listen} for gRPC ({flag}): {exc}") from None

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Graceful shutdown within `grace_s` seconds (see module doc)."""
        started = time.monotonic()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        stop_task = (
            asyncio.create_task(self._server.stop(grace_s)) if self._server is not None else None
        )
        admin_stop = (
            asyncio.create_task(self._admin_server.stop(grace_s))
            if self._admin_server is not None
            else None
        )
        self.core.board.close()  # ends watch streams: clients reconnect elsewhere
        waits: list[Any] = []
        if stop_task is not None:
            waits.append(stop_task)
        if admin_stop is not None:
            waits.append(admin_stop)
        if self._ticker is not None:
            self._ticker.stop()
            waits.append(asyncio.to_thread(self._ticker.wait_idle, grace_s))
        await asyncio.gather(*waits)
        left = max(0.5, grace_s - (time.monotonic() - started))
        try:
            await asyncio.wait_for(asyncio.to_thread(self.core.flush), left)
        except TimeoutError:
            self.log.error("final_flush_timed_out", grace_s=grace_s)
        await asyncio.to_thread(self.core.close)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        self.log.info("stopped", seconds=round(time.monotonic() - started, 3))


def serve(server: GovernorServer, grace_s: float = SHUTDOWN_GRACE_S) -> int:
    """Run `server` until SIGTERM or SIGINT, then shut down gracefully within `grace_s`
    seconds; returns 0 (the process exit status)."""
    return asyncio.run(_serve(server, grace_s))


async def _serve(server: GovernorServer, grace_s: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # A line for humans and for tests: where we listen (one write: not split by logs).
    admin = f", admin on port {server.admin_port}" if server.admin_port is not None else ""
    sys.stderr.write(
        f"governor: serving gRPC on port {server.port}, metrics on port {server.metrics_port}"
        f"{admin}\n"
    )
    sys.stderr.flush()
    await stop.wait()
    await server.stop(grace_s)
    return 0
