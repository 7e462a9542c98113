"""Leader election: only the leader actuates (and writes state). Kubernetes Lease
(coordination.k8s.io/v1) with client-go's algorithm, or `AlwaysLeader` for a single
instance without a cluster.

LeaseElector, one `step()` per `retry_period_s` (default 2 s) on its own thread:

- GET the Lease; absent -> create it holding it ourselves.
- Someone else holds it: it counts as held until `lease_duration_s` (default 10 s) after
  we last *saw the record change* (time on our monotonic clock, as client-go does, so
  clock skew between nodes does not matter). After that we take it over with a PUT that
  carries the resourceVersion we read; a 409 means another candidate won.
- We hold it: renew (PUT renewTime) every step. If renewing fails for
  `renew_deadline_s` (default 7 s < lease_duration_s) we stop acting as leader before
  anyone else may take over, so two leaders never actuate at once.

Timing (defaults: lease 10 s, renew deadline 7 s, request timeout 2 s). Both sides
count from a monotonic time taken at the start of a step, before its requests: the
leader's renew deadline from the start of the step whose renewal (or create)
succeeded, so it stops acting at most 7 s after that renewal was committed on the API
server; a follower's lease from the start of the step whose GET first showed that
renewal. That GET was served after the commit and answered within its 2 s timeout, so
it started at most 2 s before the commit, and the follower takes over no earlier than
commit - 2 + 10 = commit + 8 s: at least 1 s after the leader stopped, however slow the
answers (up to the timeout). This needs request timeout < lease - renew deadline (2 < 3 s).
(Counting the leader's deadline from the PUT's answer instead, up to 2 s after the
commit, let both be leaders for up to 1 s.) The Lease's leaseDurationSeconds (an
integer) is `lease_duration_s` rounded up, never down.

Failover: a dead leader's last renewal is seen by a follower within one retry period and
expires `lease_duration_s` later; the follower's next step takes over: at most
10 + 2 + 2 = 14 s < 15 s with the defaults. A leader shutting down gracefully releases
the Lease (empty holder), so a follower takes over at its next step.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from actuators.kubeapi import KubeCallError, call_with_retries


class Elector(Protocol):
    """Who actuates. `is_leader()` is cheap and thread-safe."""

    identity: str

    def is_leader(self) -> bool: ...

    def leader_identity(self) -> str: ...

    def start(self) -> None: ...

    def stop(self, release: bool = True) -> None: ...


class AlwaysLeader:
    """A single instance: always the leader."""

    def __init__(self, identity: str = "governor") -> None:
        self.identity = identity

    def is_leader(self) -> bool:
        return True

    def leader_identity(self) -> str:
        return self.identity

    def start(self) -> None:
        return None

    def stop(self, release: bool = True) -> None:
        return None


def _micro_time(wall_s: float) -> str:
    """Kubernetes MicroTime (RFC 3339, 6 fractional digits, UTC).

    The kubernetes client re-serializes times with `datetime.isoformat()`, which drops
    the fraction when it is exactly zero, and the API server parses MicroTime with a
    fixed 6-digit fraction; so a whole second is moved by 1 us to keep the digits.
    """
    t = dt.datetime.fromtimestamp(wall_s, tz=dt.UTC)
    if t.microsecond == 0:
        t = t.replace(microsecond=1)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _as_micro(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return _micro_time(value.timestamp())
    return str(value)


class LeaseElector:
    """Kubernetes Lease election (see module doc). Times in seconds.

    `client`: a kubernetes ApiClient. `monotonic`/`wall` are injected in tests, which
    call `step()` directly instead of `start()`.
    """

    def __init__(
        self,
        client: Any,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: float = 10.0,
        renew_deadline_s: float = 7.0,
        retry_period_s: float = 2.0,
        request_timeout_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        logger: Any = None,
    ) -> None:
        from kubernetes import client as k8s

        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError(
                "need retry_period_s < renew_deadline_s < lease_duration_s (got "
                f"{retry_period_s}, {renew_deadline_s}, {lease_duration_s})"
            )
        if not identity:
            raise ValueError("identity must not be empty")
        self.api = k8s.CoordinationV1Api(client)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self._lease_seconds = math.ceil(lease_duration_s)  # the Lease's integer field
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.timeout_s = request_timeout_s
        self._mono = monotonic
        self._wall = wall
        self._log = logger or structlog.get_logger("governor.leader")
        self._lock = threading.Lock()
        self._leader = False
        self._last_renew: float | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at: float | None = None
        self._holder = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ queries
    def is_leader(self) -> bool:
        """True while we hold the Lease and renewed it within `renew_deadline_s`."""
        with self._lock:
            return (
                self._leader
                and self._last_renew is not None
                and self._mono() - self._last_renew < self.renew_deadline_s
            )

    def leader_identity(self) -> str:
        with self._lock:
            return self._holder

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lease-elector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # the elector thread must survive anything
                self._log.error("lease_step_failed", error=repr(exc))
            self._stop.wait(self.retry_period_s)

    def stop(self, release: bool = True) -> None:
        """Stop the thread; with `release`, give the Lease up if we hold it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s * 2 + 1)
            self._thread = None
        if release:
            self.release()

    # ------------------------------------------------------------------ algorithm
    def _set(self, leader: bool, holder: str, renewed_at: float | None = None) -> None:
        """Record the outcome of a step; `renewed_at`: the monotonic time (s) taken at the
        start of the step whose renewal or create succeeded (before its requests, see
        the module doc), from which the renew deadline counts."""
        with self._lock:
            was = self._leader
            self._leader = leader
            self._holder = holder
            if renewed_at is not None:
                self._last_renew = renewed_at
        if was != leader:
            self._log.info(
                "leadership_changed", identity=self.identity, leader=leader, holder=holder
            )

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        return call_with_retries(
            lambda: fn(*args, _request_timeout=self.timeout_s), retries=0, what=what
        )

    def _read(self, where: str) -> Any:
        return self._call(
            f"read {where}", self.api.read_namespaced_lease, self.name, self.namespace
        )

    def _body(self, spec: dict[str, Any], rv: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv is not None:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def step(self) -> bool:
        """One attempt to acquire or renew; returns whether we are the leader now.
        `now` is taken before any request: the renew deadline and a follower's view of
        the lease both count from it (module doc)."""
        now = self._mono()
        wall = self._wall()
        where = f"lease {self.namespace}/{self.name}"
        try:
            lease = self._read(where)
        except KubeCallError as exc:
            if exc.status != 404:
                self._log.warning("lease_read_failed", error=str(exc))
                return self.is_leader()
            return self._create(where, wall, now)

        spec = lease.spec
        holder = (spec.holder_identity or "") if spec is not None else ""
        duration = (
            spec.lease_duration_seconds if spec is not None else None
        ) or self._lease_seconds
        record = (
            holder,
            _as_micro(spec.renew_time) if spec is not None else None,
            duration,
            spec.lease_transitions if spec is not None else None,
        )
        if record != self._observed:
            self._observed = record
            self._observed_at = now
        observed_at = self._observed_at if self._observed_at is not None else now
        if holder and holder != self.identity and observed_at + duration > now:
            self._set(False, holder)
            return False

        transitions = (spec.lease_transitions or 0) if spec is not None else 0
        ours = holder == self.identity
        new_spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._lease_seconds,
            "acquireTime": (_as_micro(spec.acquire_time) if ours and spec else None)
            or _micro_time(wall),
            "renewTime": _micro_time(wall),
            "leaseTransitions": transitions if ours else transitions + 1,
        }
        try:
            out = self._call(
                f"update {where}",
                self.api.replace_namespaced_lease,
                self.name,
                self.namespace,
                self._body(new_spec, lease.metadata.resource_version),
            )
        except KubeCallError as exc:
            if exc.status == 409:
                self._log.info("lease_update_conflict", error=str(exc))
                self._set(False, holder)
                return False
            self._log.warning("lease_update_failed", error=str(exc))
            return self.is_leader()
        o = out.spec
        self._observed = (
            self.identity,
            _as_micro(o.renew_time) if o is not None else new_spec["renewTime"],
            self._lease_seconds,
            new_spec["leaseTransitions"],
        )
        self._observed_at = now
        self._set(True, self.identity, renewed_at=now)
        return True

    def _create(self, where: str, wall: float, now: float) -> bool:
        """No Lease yet: create it holding it ourselves; whether we are the leader now
        (another instance may have created it first). `now`: the step's monotonic start
        time (s), from which the renew deadline counts."""
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self._lease_seconds,
            "acquireTime": _micro_time(wall),
            "renewTime": _micro_time(wall),
            "leaseTransitions": 0,
        }
        try:
            self._call(
                f"create {where}",
                self.api.create_namespaced_lease,
                self.namespace,
                self._body(spec, None),
            )
        except KubeCallError as exc:
            self._log.info("lease_create_lost", error=str(exc))
            return self.is_leader()
        self._set(True, self.identity, renewed_at=now)
        return True

    def release(self) -> None:
        """Give the Lease up (empty holder) if we hold it, so a follower takes over at
        its next step instead of waiting for the lease to expire."""
        if not self.is_leader():
            return
        where = f"lease {self.namespace}/{self.name}"
        with contextlib.suppress(KubeCallError):
            lease = self._read(where)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            spec = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": _as_micro(lease.spec.acquire_time),
                "renewTime": _micro_time(self._wall()),
                "leaseTransitions": lease.spec.lease_transitions or 0,
            }
            self._call(
                f"release {where}",
                self.api.replace_namespaced_lease,
                self.name,
                self.namespace,
                self._body(spec, lease.metadata.resource_version),
            )
            self._log.info("lease_released", identity=self.identity)
        self._set(False, "")
