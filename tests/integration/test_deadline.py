"""The overall deadline on the governor's Prometheus requests (estimators.deadline).

A real HTTP server on a loopback port sends its answer (or its headers) one byte at a
time, each byte well inside the per-read timeout, for far longer than the deadline:
`requests`' timeout alone let such an answer hold the start's scrape-interval check and
the control loop's queries for as long as it kept dripping. Each test asserts the
request fails as a deadline, not that it took some time (no timing assertions); a drip
that is let finish answers correctly, so a missing deadline fails the assertion.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from estimators.deadline import DEADLINE_FACTOR, DeadlineExceeded, deadline_s, deadline_session
from estimators.prometheus import PrometheusSource
from estimators.scrape import engine_scrape_interval_s
from estimators.types import SourceError

TIMEOUT_S = 0.2
"""The requests' timeout, seconds: the deadline is DEADLINE_FACTOR x it."""

DRIP_S = 0.01
"""Seconds between two bytes of a dripped answer: inside the per-read timeout."""

_WAIT_S = 60.0
"""The longest a test waits for a forked child's answer, seconds: far past any deadline."""
"""Seconds between two bytes of a dripped answer: inside the per-read timeout."""

_TARGETS = {"data": {"activeTargets": [{"labels": {"job": "vllm"}, "scrapeInterval": "30s"}]}}
_JOBS = {"data": {"result": [{"metric": {"job": "vllm"}, "value": [1.0, "1"]}]}}
_TIME = {"status": "success", "data": {"resultType": "scalar", "result": [1.7e9, "1.7e9"]}}


class _Dripper(ThreadingHTTPServer):
    """Answers Prometheus's API; `drip` is "body", "headers" or "" (at once)."""

    daemon_threads = True

    def __init__(self, drip: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.drip = drip
        self.stop = threading.Event()
        self.ends: queue.Queue[str] = queue.Queue()
        """How each answer ended: "cut" (the client shut the connection) or "sent"."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Dripper

    def log_message(self, *_args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._answer(urlparse(self.path).query)

    def do_POST(self) -> None:
        self._answer(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())

    def do_CONNECT(self) -> None:  # as an HTTPS proxy: its answer to CONNECT
        self._answer("")

    def _answer(self, form: str) -> None:
        query = parse_qs(form).get("query", [""])[0]
        if self.path.startswith("/api/v1/targets"):
            doc: Any = _TARGETS
        else:
            doc = _TIME if query == "time()" else _JOBS
        body = json.dumps(doc).encode() + b" " * 2000  # about 20 s when dripped
        head = (
            f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Pad: {' ' * 2000}\r\n\r\n"
        ).encode()
        try:
            self._write(head, self.server.drip == "headers")
            self._write(body, self.server.drip == "body")
        except OSError:
            self.server.ends.put("cut")
        else:
            self.server.ends.put("sent")

    def _write(self, data: bytes, drip: bool) -> None:
        if not drip:
            self.wfile.write(data)
            return
        for i in range(len(data)):
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()
            if self.server.stop.wait(DRIP_S):
                return


def _serve(drip: str) -> Iterator[_Dripper]:
    server = _Dripper(drip)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def _ended(server: _Dripper) -> str:
    """How the server's first answer ended (waits for it: "sent" after the whole drip,
    about 20 s, when nothing cut it)."""
    return server.ends.get(timeout=120.0)


@pytest.fixture(params=["body", "headers"])
def dripping(request: pytest.FixtureRequest) -> Iterator[_Dripper]:
    yield from _serve(request.param)


@pytest.fixture
def prompt() -> Iterator[_Dripper]:
    yield from _serve("")


def test_the_start_check_gives_up_on_a_dripped_answer(dripping: _Dripper) -> None:
    assert engine_scrape_interval_s(dripping.url, timeout_s=TIMEOUT_S) is None
    assert _ended(dripping) == "cut"  # not left dripping after the client gave up


def test_the_loop_query_fails_as_a_deadline(dripping: _Dripper) -> None:
    source = PrometheusSource(dripping.url, window_s=60.0, timeout_s=TIMEOUT_S)
    with pytest.raises(SourceError, match=r"DeadlineExceeded.*deadline"):
        source.server_time_s()
    assert _ended(dripping) == "cut"


def test_a_prompt_answer_is_read(prompt: _Dripper) -> None:
    """The control: the same server answering at once is read (the failures above are
    the deadline's, not the fake's)."""
    assert engine_scrape_interval_s(prompt.url, timeout_s=TIMEOUT_S) == 30.0
    assert PrometheusSource(prompt.url, window_s=60.0, timeout_s=1.0).server_time_s() == 1.7e9


def test_a_session_request_raises_deadline_exceeded(dripping: _Dripper) -> None:
    with deadline_session() as session, pytest.raises(DeadlineExceeded, match=r"0\.4 s deadline"):
        session.get(f"{dripping.url}/api/v1/targets", timeout=TIMEOUT_S)


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [(None, None), (3.0, 3.0 * DEADLINE_FACTOR), ((1.0, 2.0), 3.0 * DEADLINE_FACTOR)],
)
def test_deadline_of_a_timeout(timeout: Any, seconds: float | None) -> None:
    assert deadline_s(timeout) == seconds


def test_a_trickled_proxy_connect_answer_is_cut() -> None:
    """HTTPS through an HTTP proxy ($HTTPS_PROXY): the proxy's answer to CONNECT is read
    while connecting, before any answer of the request itself; a proxy trickling it
    had held the request past its deadline for as long as it trickled."""
    for proxy in _serve("headers"):
        with deadline_session() as session, pytest.raises(DeadlineExceeded):
            session.get(
                "https://prometheus.invalid/api/v1/targets",
                proxies={"https": proxy.url},
                timeout=TIMEOUT_S,
            )
        assert _ended(proxy) == "cut"


class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps(_TIME).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_connection_back_in_the_pool_leaves_the_watch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kept-alive connection goes back to the session's pool after its answer, where
    another thread's request may take it: the finished request's watch no longer holds
    its socket, so that request's deadline can never cut the other's."""
    import estimators.deadline as deadline

    watches: list[Any] = []

    class Recorded(deadline._Watch):
        def __init__(self) -> None:
            super().__init__()
            watches.append(self)

    monkeypatch.setattr(deadline, "_Watch", Recorded)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with deadline_session() as session:
            url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/query"
            for _ in range(2):  # a new connection, then the pooled one
                assert session.get(url, timeout=5.0).json() == _TIME
    finally:
        server.shutdown()
        server.server_close()
    assert len(watches) == 2
    assert [w._socks for w in watches] == [[], []]


