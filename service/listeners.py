"""The public gRPC listeners: engines', KEDA's and operators' servers over a decision board.

`PublicListeners` builds the `--grpc-listen` server (BatchingService, KEDA's
ExternalScaler, health, reflection, and the AdminService unless `--admin-listen` gives
it a listener of its own) with the security interceptors (admin auth, hardening), the
channel options and TLS, starts it and stops it gracefully. The same code runs in the
serving process (service.serving) and, in the inline mode, in the governor's own
process (service.server): the listeners, their interceptors and their limits are the
same whichever process holds them. `ListenerSpec` is the plain, picklable description
of them that crosses to the serving process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from actuators.engines import BatchingServicer
from actuators.keda import ExternalScalerService
from actuators.publisher import DecisionBoard
from governor_api import externalscaler_pb2_grpc, governor_v1_pb2, governor_v1_pb2_grpc
from service.security import (
    AdminAuthInterceptor,
    AdminToken,
    CallLimiter,
    HardeningInterceptor,
    StreamLimiter,
    TlsFiles,
    server_credentials,
)

DEFAULT_GRPC_LISTEN = "0.0.0.0:50051"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # largest response (GetStatus of many models), bytes
MAX_REQUEST_BYTES = 1024 * 1024  # largest request a client may send, bytes
MAX_CONCURRENT_RPCS = 2048
MAX_WATCH_STREAMS = 1024  # WatchBatchingConfig + StreamIsActive streams open at once
# ... and from one client host: None is half of max_watch_streams
# (service.security.default_streams_per_client, which says why)
MAX_WATCH_STREAMS_PER_CLIENT: int | None = None
CONNECTION_IDLE_MS = 300_000
"""A connection without a call open this long is closed (GOAWAY; a client reconnects at
its next call), ms. Watch streams keep theirs open; KEDA polls every 30 s by default."""
HANDSHAKE_TIMEOUT_MS = 20_000
"""A connection that has not finished its TLS handshake and HTTP/2 preface this long
after it was accepted is closed, ms (grpc's own default is 120 s)."""


def parse_listen(value: str, what: str = "address", lowest_port: int = 0) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::]:PORT`) -> (host, port); ValueError naming the problem.
    `lowest_port`: 0 for a listener (0 picks a free port), 1 for an address to call."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what} must be HOST:PORT (got {value!r})")
    host = host.strip("[]")
    if not (port.isascii() and port.isdigit()) or not lowest_port <= int(port) <= 65535:
        raise ValueError(f"{what}: port must be {lowest_port}-65535 (got {port!r} in {value!r})")
    return host, int(port)


def with_port(listen: str, port: int) -> str:
    """`listen` with its port replaced: `0.0.0.0:0`, 50051 -> `0.0.0.0:50051`."""
    host, _ = parse_listen(listen)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ListenerSpec:
    """The public listeners: addresses (HOST:PORT, port 0 picks one), limits (RPCs,
    bytes, watch streams in all and per client host; None: half of them) and security
    (admin token, unauthenticated admin for loopback development, TLS files). See
    service.server.GovernorServer."""

    grpc_listen: str = DEFAULT_GRPC_LISTEN
    admin_listen: str | None = None
    max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_watch_streams: int = MAX_WATCH_STREAMS
    max_watch_streams_per_client: int | None = MAX_WATCH_STREAMS_PER_CLIENT
    admin_token: AdminToken | None = None
    allow_unauthenticated_admin: bool = False
    tls: TlsFiles | None = None


_ADMIN = governor_v1_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
_BATCHING = governor_v1_pb2.DESCRIPTOR.services_by_name["BatchingService"].full_name
_KEDA = "externalscaler.ExternalScaler"


class PublicListeners:
    """The public gRPC servers of `spec` over `board` (see the module doc).

    `admin`: the AdminService servicer (the core's, or the serving process's proxy to
    it), registered as a servicer object or a generic handler. `streams`: the watch
    stream limit. `on_engine(model, engine_id)`: an engine asked (status).
    `on_denied()`: an admin call was refused for its credentials (a metric).
    """

    def __init__(
        self,
        spec: ListenerSpec,
        board: DecisionBoard,
        admin: Any,
        streams: StreamLimiter,
        *,
        on_engine: Callable[[str, str], None] | None = None,
        on_denied: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.board = board
        self.admin = admin
        self.streams = streams
        self.on_engine = on_engine
        self.on_denied = on_denied
        self.port: int | None = None
        self.admin_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._admin_server: grpc.aio.Server | None = None
        self._health: Any = None
        rpcs = spec.max_concurrent_rpcs
        self._calls = CallLimiter(rpcs, per_client=max(1, rpcs // 2))
        """Calls in progress, per client host (HardeningInterceptor)."""

    def _new_servers(self) -> tuple[grpc.aio.Server, grpc.aio.Server]:
        """The main server and the admin one (the same object without an admin
        listener), with the interceptors (admin auth, hardening) and channel options."""
        spec = self.spec
        interceptors = [
            AdminAuthInterceptor(
                spec.admin_token,
                allow_unauthenticated=spec.allow_unauthenticated_admin,
                on_denied=self.on_denied,
            ),
            # health/reflection streams: bounded too; calls from one host: half the slots
            HardeningInterceptor(self.streams, self._calls),
        ]
        options = [
            ("grpc.max_receive_message_length", spec.max_request_bytes),
            ("grpc.max_send_message_length", spec.max_message_bytes),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # Keepalive pings a client may send on a connection without data (an idle
            # watch stream: the engine plugin pings every 30 s). The key is grpc's
            # GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS; the constant's name
            # misspelt as the key had left grpc's 5 minutes in force, and idle engine
            # streams were cut ("too_many_pings") about every 90 s.
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ("grpc.so_reuseport", 0),
            # Connections that hold nothing: any number of them had been kept, an idle
            # one for good and a silent one for a minute (~11 KB and a descriptor each).
            ("grpc.max_connection_idle_ms", CONNECTION_IDLE_MS),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ]

        def new_server() -> grpc.aio.Server:
            return grpc.aio.server(
                options=options,
                maximum_concurrent_rpcs=spec.max_concurrent_rpcs,
                interceptors=interceptors,
            )

        server = new_server()
        return server, (server if spec.admin_listen is None else new_server())

    def _add_services(self, server: grpc.aio.Server, admin_server: grpc.aio.Server) -> list[str]:
        """Register the servicers; the names of the services `server` serves."""
        governor_v1_pb2_grpc.add_BatchingServiceServicer_to_server(
            BatchingServicer(
                self.board, self.streams, on_engine=self.on_engine, ceilings=self.board.ceiling
            ),
            server,
        )
        if isinstance(self.admin, grpc.GenericRpcHandler):
            admin_server.add_generic_rpc_handlers((self.admin,))
        else:
            governor_v1_pb2_grpc.add_AdminServiceServicer_to_server(self.admin, admin_server)
        externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(
            ExternalScalerService(self.board, streams=self.streams), server
        )
        return [_BATCHING, _ADMIN, _KEDA] if admin_server is server else [_BATCHING, _KEDA]

    async def start(self) -> None:
        """Bind and start (OSError when a listener cannot bind); SERVING afterwards."""
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection

        server, admin_server = self._new_servers()
        names = self._add_services(server, admin_server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if admin_server is not server:
            health_pb2_grpc.add_HealthServicer_to_server(self._health, admin_server)
            reflection.enable_server_reflection(
                [_ADMIN, health.SERVICE_NAME, reflection.SERVICE_NAME], admin_server
            )
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.port = self._bind(server, self.spec.grpc_listen, "--grpc-listen")
        if admin_server is not server:
            assert self.spec.admin_listen is not None
            self.admin_port = self._bind(admin_server, self.spec.admin_listen, "--admin-listen")
            await admin_server.start()
            self._admin_server = admin_server
        await server.start()
        self._server = server
        for name in ["", _BATCHING, _KEDA, _ADMIN]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def _bind(self, server: grpc.aio.Server, listen: str, flag: str) -> int:
        """Add the listener `listen` (TLS when configured); its port. OSError when it
        cannot listen."""
        host, port = parse_listen(listen, flag)
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self.spec.tls is not None:
                return int(server.add_secure_port(bind, server_credentials(self.spec.tls)))
            return int(server.add_insecure_port(bind))
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {listen} for gRPC ({flag}): {exc}") from None

    async def stop(self, grace_s: float) -> None:
        """Graceful stop within `grace_s` seconds: health NOT_SERVING -> no new calls ->
        the board closed (watch streams end with OK, clients reconnect elsewhere) ->
        in-flight calls finish."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        stops = [s.stop(grace_s) for s in (self._server, self._admin_server) if s is not None]
        tasks = [asyncio.ensure_future(s) for s in stops]
        self.board.close()
        await asyncio.gather(*tasks)
