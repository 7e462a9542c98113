"""The serving process: the public gRPC listeners in a process of their own.

A tick of 1,000 models holds the governor's interpreter for about a second; engine and
KEDA calls answered by the same interpreter waited for it. `ServingProcess` (in the
governor, the parent) starts `python -m service.serving_child`, which runs the public
listeners (service.listeners: the same servers, interceptors, TLS and limits as the
inline mode) over a mirror of the decision board, and keeps that mirror current:

- Feed (parent -> child, a private socket pair, pickled tuples): the spec first, then a
  full snapshot of the board (entries, slots), then after every change only the entries
  that changed and the models removed, as plain values in chunks of `FEED_CHUNK`
  entries. The parent's board notifies the feed (also of the changes that wake no
  watcher: latency distributions, knob ceilings), and a feed thread sends, so neither
  the tick nor an admin edit ever waits on the pipe. A watch stream in the child sees a
  new decision milliseconds after the tick published it.
- Reports (child -> parent): `ready` with the bound ports (or `failed` naming why it
  cannot listen), then `stats`: admin calls refused for credentials and watch streams
  refused (running totals, counted into the parent's metrics by difference), open
  watch streams, and the engines seen since the last report (new ones, and each active
  one again every minute: service.engines_seen; GetStatus). /metrics stays
  in the parent and exports them under the same names.
- Admin calls: the child passes them, after its own authentication, to the parent's
  AdminService on a private Unix socket (a 0700 directory) with a per-start secret
  bearer token (`internal_admin_server`).

Failure handling. The child exits when the parent is gone (EOF on the feed), within
its short grace, so it never serves stale decisions for long; KEDA then sees the
governor gone (docs/deploy.md). When the child dies, the parent starts another on the
same ports (back-off `RESTART_BACKOFF_S` doubling to `RESTART_BACKOFF_MAX_S`, reset
after a child served `RESTART_RESET_S`) and sends the full snapshot again; a start
that fails (fork/exec refused: EAGAIN, EMFILE, ENOMEM; the spec not delivered) is
logged and tried again after the next back-off, until a child starts or the governor
stops, so one failure never ends the restarts (nothing else would ever start one: in
sidecar mode no probe restarts the pod). The child
binds its listeners only after it holds that snapshot, so it never answers from an
empty board. Ticks, the store, leader election and the actuators stay in the parent;
decider state never crosses the boundary.

Liveness. A child that hangs without dying (stopped, deadlocked, its event loop
blocked) is killed and restarted the same way: every `HEARTBEAT_S` the parent sends a
("ping", n) on the feed; the child's feed thread hands it to its event loop, which has
its report thread answer ("pong", n), so an answer proves the feed, the event loop that
serves the gRPC calls and the reports all run. After `HEARTBEAT_MISSES` beats in a row
without an answer the parent kills the child (reason "unresponsive" in the log and in
governor_serving_restarts_total). Beats are counted in the parent's own time: a tick
that holds the parent's interpreter or a starved parent sends no beats, so it can
never count as misses; a child that answers late but answers resets the count. A
restarted child that is not ready within `READY_TIMEOUT_S` is killed the same way.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import structlog

from actuators.publisher import DecisionBoard, LatencyDistribution, ModelSlot, Published
from controller.types import Knobs
from estimators.types import LatencyQuantiles
from service.listeners import ListenerSpec
from service.security import AdminToken, HardeningInterceptor

READY_TIMEOUT_S = 60.0
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 10.0
RESTART_RESET_S = 60.0
STOP_MARGIN_S = 5.0  # beyond the grace period, before the child is killed
HEARTBEAT_S = 2.0
HEARTBEAT_MISSES = 5
"""Seconds between heartbeats, and unanswered beats in a row before the child is killed
(10 s): a child busy with 1,000 streams answers within milliseconds, and the count stops
while the parent itself is stalled (module doc). Below the kubelet's liveness probe
(3 failures 10 s apart): a hung child is replaced before the whole pod is restarted."""


@dataclass(frozen=True)
class InternalAdmin:
    """Where the serving process passes admin calls: a Unix socket address and the
    bearer token it must send."""

    address: str
    token: str


@dataclass(frozen=True)
class ServingSpec:
    """What the serving process is started with (pickled over the feed)."""

    listeners: ListenerSpec
    admin: InternalAdmin
    log_level: str
    max_message_bytes: int


async def internal_admin_server(
    servicer: Any, max_request_bytes: int, max_message_bytes: int
) -> tuple[grpc.aio.Server, InternalAdmin]:
    """The parent's AdminService for the serving process only: a Unix socket in a
    fresh 0700 directory, calls without the per-start token refused."""
    from governor_api import governor_v1_pb2_grpc
    from service.security import AdminAuthInterceptor

    token = secrets.token_urlsafe(32)
    directory = Path(tempfile.mkdtemp(prefix="governor-admin-"))
    address = f"unix:{directory / 'admin.sock'}"
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ],
        interceptors=[
            AdminAuthInterceptor(AdminToken.from_value(token)),
            HardeningInterceptor(),
        ],
    )
    governor_v1_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
    server.add_insecure_port(address)
    await server.start()
    return server, InternalAdmin(address, token)


def remove_internal_admin(admin: InternalAdmin) -> None:
    """Remove the internal admin server's socket and its directory."""
    shutil.rmtree(Path(admin.address.removeprefix("unix:")).parent, ignore_errors=True)


