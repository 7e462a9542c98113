"""The serving process's own side: `python -m service.serving_child FD` (started by
service.serving.ServingProcess, never by hand).

Reads the spec and the first board snapshot from the feed (the socket FD), then binds
the public listeners (service.listeners) over a mirror of the board, reports `ready`,
applies every later board message to the mirror, reports its counters and the engines
it saw, answers the parent's heartbeats from its event loop (service.serving, Liveness)
and passes admin calls to the parent (`AdminProxy`). Stops gracefully when the
parent says so, on SIGTERM, or when the feed ends (the parent is gone: never serve
stale decisions for long). SIGINT is left to the parent (a terminal's Ctrl-C reaches
both; the parent stops the child in order).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import grpc
import structlog

from actuators.publisher import DecisionBoard
from governor_api import governor_v1_pb2
from service.engines_seen import REPORT_REFRESH_S, EngineTracker
from service.listeners import PublicListeners
from service.security import StreamLimiter
from service.serving import InternalAdmin, ServingSpec, decode_entry

PARENT_GONE_GRACE_S = 2.0


class AdminProxy(grpc.GenericRpcHandler):
    """AdminService calls passed to the parent's internal admin server, with the
    caller's deadline; the parent's status code and message come back as they are."""

    def __init__(self, admin: InternalAdmin, max_message_bytes: int) -> None:
        self._channel = grpc.aio.insecure_channel(
            admin.address, options=[("grpc.max_receive_message_length", max_message_bytes)]
        )
        self._metadata = (("authorization", f"Bearer {admin.token}"),)
        service = governor_v1_pb2.DESCRIPTOR.services_by_name["AdminService"]
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in service.methods:
            request_cls = getattr(governor_v1_pb2, method.input_type.name)
            response_cls = getattr(governor_v1_pb2, method.output_type.name)
            path = f"/{service.full_name}/{method.name}"
            forward = self._channel.unary_unary(
                path,
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            self._handlers[path] = grpc.unary_unary_rpc_method_handler(
                self._forwarder(forward),
                request_deserializer=request_cls.FromString,
                response_serializer=response_cls.SerializeToString,
            )

    def _forwarder(self, forward: Any) -> Any:
        metadata = self._metadata

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await forward(request, timeout=context.time_remaining(), metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")

        return call

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._handlers.get(handler_call_details.method)

    async def close(self) -> None:
        await self._channel.close()


class _Reporter:
    """Sends the child's counters, the engines seen and heartbeat answers to the parent
    from a thread of its own (the event loop never waits on the feed). An engine is
    reported when it first asks and again at most every `REPORT_REFRESH_S` seconds
    while it keeps asking (service.engines_seen); `clock`: monotonic seconds."""

    def __init__(
        self, conn: Connection, lock: threading.Lock, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.conn = conn
        self.lock = lock
        self.denied = 0
        self.refused = 0
        self.streams: StreamLimiter | None = None
        self.engines = EngineTracker(clock)
        self._new: list[tuple[str, str]] = []
        self._mutex = threading.Lock()
        self._poked = threading.Event()
        self._stats_due = False
        self._pong = 0  # the last heartbeat the event loop answered; `_ponged` sent
        self._ponged = 0
        self.closed = False

    def engine(self, model: str, engine_id: str) -> None:
        if not self.engines.record(model, engine_id, REPORT_REFRESH_S):
            return
        with self._mutex:
            self._new.append((model, engine_id))
        self.poke()

    def on_denied(self) -> None:
        self.denied += 1
        self.poke()

    def on_refused(self) -> None:
        self.refused += 1
        self.poke()

    def poke(self) -> None:
        self._stats_due = True
        self._poked.set()

    def pong(self, beat: int) -> None:
        """Answer heartbeat `beat` (called on the event loop: the answer proves it runs)."""
        self._pong = max(self._pong, beat)
        self._poked.set()

    def run(self) -> None:
        while True:
            self._poked.wait()
            self._poked.clear()
            if self.closed:
                return
            messages: list[tuple[Any, ...]] = []
            if self._pong != self._ponged:
                self._ponged = self._pong
                messages.append(("pong", self._ponged))
            if self._stats_due:
                self._stats_due = False
                with self._mutex:
                    new, self._new = self._new, []
                active = self.streams.active if self.streams is not None else 0
                messages.append(("stats", self.denied, self.refused, active, new))
            try:
                with self.lock:
                    for message in messages:
                        self.conn.send(message)
            except (OSError, ValueError):
                return


def _mirror(board: DecisionBoard, message: tuple[Any, ...]) -> bool:
    """Apply one board message (service.serving.board_messages); whether it was the
    last of its change."""
    _, encoded, slots, removed, last = message
    board.mirror({t[0]: decode_entry(t) for t in encoded}, slots, removed)
    return bool(last)


def _read_feed(
    conn: Connection,
    board: DecisionBoard,
    loop: asyncio.AbstractEventLoop,
    stop: Any,
    reporter: _Reporter,
) -> None:
    """Apply the parent's board messages, pass its heartbeats to the event loop (which
    has `reporter` answer them), until `stop` or the end of the feed."""
    log = structlog.get_logger("governor.serving")
    try:
        while True:
            message = conn.recv()
            if message[0] == "board":
                _mirror(board, message)
                if message[3]:  # models removed: forget their engines
                    reporter.engines.retain(board.models())
            elif message[0] == "ping":
                loop.call_soon_threadsafe(reporter.pong, int(message[1]))
            elif message[0] == "stop":
                loop.call_soon_threadsafe(stop, float(message[1]))
                return
    except (EOFError, OSError):
        log.warning("serving_parent_gone", note="the governor process ended; stopping")
        loop.call_soon_threadsafe(stop, PARENT_GONE_GRACE_S)


async def _serve(conn: Connection, spec: ServingSpec, board: DecisionBoard) -> int:
    lock = threading.Lock()
    reporter = _Reporter(conn, lock)
    proxy = AdminProxy(spec.admin, spec.max_message_bytes)
    streams = StreamLimiter(
        spec.listeners.max_watch_streams,
        on_refused=reporter.on_refused,
        on_change=reporter.poke,
        per_client=spec.listeners.max_watch_streams_per_client,
    )
    reporter.streams = streams
    listeners = PublicListeners(
        spec.listeners,
        board,
        proxy,
        streams,
        on_engine=reporter.engine,
        on_denied=reporter.on_denied,
    )
    try:
        await listeners.start()
    except OSError as exc:
        with lock:
            conn.send(("failed", str(exc)))
        return 1
    with lock:
        conn.send(("ready", listeners.port, listeners.admin_port))
    threading.Thread(target=reporter.run, name="serving-reports", daemon=True).start()
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    grace = [PARENT_GONE_GRACE_S]

    def stop(grace_s: float) -> None:
        grace[0] = grace_s
        done.set()

    loop.add_signal_handler(signal.SIGTERM, stop, PARENT_GONE_GRACE_S)
    reader = threading.Thread(
        target=_read_feed,
        args=(conn, board, loop, stop, reporter),
        name="serving-feed",
        daemon=True,
    )
    reader.start()
    await done.wait()
    await listeners.stop(grace[0])
    reporter.closed = True
    reporter.poke()
    await proxy.close()
    return 0


def main(argv: list[str]) -> int:
    """The serving process: FD is its end of the feed's socket pair."""
    from controller.logs import configure_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    try:
        kind, spec = conn.recv()
        assert kind == "spec", kind
        configure_logging(spec.log_level)
        board = DecisionBoard()
        while not _mirror(board, conn.recv()):  # the full snapshot: never serve an empty board
            pass
    except (EOFError, OSError):
        return 1
    # The feed thread gives the GIL back every millisecond (default 5 ms) while it
    # decodes: calls wait at most that long for it.
    sys.setswitchinterval(0.001)
    return asyncio.run(_serve(conn, spec, board))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
