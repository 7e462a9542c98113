"""The /metrics HTTP listener (`--metrics-listen`): the governor's own metrics, bounded.

This module owns `serve_metrics`, which serves a prometheus_client registry in the
text exposition format at `GET /metrics`, on a thread per connection like
prometheus_client's `start_http_server`, with the limits that server does not have.
Its port is reachable by whatever scrapes it (the whole cluster, often); found in
review: twenty requests left unfinished held twenty threads for as long as their
clients kept the connections open, so enough of them would have exhausted the
process's threads or memory, and every path and method answered 200 with the metrics.

- At most `MAX_CONNECTIONS` connections are served at once; one past that is closed
  at once, unanswered (counted in `refused`; `on_refused` is called when refusals
  start, and again only after a connection has been served since).
- A connection waits at most `READ_TIMEOUT_S` for each read of its request, and is cut
  (socket shut down) `CONNECTION_DEADLINE_S` after it was accepted, however its request
  trickles in.
- Only `/metrics` is served (404 elsewhere, naming it); prometheus_client's app answers
  405 to a method other than GET (or OPTIONS). The request line and headers keep
  `http.server`'s own limits (414 past 64 KiB, 431 past 100 headers).

Units: seconds.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterable
from contextlib import suppress
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

MAX_CONNECTIONS: Final = 32
"""Connections served at once; Prometheus opens one per scrape."""

READ_TIMEOUT_S: Final = 10.0
"""Longest wait for each read of a request, seconds."""

CONNECTION_DEADLINE_S: Final = 30.0
"""A connection is cut this long after it was accepted, seconds."""

METRICS_PATH: Final = "/metrics"

_Start = Callable[[str, list[tuple[str, str]]], Any]


class _QuietHandler(WSGIRequestHandler):
    """A request handler that logs nothing and waits `READ_TIMEOUT_S` per read."""

    timeout = READ_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing (a scrape every few seconds)."""


class MetricsServer(ThreadingMixIn, WSGIServer):
    """A WSGI server of at most `MAX_CONNECTIONS` connections, each cut at its deadline.

    `on_refused`: called with the count of refused connections when refusals start."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[WSGIRequestHandler],
        on_refused: Callable[[int], None] | None = None,
        family: socket.AddressFamily = socket.AF_INET,
    ) -> None:
        self.address_family = family  # read when the socket is made (IPv6 hosts)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._on_refused = on_refused
        self._refusing = False
        self.refused = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            if not self._refusing and self._on_refused is not None:
                self._on_refused(self.refused)
            self._refusing = True
            return
        self._refusing = False
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        timer: threading.Timer | None = threading.Timer(CONNECTION_DEADLINE_S, _cut, (request,))
        try:
            timer.daemon = True
            timer.start()
        except RuntimeError:  # no thread left for it: the read timeout still bounds it
            timer = None
        try:
            super().process_request_thread(request, client_address)
        finally:
            if timer is not None:
                timer.cancel()
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or was cut (what the limits do to an idle or
        trickling client) ends quietly; anything else prints its traceback, as
        `socketserver` does (32 trickling clients had printed ~60 lines a second)."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def _cut(sock: socket.socket) -> None:
    """Shut down `sock` (a read blocked on it returns at once)."""
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def metrics_app(registry: CollectorRegistry) -> Callable[[dict[str, Any], _Start], Iterable[bytes]]:
    """The WSGI app: prometheus_client's for `registry` at `METRICS_PATH` (GET; 405 for
    any other method but OPTIONS), 404 elsewhere."""
    exposition = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: _Start) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"not found: the metrics are at {METRICS_PATH}\n".encode()]
        body: Iterable[bytes] = exposition(environ, start_response)
        return body

    return app


def serve_metrics(
    host: str,
    port: int,
    registry: CollectorRegistry,
    on_refused: Callable[[int], None] | None = None,
) -> tuple[MetricsServer, threading.Thread]:
    """Serve `registry` on HOST:PORT (port 0: a free one; `server_address` says which)
    from a daemon thread; stop with `shutdown()` then `server_close()`. Raises OSError
    when it cannot listen. `on_refused`: see `MetricsServer`."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)

    def build(address: tuple[str, int], handler: type[WSGIRequestHandler]) -> MetricsServer:
        return MetricsServer(address, handler, on_refused, family[0][0])

    httpd = make_server(host, port, metrics_app(registry), build, _QuietHandler)  # type: ignore[arg-type]
    assert isinstance(httpd, MetricsServer)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