FEED_CHUNK = 100
"""Board entries per feed message: the serving process decodes one message (about 1 ms
for 100 entries) between answering calls, never a whole tick's worth at once."""


def board_messages(
    entries: Mapping[str, Published], slots: Mapping[str, ModelSlot], removed: list[str]
) -> list[tuple[Any, ...]]:
    """("board", encoded entries, slots, removed, last) messages carrying a change of
    the board, `FEED_CHUNK` entries each; `last` marks the end of the change."""
    encoded = [encode_entry(p) for p in entries.values()]
    chunks = [encoded[i : i + FEED_CHUNK] for i in range(0, len(encoded), FEED_CHUNK)] or [[]]
    return [
        (
            "board",
            chunk,
            dict(slots) if i == 0 else {},
            removed if i == 0 else [],
            i == len(chunks) - 1,
        )
        for i, chunk in enumerate(chunks)
    ]


def _quantiles(q: LatencyQuantiles) -> tuple[float | None, ...]:
    return (q.p50_ms, q.p90_ms, q.p95_ms, q.p99_ms)


def encode_entry(p: Published) -> tuple[Any, ...]:
    """A board entry as plain values (pickled about 10x faster than the dataclasses)."""
    d = p.latency
    latency = (
        None
        if d is None
        else (_quantiles(d.ttft), _quantiles(d.itl), _quantiles(d.e2e), d.observed_at_unix_s)
    )
    k = p.knobs
    return (p.model, p.namespace, k.max_num_seqs, k.max_num_batched_tokens, p.generation,
            p.replicas, p.reason, p.decided_at_unix_s, p.origin, latency)  # fmt: skip


def decode_entry(t: tuple[Any, ...]) -> Published:
    """The inverse of `encode_entry`."""
    model, namespace, seqs, tokens, generation, replicas, reason, decided, origin, lat = t
    latency = None
    if lat is not None:
        ttft, itl, e2e, at = lat
        latency = LatencyDistribution(
            LatencyQuantiles(*ttft), LatencyQuantiles(*itl), LatencyQuantiles(*e2e), at
        )
    return Published(model, namespace, Knobs(seqs, tokens), generation, replicas, reason,
                     decided, origin, latency)  # fmt: skip


class _Link:
    """One serving child: its process, the feed connection and what it was sent."""

    def __init__(
        self, proc: subprocess.Popen[bytes], conn: Connection, started_mono: float
    ) -> None:
        self.proc = proc
        self.conn = conn
        self.send_lock = threading.Lock()
        self.dirty = threading.Event()
        self.ready = threading.Event()
        self.ports: tuple[int, int | None] | None = None
        self.failure: str | None = None
        self.started_mono = started_mono
        self.sent: dict[str, Published] = {}
        self.sent_slots: dict[str, ModelSlot] = {}
        self.totals = (0, 0)  # admin denied, streams refused, as last reported
        self.watch_streams = 0
        self.gone = False
        self.beats = 0  # heartbeats due (the feed sends the latest), answered up to `acked`
        self.acked = 0
        self.ping_due = False
        self.killed_for: str | None = None  # why the parent killed it (the log, the metric)

    def send(self, message: tuple[Any, ...]) -> None:
        with self.send_lock:
            self.conn.send(message)


