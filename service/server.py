"""`GovernorServer`: the gRPC listeners, /metrics and the ticker around a ServiceCore.

Serves the engines' `BatchingService` and KEDA's `ExternalScaler` (actuators.engines,
actuators.keda: read-only views of the decision board), the operators' `AdminService`
(service.admin) and the standard health and reflection services (service.listeners).

Where the listeners run (`serving`): "process" (the default of `governor run`) puts them
in a serving process of their own that mirrors the decision board (service.serving), so
engine and KEDA calls never wait on a tick's interpreter lock; admin calls are passed on
to this process. "inline" serves them from this process (tests, debugging): simpler,
but a tick of 1,000 models holds the interpreter for about a second.

Graceful shutdown: health NOT_SERVING -> stop accepting -> end streams (board closed)
-> let in-flight calls finish within the grace period -> final state flush -> release
the Lease. Security (service.security): the admin API needs `authorization: Bearer
<token>` (the token from `--admin-token-file`, a mounted Secret); without a token it is
disabled. The engines' and KEDA's read-only APIs need none. TLS from PEM files,
optionally mTLS. Every unary request is parsed by the server itself (malformed bytes:
INVALID_ARGUMENT) and error messages are clipped.

Limits (each refusal names the limit): request message size (`MAX_REQUEST_BYTES`),
concurrent RPCs, concurrent watch streams (`MAX_WATCH_STREAMS`, and per client host:
half of it unless given), configured models
(`service.core.MAX_MODELS`, for admin additions), models per GetStatus, string lengths
(model and engine names: 253 characters; everything else through the config models).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import replace
from typing import Any

import grpc
import structlog

from controller.loop import freeze_startup_heap
from service.admin import AdminServicer
from service.core import ServiceCore
from service.listeners import (
    DEFAULT_GRPC_LISTEN,
    MAX_CONCURRENT_RPCS,
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    MAX_WATCH_STREAMS,
    ListenerSpec,
    PublicListeners,
    parse_listen,
    with_port,
)
from service.security import AdminToken, StreamLimiter, TlsFiles
from service.serving import (
    HEARTBEAT_MISSES,
    HEARTBEAT_S,
    ServingProcess,
    internal_admin_server,
    remove_internal_admin,
)
from service.ticker import TickScheduler

__all__ = [
    "DEFAULT_GRPC_LISTEN",
    "DEFAULT_METRICS_LISTEN",
    "MAX_CONCURRENT_RPCS",
    "MAX_MESSAGE_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_WATCH_STREAMS",
    "SERVING_MODES",
    "SHUTDOWN_GRACE_S",
    "GovernorServer",
    "parse_listen",
    "serve",
]

DEFAULT_METRICS_LISTEN = "0.0.0.0:9464"
SHUTDOWN_GRACE_S = 10.0
SERVING_MODES = ("process", "inline")
TICK_NICE = 10  # the tick thread's nice with a serving process (service.ticker)


class GovernorServer:
    """The gRPC listeners, /metrics and the ticker around one ServiceCore.

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
    `max_watch_streams`: open WatchBatchingConfig + StreamIsActive streams at most (health
    and reflection streams included); `max_watch_streams_per_client`: at most this many
    of them from one client host (None: half of `max_watch_streams`).
    `max_request_bytes`/`max_message_bytes`: largest request received / response sent.
    `serving`: "inline" (default here: tests drive ticks and read at once) or
    "process" (see the module doc; `serving_process` after `start`); `log_level`: the
    serving process's. `tick_nice`: the tick thread's nice (service.ticker); default
    `TICK_NICE` with a serving process, 0 inline. `serving_heartbeat_s`,
    `serving_heartbeat_misses`: the serving process's liveness check (service.serving;
    heartbeat None: driven by the caller, tests).
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
        max_watch_streams_per_client: int | None = None,
        admin_token: AdminToken | None = None,
        allow_unauthenticated_admin: bool = False,
        tls: TlsFiles | None = None,
        admin_listen: str | None = None,
        serving: str = "inline",
        log_level: str = "info",
        tick_nice: int | None = None,
        serving_heartbeat_s: float | None = HEARTBEAT_S,
        serving_heartbeat_misses: int = HEARTBEAT_MISSES,
        logger: Any = None,
    ) -> None:
        if serving not in SERVING_MODES:
            raise ValueError(f"serving must be one of {SERVING_MODES} (got {serving!r})")
        self.core = core
        self.spec = ListenerSpec(
            grpc_listen=grpc_listen,
            admin_listen=admin_listen,
            max_concurrent_rpcs=max_concurrent_rpcs,
            max_message_bytes=max_message_bytes,
            max_request_bytes=max_request_bytes,
            max_watch_streams=max_watch_streams,
            max_watch_streams_per_client=max_watch_streams_per_client,
            admin_token=admin_token,
            allow_unauthenticated_admin=allow_unauthenticated_admin,
            tls=tls,
        )
        self.serving = serving
        # The tick yields the CPU to the serving process; inline it would be descheduled
        # holding the interpreter lock the listeners need, so there it keeps priority.
        default_nice = TICK_NICE if serving == "process" else 0
        self.tick_nice = default_nice if tick_nice is None else tick_nice
        self.log_level = log_level
        self.serving_heartbeat = (serving_heartbeat_s, serving_heartbeat_misses)
        self.streams = StreamLimiter(
            max_watch_streams,
            on_refused=core.m_streams_refused.inc,
            per_client=max_watch_streams_per_client,
        )
        self.metrics_listen = metrics_listen
        self.autotick = autotick
        self.tick_interval_s = tick_interval_s or core.config.policy.tick_interval_s
        self.log = logger or structlog.get_logger("governor.server")
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.admin_port: int | None = None
        self.serving_process: ServingProcess | None = None
        self._listeners: PublicListeners | None = None
        self._internal: grpc.aio.Server | None = None
        self._httpd: Any = None
        self._ticker: TickScheduler | None = None
        parse_listen(grpc_listen, "--grpc-listen")
        if admin_listen is not None:
            parse_listen(admin_listen, "--admin-listen")
        if metrics_listen is not None:
            parse_listen(metrics_listen, "--metrics-listen")

    async def start(self) -> None:
        """Start /metrics, the listeners (inline or in the serving process), the elector
        and the ticker. OSError naming the listener (address and flag) when one cannot
        bind; what was started before it is stopped again."""
        self._start_metrics()
        try:
            await self._start_listeners()
        except BaseException:
            self._stop_metrics()
            raise
        self.core.seed_targets()  # only a start that binds writes the store
        self._start_ticks()
        self._log_serving()

    async def _start_listeners(self) -> None:
        """The public listeners: inline, or in the serving process."""
        if self.serving == "process":
            await self._start_serving_process()
        else:
            streams = self.streams
            self.core.m_watch_streams.set_function(lambda: streams.active)
            self._listeners = PublicListeners(
                self.spec,
                self.core.board,
                AdminServicer(self.core),
                self.streams,
                on_engine=self.core.record_engine,
                on_denied=self.core.m_admin_denied.inc,
            )
            await self._listeners.start()
            self.core.m_serving_up.set(1)
            self.port, self.admin_port = self._listeners.port, self._listeners.admin_port

    async def _start_serving_process(self) -> None:
        """The internal admin server (a private Unix socket) and the serving process."""
        self._internal, admin = await internal_admin_server(
            AdminServicer(self.core), self.spec.max_request_bytes, self.spec.max_message_bytes
        )
        core = self.core
        proc = ServingProcess(
            core.board,
            self.spec,
            admin,
            log_level=self.log_level,
            on_engine=core.record_engine,
            on_denied=core.m_admin_denied.inc,
            on_refused=core.m_streams_refused.inc,
            on_restart=lambda reason: core.m_serving_restarts.labels(reason).inc(),
            heartbeat_s=self.serving_heartbeat[0],
            heartbeat_misses=self.serving_heartbeat[1],
        )
        core.m_watch_streams.set_function(lambda: proc.watch_streams)
        core.m_serving_up.set_function(lambda: int(proc.up))
        try:
            self.port, self.admin_port = await asyncio.to_thread(proc.start)
        except OSError:
            await self._internal.stop(0)
            remove_internal_admin(admin)
            raise
        self.serving_process = proc
        # A restarted serving process binds the ports the first one got.
        spec = replace(self.spec, grpc_listen=_port_of(self.spec.grpc_listen, self.port))
        if spec.admin_listen is not None and self.admin_port is not None:
            spec = replace(spec, admin_listen=_port_of(spec.admin_listen, self.admin_port))
        proc.spec = spec

    def _start_metrics(self) -> None:
        """The /metrics HTTP server (first: a busy port then leaves nothing started).
        OSError "cannot listen on HOST:PORT for /metrics (--metrics-listen): ..."."""
        if self.metrics_listen is None:
            return
        from service.metrics_http import MAX_CONNECTIONS, serve_metrics

        def refused(count: int) -> None:
            self.log.warning(
                "metrics_connections_refused",
                limit=MAX_CONNECTIONS,
                refused_total=count,
                hint="more /metrics connections open at once than served; logged again "
                "only after one has been served",
            )

        mhost, mport = parse_listen(self.metrics_listen, "--metrics-listen")
        try:
            self._httpd, _ = serve_metrics(mhost, mport, self.core.metrics.registry, refused)
        except OSError as exc:
            raise OSError(
                f"cannot listen on {self.metrics_listen} for /metrics (--metrics-listen): {exc}"
            ) from None
        self.metrics_port = self._httpd.server_address[1]

    def _stop_metrics(self) -> None:
        """Stop and close the /metrics HTTP server, if started."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def _start_ticks(self) -> None:
        """The elector and (with `autotick`) the ticker."""
        self.core.elector.start()
        if self.autotick:
            self._ticker = TickScheduler(
                self.core.tick,
                self.tick_interval_s,
                self.log,
                on_late=self.core.m_tick_lateness.observe,
                nice=self.tick_nice,
            )
            self._ticker.start()

    def _log_serving(self) -> None:
        spec = self.spec
        if spec.admin_token is not None:
            admin = f"token from {spec.admin_token.path}"
        elif spec.allow_unauthenticated_admin:
            admin = "UNAUTHENTICATED (development only)"
        else:
            admin = "disabled (no admin token)"
        tls = spec.tls
        self.log.info(
            "serving",
            grpc_port=self.port,
            metrics_port=self.metrics_port,
            store=self.core.store.description,
            models=[m.name for m in self.core.config.models],
            identity=self.core.elector.identity,
            tls="mtls" if tls and tls.client_ca_file else ("tls" if tls else "off"),
            admin_api=admin,
            admin_port=self.admin_port or self.port,
            max_watch_streams=spec.max_watch_streams,
            max_watch_streams_per_client=self.streams.per_client,
            serving=self.serving,
            serving_pid=self.serving_process.pid if self.serving_process else None,
        )

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Graceful shutdown within `grace_s` seconds (see module doc)."""
        started = time.monotonic()
        waits: list[Any] = []
        if self._listeners is not None:
            waits.append(asyncio.ensure_future(self._listeners.stop(grace_s)))
        if self.serving_process is not None:
            # The serving process ends its calls and streams first: admin calls in
            # flight there still reach the internal server meanwhile.
            waits.append(asyncio.ensure_future(self._stop_serving_process(grace_s)))
        self.core.board.close()
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
        self._stop_metrics()
        self.log.info("stopped", seconds=round(time.monotonic() - started, 3))

    async def _stop_serving_process(self, grace_s: float) -> None:
        assert self.serving_process is not None
        await asyncio.to_thread(self.serving_process.stop, grace_s)
        if self._internal is not None:
            await self._internal.stop(1.0)
        remove_internal_admin(self.serving_process.admin)


def _port_of(listen: str, port: int | None) -> str:
    return listen if port is None else with_port(listen, port)


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
    freeze_startup_heap()  # started: what lives now is never garbage (controller.loop)
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
