"""An overall deadline on an HTTP request made with `requests`: connect to last byte.

This module owns `deadline_session`, the `requests.Session` the governor's Prometheus
clients use (the source's queries, the drain's, the start's scrape-interval check).

`requests`' `timeout` bounds connecting and each read of the socket, not the whole
answer: a Prometheus, or a proxy in front of it, that sends one byte every 0.5 s
holds a request with a 1 s timeout as long as it keeps dripping, and with it the
control loop's tick (found in review: the start's check held 8 s past a 1 s timeout).
The session's requests are watched: a request still running `DEADLINE_FACTOR` x its
timeout after it started has the sockets it uses shut down, which ends any read
blocked on them, and raises `DeadlineExceeded` (a `requests.Timeout`) whatever the
transport then raised or returned (a body cut at the deadline is never read as an
answer). The factor leaves the timeout to Prometheus's evaluation (the source sends the
same timeout as the query's server-side `timeout`) and as much again to the transfer.

How: the session's adapter builds urllib3 pools of connections that register their
socket with the calling thread's watch once connected, or when a pooled one starts
reading an answer, and unregister it when the connection goes back to the pool
(`_WatchedMixin`, `_PoolMixin`); one watchdog thread (`_Watchdog`) shuts down the
registered sockets at the deadline, and again every `_RECHECK_S` while the request has
not returned (one connected just before the deadline registers after it). Resolving
the host name and connecting (each address it resolves to) have no socket to cut yet:
they stay bounded by `requests`' connect timeout alone (the request still raises
DeadlineExceeded once they end past the deadline), as does a request through a SOCKS
proxy (its manager builds other pools).

Units: seconds (`timeout`, deadlines: `time.monotonic`).
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, Final

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

DEADLINE_FACTOR: Final = 2.0
"""A request's deadline, in multiples of its `timeout` (seconds; a (connect, read)
pair counts as their sum)."""

_RECHECK_S: Final = 0.05
"""After the deadline, how often the watchdog shuts down sockets registered since."""


class DeadlineExceeded(requests.Timeout):
    """A request that had not completed (last byte read) by its deadline."""


class _Watch:
    """The sockets one request on one thread reads its answer from, cut at its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: list[Any] = []
        self.expired = False
        self.done = False
        """Set when the request returned: the watchdog forgets it."""

    def add(self, sock: Any) -> None:
        """Register `sock`, which this request uses from now on."""
        with self._lock:
            self._socks.append(sock)

    def discard(self, sock: Any) -> None:
        """Unregister `sock`: its connection went back to the pool, where another
        request may take it (a redirected request's first hop)."""
        with self._lock:
            self._socks = [s for s in self._socks if s is not sock]

    def cut(self) -> None:
        """Mark the request expired and shut down every registered socket (a blocked
        read then returns at once)."""
        with self._lock:
            if self.done:
                return
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            with suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """The one thread that cuts every watched request at its deadline, and again every
    `_RECHECK_S` after it until the request returns. One thread for the process, not
    one per request (eight queries a tick); started with the first session, on the
    thread that makes it (`governor run`'s main thread: a thread inherits its
    creator's nice value, and the tick thread runs niced)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread unless it runs; RuntimeError when no thread can start."""
        with self._cond:
            if self._thread is not None and self._thread.is_alive():
                return
            thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)
            thread.start()
            self._thread = thread

    def watch(self, watch: _Watch, at: float) -> None:
        """Cut `watch` at `at` (time.monotonic) unless it is done by then."""
        with self._cond:
            heapq.heappush(self._due, (at, next(self._seq), watch))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._due and self._due[0][2].done:
                    heapq.heappop(self._due)
                if not self._due:
                    self._cond.wait()
                    continue
                at, _, watch = self._due[0]
                now = time.monotonic()
                if at > now:
                    self._cond.wait(at - now)
                    continue
                heapq.heapreplace(self._due, (now + _RECHECK_S, next(self._seq), watch))
            watch.cut()


_WATCHDOG: Final = _Watchdog()
# A forked child has no watchdog thread, and may have forked while it held the lock:
# it starts afresh (a replay's worker processes query Prometheus too).
os.register_at_fork(after_in_child=lambda: _WATCHDOG.__init__())  # type: ignore[misc]

_local = threading.local()


def _watching() -> _Watch | None:
    """The watch of the request running on this thread, if any."""
    watch: _Watch | None = getattr(_local, "watch", None)
    return watch