class ServingProcess:
    """The serving child of one governor (see the module doc).

    `board`: the parent's decision board (mirrored). `spec`: its listeners (after
    `start`, with the bound ports). `admin`: the internal admin server. Callbacks, all
    from a feed thread: `on_engine(model, engine_id)`, `on_denied()`, `on_refused()`
    (once per refused admin call / watch stream), `on_restart(reason)` (a child was
    restarted: "exited" or "unresponsive"). `heartbeat_s`: seconds between heartbeats
    (None: no heartbeat thread, the caller calls `beat()`: tests);
    `heartbeat_misses`: unanswered beats in a row before the child is killed;
    `ready_timeout_s`: how long a child may take to listen; `clock`: monotonic seconds.
    `popen`: starts the child process (`subprocess.Popen`; tests inject failures).
    `sleep(s)`: waits `s` seconds between restart attempts, True when stopping (default:
    a wait on the stop; tests record the back-off instead of waiting).
    """

    def __init__(
        self,
        board: DecisionBoard,
        spec: ListenerSpec,
        admin: InternalAdmin,
        *,
        log_level: str = "info",
        on_engine: Callable[[str, str], None] | None = None,
        on_denied: Callable[[], None] | None = None,
        on_refused: Callable[[], None] | None = None,
        on_restart: Callable[[str], None] | None = None,
        heartbeat_s: float | None = HEARTBEAT_S,
        heartbeat_misses: int = HEARTBEAT_MISSES,
        ready_timeout_s: float = READY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
        sleep: Callable[[float], bool] | None = None,
        logger: Any = None,
    ) -> None:
        if heartbeat_misses < 1 or (heartbeat_s is not None and heartbeat_s <= 0):
            raise ValueError("heartbeat_s must be > 0 and heartbeat_misses >= 1")
        self.board = board
        self.spec = spec
        self.admin = admin
        self.log_level = log_level
        self.on_engine = on_engine or (lambda model, engine: None)
        self.on_denied = on_denied or (lambda: None)
        self.on_refused = on_refused or (lambda: None)
        self.on_restart = on_restart or (lambda reason: None)
        self.heartbeat_s = heartbeat_s
        self.heartbeat_misses = heartbeat_misses
        self.ready_timeout_s = ready_timeout_s
        self.clock = clock
        self.popen = popen
        self.log = logger or structlog.get_logger("governor.serving")
        self.restarts = 0
        self._link: _Link | None = None
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._unsubscribe = board.subscribe(self._poke, quiet=True)

    # ------------------------------------------------------------------ public
    @property
    def pid(self) -> int | None:
        link = self._link
        return link.proc.pid if link is not None else None

    @property
    def watch_streams(self) -> int:
        """Open watch streams in the serving process, as last reported."""
        link = self._link
        return link.watch_streams if link is not None and not link.gone else 0

    @property
    def up(self) -> bool:
        """Whether a child listens and answers its heartbeats (at most the beat just
        sent unanswered): governor_serving_up."""
        link = self._link
        return (
            link is not None
            and link.ready.is_set()
            and link.ports is not None
            and not link.gone
            and link.killed_for is None
            and link.beats - link.acked <= 1
        )

    @property
    def beats_answered(self) -> int:
        """Heartbeats the current child answered (tests wait on it)."""
        link = self._link
        return link.acked if link is not None else 0

    @property
    def beats_asked(self) -> int:
        """Heartbeats asked of the current child."""
        link = self._link
        return link.beats if link is not None else 0

    def start(self) -> tuple[int, int | None]:
        """Start the first child and wait until it listens: (port, admin port or None),
        then the heartbeats. OSError naming why when it cannot listen or does not start
        within `ready_timeout_s`."""
        link = self._spawn()
        if not link.ready.wait(self.ready_timeout_s) or link.ports is None:
            self._stopping.set()
            self._kill(link)
            raise OSError(
                link.failure or f"the serving process did not start in {self.ready_timeout_s} s"
            )
        if self.heartbeat_s is not None:
            threading.Thread(target=self._heartbeats, name="serving-heartbeat", daemon=True).start()
        return link.ports

    def beat(self) -> bool:
        """One heartbeat: kill the child when `heartbeat_misses` beats in a row went
        unanswered (or a restarted one is not ready after `ready_timeout_s`), else ask
        for one more answer. Whether it killed the child (it is then restarted by the
        reports thread, as a child that died)."""
        link = self._link
        if link is None or link.gone or link.killed_for is not None or self._stopping.is_set():
            return False
        if not link.ready.is_set():
            waited_s = self.clock() - link.started_mono
            if waited_s <= self.ready_timeout_s:
                return False
            return self._kill_unresponsive(link, f"not listening after {waited_s:.1f} s")
        missed = link.beats - link.acked
        if missed >= self.heartbeat_misses:
            return self._kill_unresponsive(link, f"{missed} heartbeats in a row unanswered")
        link.beats += 1
        link.ping_due = True
        link.dirty.set()
        return False

    def _heartbeats(self) -> None:
        assert self.heartbeat_s is not None
        while not self._stopping.wait(self.heartbeat_s):
            self.beat()

    def _kill_unresponsive(self, link: _Link, why: str) -> bool:
        link.killed_for = why
        self.log.error(
            "serving_process_unresponsive",
            pid=link.proc.pid,
            why=why,
            heartbeat_s=self.heartbeat_s,
            action="killed; restarted on the same ports",
        )
        with contextlib.suppress(OSError):
            link.proc.kill()  # the reports thread sees the end and restarts it
        link.dirty.set()
        return True

    def wait_serving(self, pid_not: int | None, timeout_s: float) -> int | None:
        """Block until a child other than `pid_not` serves (tests: after a kill); its
        pid, or None after `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                link = self._link
                if link is not None and link.proc.pid != pid_not and link.ready.is_set():
                    return link.proc.pid
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)

    def stop(self, grace_s: float) -> None:
        """Stop the child gracefully (its calls finish within `grace_s` seconds, its
        streams end with OK), killed if still running `STOP_MARGIN_S` later; no restart."""
        self._stopping.set()
        self._unsubscribe()
        link = self._link
        if link is None:
            return
        # From a thread: a hung child that reads nothing must not block the stop.
        threading.Thread(
            target=self._send_quietly, args=(link, ("stop", grace_s)), daemon=True
        ).start()
        try:
            link.proc.wait(grace_s + STOP_MARGIN_S)
        except subprocess.TimeoutExpired:
            self.log.error("serving_process_stop_timed_out", pid=link.proc.pid)
            self._kill(link)
        link.dirty.set()  # the feed thread sees the stop and ends

    # ------------------------------------------------------------------ children
    @staticmethod
    def _send_quietly(link: _Link, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError, ValueError):
            link.send(message)

    def _spawn(self, ports: tuple[int, int | None] | None = None) -> _Link:
        """Start a child (`ports`: those a restarted child binds again). OSError or
        ValueError when it cannot be started or sent its spec: nothing is left behind
        (the process killed, the sockets closed) and the current link is unchanged."""
        parent_end, child_end = socket.socketpair()
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
        try:
            proc = self.popen(
                [sys.executable, "-m", "service.serving_child", str(child_end.fileno())],
                pass_fds=(child_end.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        link = _Link(proc, Connection(parent_end.detach()), self.clock())
        link.ports = ports
        spec = ServingSpec(self.spec, self.admin, self.log_level, self.spec.max_message_bytes)
        try:
            link.send(("spec", spec))
        except BaseException:
            link.gone = True
            self._kill(link)
            with contextlib.suppress(OSError):
                link.conn.close()
            raise
        with self._lock:
            self._link = link
        link.dirty.set()  # the first feed message: the full snapshot
        threading.Thread(target=self._feed, args=(link,), name="serving-feed", daemon=True).start()
        threading.Thread(
            target=self._reports, args=(link,), name="serving-reports", daemon=True
        ).start()
        self.log.info("serving_process_started", pid=proc.pid)
        return link

    def _kill(self, link: _Link) -> None:
        with contextlib.suppress(OSError):
            link.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            link.proc.wait(10)

    def _poke(self) -> None:
        link = self._link
        if link is not None:
            link.dirty.set()

    def _feed(self, link: _Link) -> None:
        """Send the board to `link`: the full snapshot first, then each change."""
        full = True
        while not link.gone:
            link.dirty.wait()
            link.dirty.clear()
            if link.gone or self._stopping.is_set() or self.board.closed:
                return
            try:
                if link.ping_due:
                    link.ping_due = False
                    link.send(("ping", link.beats))
                for message in self._board_messages(link, full):
                    link.send(message)
            except (OSError, ValueError):
                return  # the child is gone: the reports thread restarts it
            full = False

    def _board_messages(self, link: _Link, full: bool) -> list[tuple[Any, ...]]:
        """The board messages with what changed since the last ones sent to `link`
        (everything when `full`); none when nothing did (see `board_messages`)."""
        entries, slots = self.board.snapshot(), self.board.slots()
        if full:
            changed, changed_slots = entries, slots
        else:
            changed = {k: v for k, v in entries.items() if link.sent.get(k) != v}
            changed_slots = {k: v for k, v in slots.items() if link.sent_slots.get(k) != v}
        removed = [k for k in link.sent if k not in entries]
        if not (full or changed or changed_slots or removed):
            return []
        link.sent, link.sent_slots = entries, slots
        return board_messages(changed, changed_slots, removed)

    def _reports(self, link: _Link) -> None:
        """Read `link`'s reports until it is gone; then restart it unless stopping."""
        try:
            while True:
                self._on_report(link, link.conn.recv())
        except (EOFError, OSError):
            pass
        link.gone = True
        link.dirty.set()
        code = link.proc.wait()
        with contextlib.suppress(OSError):
            link.conn.close()
        with self._lock:
            self._lock.notify_all()
        if self._stopping.is_set() or link.ports is None:
            link.ready.set()  # start() reads the failure
            return
        reason = "unresponsive" if link.killed_for is not None else "exited"
        self.log.error("serving_process_exited", pid=link.proc.pid, exit_code=code, reason=reason)
        self._restart(link, reason)

    def _restart(self, dead: _Link, reason: str) -> None:
        """Start a child in place of `dead` on its ports, after the back-off; a start
        that fails is logged and tried again after the next back-off (doubling to
        `RESTART_BACKOFF_MAX_S` seconds) until one starts or the governor stops."""
        served_s = self.clock() - dead.started_mono
        delay = RESTART_BACKOFF_S if served_s >= RESTART_RESET_S else self._backoff
        counted = False
        while True:
            if self._stopping.is_set() or self._sleep(delay):
                return
            self._backoff = min(RESTART_BACKOFF_MAX_S, delay * 2)
            if not counted:
                counted = True
                self.restarts += 1
                with contextlib.suppress(Exception):
                    self.on_restart(reason)
            try:
                self._spawn(dead.ports)  # the same ports (if taken: `failed`, and a restart)
                return
            except Exception as exc:  # fork/exec refused, the spec not delivered
                delay = self._backoff
                self.log.error(
                    "serving_process_start_failed",
                    error=repr(exc),
                    retry_in_s=delay,
                    action="retrying until a serving process starts",
                )

    _backoff = RESTART_BACKOFF_S

    def _on_report(self, link: _Link, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            link.ports = (message[1], message[2])
            link.ready.set()
            with self._lock:
                self._lock.notify_all()
        elif kind == "failed":
            link.failure = message[1]
            self.log.error("serving_process_failed", error=message[1])
        elif kind == "pong":
            link.acked = max(link.acked, int(message[1]))
        elif kind == "stats":
            _, denied, refused, active, engines = message
            old_denied, old_refused = link.totals
            link.totals = (denied, refused)
            link.watch_streams = active
            for _ in range(max(0, denied - old_denied)):
                self.on_denied()
            for _ in range(max(0, refused - old_refused)):
                self.on_refused()
            for model, engine in engines:
                self.on_engine(model, engine)