def test_a_urllib3_timeout_keeps_requests_own_bounds() -> None:
    from urllib3.util import Timeout

    assert deadline_s(Timeout(connect=1.0, read=2.0)) is None


def test_one_watchdog_thread_serves_every_request(
    prompt: _Dripper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a thread per request (eight a tick), and none started by the requests
    themselves: a thread inherits the nice value of the thread that starts it, and
    the tick thread runs niced (test_process's tick-nice test)."""
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    with deadline_session() as session:
        monkeypatch.setattr(threading.Thread, "start", counted)
        for _ in range(5):
            session.get(f"{prompt.url}/api/v1/targets", timeout=1.0)
        monkeypatch.undo()
    assert "http-deadline" not in started
    assert [t.name for t in threading.enumerate()].count("http-deadline") == 1


def test_a_forked_child_gets_its_own_watchdog(prompt: _Dripper) -> None:
    """A child forked while the watchdog's lock was held (the watchdog thread takes it
    for each request, briefly) would wait for it forever: the child's watchdog starts
    afresh, and its requests read and are watched."""
    import multiprocessing

    import estimators.deadline as deadline

    with deadline_session() as session:
        session.get(f"{prompt.url}/api/v1/targets", timeout=1.0)  # the parent's watchdog
    ctx = multiprocessing.get_context("fork")
    held, forked = threading.Event(), threading.Event()

    def hold() -> None:  # another thread holds the lock at the fork, as the watchdog may
        with deadline._WATCHDOG._cond:
            held.set()
            forked.wait(_WAIT_S)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(_WAIT_S)
    try:
        pool = ctx.Pool(1)
    finally:
        forked.set()
        holder.join()
    with pool:
        answer = pool.apply_async(_child_reads, (prompt.url,))
        assert answer.get(timeout=_WAIT_S) == (30.0, 1)


def _child_reads(url: str) -> tuple[float | None, int]:
    """In a forked child: the scrape interval read, and the watchdog threads alive."""
    seconds = engine_scrape_interval_s(url, timeout_s=1.0)
    return seconds, [t.name for t in threading.enumerate()].count("http-deadline")