class _WatchedMixin:
    """A urllib3 connection that registers its socket with the calling thread's watch:
    a new socket as soon as it is connected (before an HTTPS proxy's CONNECT answer and
    the TLS handshake are read), a pooled one when it starts reading an answer. (An
    answer that will close the connection leaves the connection without its socket;
    the response keeps it, registered.)"""

    def _new_conn(self) -> Any:
        sock = super()._new_conn()  # type: ignore[misc]
        _register(sock)
        return sock

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        _register(getattr(self, "sock", None))
        return super().getresponse(*args, **kwargs)  # type: ignore[misc]


def _register(sock: Any) -> None:
    """Register `sock` with the calling thread's watch, if any."""
    watch = _watching()
    if watch is not None and sock is not None and hasattr(sock, "shutdown"):
        watch.add(sock)


class _PoolMixin:
    """A urllib3 pool that unregisters a connection's socket when it is put back."""

    def _put_conn(self, conn: Any) -> None:
        watch = _watching()
        sock = getattr(conn, "sock", None)
        if watch is not None and sock is not None:
            watch.discard(sock)
        super()._put_conn(conn)  # type: ignore[misc]


class _WatchedConnection(_WatchedMixin, HTTPConnection):
    """urllib3's `HTTPConnection`, watched."""


class _WatchedHTTPSConnection(_WatchedMixin, HTTPSConnection):
    """urllib3's `HTTPSConnection`, watched."""


class _WatchedPool(_PoolMixin, HTTPConnectionPool):
    """`HTTPConnectionPool` of watched connections."""

    ConnectionCls = _WatchedConnection


class _WatchedHTTPSPool(_PoolMixin, HTTPSConnectionPool):
    """`HTTPSConnectionPool` of watched connections."""

    ConnectionCls = _WatchedHTTPSConnection


_POOLS: Final = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


class DeadlineAdapter(HTTPAdapter):
    """`HTTPAdapter` whose pools (direct and through an HTTP proxy) watch connections."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


def deadline_s(timeout: Any) -> float | None:
    """The deadline (seconds after the start) of a request with `requests` timeout
    `timeout` (a number or a (connect, read) pair); None without a timeout, or with one
    of another kind (a urllib3 `Timeout`: requests' own bounds only)."""
    parts = timeout if isinstance(timeout, tuple) else (timeout,)
    if not all(p is None or isinstance(p, int | float) for p in parts):
        return None
    known = [float(p) for p in parts if p is not None]
    return DEADLINE_FACTOR * sum(known) if known else None


@contextmanager
def watched(seconds: float | None) -> Iterator[_Watch]:
    """Run the requests made on this thread inside the block under one deadline,
    `seconds` from now (None: no deadline). Raises `DeadlineExceeded` at the block's end
    when the deadline passed during it, whatever the block raised or returned."""
    watch = _Watch()
    if seconds is None:
        yield watch
        return
    try:
        _WATCHDOG.start()
    except RuntimeError as exc:  # no thread left: the request is not made
        raise requests.RequestException(f"cannot watch the request's deadline: {exc}") from exc
    started = time.monotonic()
    previous = _watching()
    _local.watch = watch
    _WATCHDOG.watch(watch, started + seconds)
    try:
        yield watch
    except Exception as exc:
        if watch.expired:
            raise _exceeded(seconds, started) from exc
        raise
    finally:
        with watch._lock:
            watch.done = True
        _local.watch = previous
    if watch.expired:
        raise _exceeded(seconds, started)


def _exceeded(seconds: float, started: float) -> DeadlineExceeded:
    """The error of a request cut at its deadline."""
    took = time.monotonic() - started
    return DeadlineExceeded(
        f"no complete answer within the {seconds:g} s deadline (cut after {took:.1f} s)"
    )


def deadline_session(verify: bool = True) -> requests.Session:
    """A `requests.Session` whose every request with a timeout completes (last byte
    read) within `DEADLINE_FACTOR` x that timeout or raises `DeadlineExceeded`.
    `verify`: check TLS certificates. An adapter mounted on it later must be a
    `DeadlineAdapter` too: only its connections are cut at the deadline. Starts the
    watchdog thread (`_Watchdog`) unless it runs; RuntimeError when it cannot."""
    _WATCHDOG.start()
    session = requests.Session()
    session.verify = verify
    session.mount("http://", DeadlineAdapter())
    session.mount("https://", DeadlineAdapter())
    plain = session.request

    def request(*args: Any, **kwargs: Any) -> Any:
        stream = kwargs.get("stream", False)
        with watched(None if stream else deadline_s(kwargs.get("timeout"))):
            return plain(*args, **kwargs)

    session.request = request  # type: ignore[method-assign]
    return session
