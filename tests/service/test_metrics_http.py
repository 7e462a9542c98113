"""The /metrics listener (service.metrics_http) over real loopback sockets: what it
serves, and the limits prometheus_client's own server lacked (connections at once,
a deadline per connection, a timeout per read). The limits are patched small so each
test runs in well under a second; the assertions are on what the server does to the
connection (answers, closes unanswered), never on how long it took."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

import service.metrics_http as mh

_WAIT_S = 20.0
"""The longest a test waits for the server to answer or close: far past every limit."""


@pytest.fixture
def server() -> Iterator[mh.MetricsServer]:
    registry = CollectorRegistry()
    Counter("governor_demo_total", "a counter", registry=registry).inc(3)
    refusals: list[int] = []
    httpd, _ = mh.serve_metrics("127.0.0.1", 0, registry, refusals.append)
    httpd.refusals = refusals  # type: ignore[attr-defined]
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def _connect(server: mh.MetricsServer) -> socket.socket:
    sock = socket.create_connection(server.server_address[:2], timeout=_WAIT_S)
    return sock


def _ask(server: mh.MetricsServer, request: bytes) -> bytes:
    """The whole answer to `request` (until the server closes)."""
    with _connect(server) as sock:
        sock.sendall(request)
        return _read_all(sock)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_serves_the_registry_at_metrics(server: mh.MetricsServer) -> None:
    answer = _ask(server, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200")
    assert b"governor_demo_total 3.0" in answer


@pytest.mark.parametrize(
    ("request_line", "status", "says"),
    [
        (b"GET /nope HTTP/1.0", b"404", b"the metrics are at /metrics"),
        (b"GET / HTTP/1.0", b"404", b"the metrics are at /metrics"),
        (b"POST /metrics HTTP/1.0", b"405", b"Allow: OPTIONS,GET"),
        (b"DELETE /metrics HTTP/1.0", b"405", b"Allow: OPTIONS,GET"),
    ],
)
def test_other_paths_and_methods_are_refused(
    server: mh.MetricsServer, request_line: bytes, status: bytes, says: bytes
) -> None:
    """Every path and method had answered 200 with the metrics."""
    answer = _ask(server, request_line + b"\r\nContent-Length: 0\r\n\r\n")
    assert answer.split(b"\r\n")[0].split(b" ")[1] == status
    assert says in answer and b"governor_demo_total" not in answer


def test_connections_past_the_limit_are_closed_unanswered(
    server: mh.MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_CONNECTIONS unfinished requests hold every slot: the next connection is
    closed at once, unanswered (it had a thread of its own, as each of the unfinished
    ones kept, for as long as its client held it); refusals are reported once; once
    the held ones close, a scrape is served again."""
    held = [_connect(server) for _ in range(mh.MAX_CONNECTIONS)]
    try:
        for sock in held:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        for _ in range(3):
            assert _ask(server, b"GET /metrics HTTP/1.0\r\n\r\n") == b""
        assert server.refused == 3
        assert server.refusals == [1]  # type: ignore[attr-defined]
    finally:
        for sock in held:
            sock.close()
    freed = threading.Event()
    for _ in range(int(_WAIT_S / 0.05)):  # the held handlers see their EOF and leave
        answer = _ask(server, b"GET /metrics HTTP/1.0\r\n\r\n")
        if answer:
            freed.set()
            break
        freed.wait(0.05)
    assert freed.is_set() and answer.startswith(b"HTTP/1.0 200")


def test_a_trickled_request_is_cut_at_the_deadline(
    server: mh.MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each byte comes well within the per-read timeout, for far longer than the
    connection's deadline: the server shuts the connection, unanswered."""
    monkeypatch.setattr(mh, "CONNECTION_DEADLINE_S", 0.3)
    pause = threading.Event()
    with _connect(server) as sock:
        request = b"GET /metrics HTTP/1.1\r\nX: " + b"y" * 1200  # inside every size limit
        with pytest.raises(OSError):  # the server shut it: a write fails ...
            for i in range(len(request)):
                sock.sendall(request[i : i + 1])
                pause.wait(0.01)
            raise AssertionError("sent 1,226 bytes over ~12 s without being cut")
    assert server.refused == 0


def test_a_silent_connection_is_closed_after_the_read_timeout(
    server: mh.MetricsServer, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Closed, unanswered, and quietly: socketserver printed a traceback of ~18 lines
    for each such connection (what 32 trickling clients would keep doing)."""
    monkeypatch.setattr(mh._QuietHandler, "timeout", 0.2)
    monkeypatch.setattr(mh, "CONNECTION_DEADLINE_S", 600.0)
    with _connect(server) as sock:
        assert _read_all(sock) == b""
    assert "Traceback" not in capfd.readouterr().err


def test_a_connection_whose_deadline_cannot_start_is_served_and_frees_its_slot(
    server: mh.MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No thread left for the deadline's timer: the scrape is still served, and its
    slot freed (one leaked per such connection, and after MAX_CONNECTIONS of them
    every scrape was refused)."""

    class NoTimer(threading.Timer):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(mh.threading, "Timer", NoTimer)
    for _ in range(mh.MAX_CONNECTIONS + 2):
        assert _ask(server, b"GET /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 200")
    assert server.refused == 0
