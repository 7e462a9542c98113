"""Kubernetes API call helpers shared by every Kubernetes user of the project: the scale
actuator (`actuators.kubernetes`) and the service's ConfigMap store and Lease election
(`service.store`, `service.leader`).

`api_client` builds a client with urllib3's own retries off; `call_with_retries` retries
transient failures (5xx, 429, timeouts, connection errors) with capped exponential
backoff and turns every failure into a `KubeCallError` carrying the HTTP status; an
answer the client cannot read (a 200 with a wrong body, e.g. a proxy's HTML page) is a
`KubeCallError` that is not retried (`malformed`). A caller that may lose the right to
call (an actuator that stood down, or whose write check says it no longer leads) passes
`abandon`, asked before every attempt.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from controller.types import Decision

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_BACKOFF_S = 5.0


class KubeCallError(Exception):
    """A Kubernetes API call failed. `status` is the HTTP status, or None for a timeout,
    a connection failure or (`malformed`) an answer the client could not read."""

    def __init__(self, what: str, status: int | None, reason: str, malformed: bool = False) -> None:
        self.what = what
        self.status = status
        self.reason = reason
        self.malformed = malformed
        code = "malformed answer" if malformed else "no answer"
        code = f"HTTP {status}" if status is not None else code
        super().__init__(f"{what}: {code}: {reason}")

    @property
    def retryable(self) -> bool:
        """5xx, 429, timeouts and connection failures; never a malformed answer (the
        same server, asked again, answers the same)."""
        if self.malformed:
            return False
        return self.status is None or self.status in RETRYABLE_STATUS


class CallAbandoned(Exception):
    """An API call not made: its caller gave up the right to make it (an actuator that
    stood down, no longer the leader, or is stopping). Not an API failure."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(f"{what}: abandoned (stood down or stopping)")


def malformed_answer(what: str, detail: str) -> KubeCallError:
    """The KubeCallError of an answer that lacks what the caller needs (not retried)."""
    return KubeCallError(what, None, detail, malformed=True)


def api_client(host: str | None = None, *, retries: int = 0) -> Any:
    """An ApiClient: for `host` (tests, a proxy) or else in-cluster config, else the
    local kubeconfig. urllib3's own retries are off (`retries`): callers retry with
    backoff themselves, so a dead API server costs a bounded, known time."""
    from kubernetes import client, config

    if host is not None:
        cfg = client.Configuration(host=host)
    else:
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    cfg.retries = retries
    return client.ApiClient(cfg)


UNREADABLE_ANSWER = ("Unsupported content type", "Failed to parse")
"""How the client's own ApiException (status 0) begins when it could not read a 200:
a content type neither JSON nor text (e.g. `application/xhtml+xml` from a proxy), or a
date, datetime or enum field it could not parse."""


def _to_kube_error(what: str, exc: BaseException) -> KubeCallError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        if exc.status == 0 and str(exc.reason or "").startswith(UNREADABLE_ANSWER):
            return malformed_answer(what, exc.reason)
        reason = exc.reason or ""
        body = exc.body if isinstance(exc.body, str) else ""
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                reason = json.loads(body).get("message") or reason
        return KubeCallError(what, exc.status, reason)
    return KubeCallError(what, None, f"{type(exc).__name__}: {exc}")


def call_with_retries(
    fn: Callable[[], Any],
    *,
    retries: int = 3,
    backoff_s: float = 0.2,
    sleep: Callable[[float], None] | None = None,
    what: str = "kubernetes call",
    abandon: Callable[[], bool] | None = None,
) -> Any:
    """Run `fn()`; on a retryable failure (5xx, 429, timeout, connection error) sleep
    `backoff_s * 2**attempt` seconds (capped at 5 s, +-10 % jitter) and retry, at most
    `retries` times. Raises KubeCallError (the last failure, or the first non-retryable
    one); a ValueError or TypeError from `fn` (the client could not read the answer,
    e.g. a 200 with an HTML body), or the client's own status-0 ApiException for an
    answer it could not read (`UNREADABLE_ANSWER`: e.g. a 200 of content type
    `application/xml`), is a malformed KubeCallError, not retried. `abandon()`
    is asked before every attempt: True raises CallAbandoned without calling."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    pause = sleep or time.sleep
    for attempt in range(retries + 1):
        if abandon is not None and abandon():
            raise CallAbandoned(what)
        try:
            return fn()
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            text = " ".join(str(exc).split())[:200]
            raise malformed_answer(what, f"{type(exc).__name__}: {text}") from None
        except (ApiException, urllib3.exceptions.HTTPError, TimeoutError, OSError) as exc:
            err = _to_kube_error(what, exc)
            if not err.retryable or attempt == retries:
                raise err from None
            delay = min(MAX_BACKOFF_S, backoff_s * 2**attempt)
            pause(delay * random.uniform(0.9, 1.1))
    raise AssertionError("unreachable")  # pragma: no cover


def write_allowed(may_write: Callable[[], bool], log: Any) -> bool:
    """`may_write()`, where a raise counts as no (logged): never write on a doubt."""
    try:
        return bool(may_write())
    except Exception as exc:
        log.error("write_check_failed", error=repr(exc))
        return False


class QueuedActuatorBase:
    """Plumbing shared by the Kubernetes actuators (scale, knob roll-outs): per-model
    pending intents and last outcomes under one condition lock, the error hook, the
    worker's stop, and API calls with this actuator's timeout and retries.

    Subclasses set `_lock` (a Condition), `_pending`, `_status`, `_forgotten` (an empty
    set), `_stopped`, `_worker`, `_on_error`, `_log`, `timeout_s`, `retries`, `backoff_s`
    and `_sleep` in their constructor.
    """

    _lock: threading.Condition
    _pending: dict[str, Any]
    _status: dict[str, Any]
    _stopped: bool
    _worker: threading.Thread | None
    _on_error: Callable[[str], None] | None
    _log: Any
    timeout_s: float
    retries: int
    backoff_s: float
    _sleep: Callable[[float], None]
    _stood_down: bool = False
    _forgotten: set[str]
    """Models paused since their last decision (`forget`): nothing of theirs is queued."""
    _may_write: Callable[[], bool] | None = None

    def set_write_check(self, may_write: Callable[[], bool] | None) -> None:
        """Set `may_write()`, asked before every API call besides the stand-down and stop
        flags: False (or a raise) halts like a stand-down, for that call (ServiceCore
        sets it to the elector's `is_leader`, deadline-based: a lapsed lease stops the
        writes at once, not at the next tick's `stand_down`). None: the flags only."""
        self._may_write = may_write

    def stand_down(self) -> int:
        """This instance lost the leadership: forget every queued intent (a write that
        failed and waits for its retry included) and make no more API call for a write
        still in hand (each read and patch asks `_halted` first, retries and 409
        re-reads included), so a demoted leader never writes a stale decision over the
        new leader's. The next `apply` (a leader's decisions) lifts it. Returns how many
        intents were dropped."""
        with self._lock:
            dropped = len(self._pending)
            self._pending.clear()
            self._stood_down = True
            self._lock.notify_all()
            return dropped

    def forget(self, model: str) -> bool:
        """`model` went into shadow mode (ControlLoop.pause): drop its queued intent (a
        failed write waiting for its retry included) and never queue the write in hand
        again, until `apply` brings a decision for it (the loop hands over none while it
        is paused). A write already under way finishes or fails. True if one was dropped."""
        with self._lock:
            self._forgotten.add(model)
            dropped = self._pending.pop(model, None) is not None
            self._forget_locked(model)
            self._lock.notify_all()
            return dropped

    def _forget_locked(self, model: str) -> None:
        """Subclasses drop their own per-model retry or catch-up state (lock held)."""

    def _remember(self, decisions: Sequence[Decision]) -> None:
        """A decision for a model lifts its `forget` (called by `apply`, lock held)."""
        for d in decisions:
            self._forgotten.discard(d.model)

    def _halted(self) -> bool:
        """Whether no API call may start now: stood down, stopped, or the write check
        (`set_write_check`) says no (asked outside the lock)."""
        with self._lock:
            if self._stood_down or self._stopped:
                return True
            may_write = self._may_write
        return may_write is not None and not write_allowed(may_write, self._log)

    def _report_error(self, reason: str) -> None:
        """Call the error hook with `reason`; a failing hook is logged, never raised."""
        if self._on_error is None:
            return
        try:
            self._on_error(reason)
        except Exception as exc:  # counting must never break actuation
            self._log.error("actuation_error_hook_failed", error=repr(exc))

    def set_error_hook(self, on_error: Callable[[str], None] | None) -> None:
        """Set the `on_error(reason)` callback (ServiceCore wires it to its metrics)."""
        self._on_error = on_error

    def pending(self) -> dict[str, Any]:
        """Intents not applied yet (queued, waiting or to be retried), per model."""
        with self._lock:
            return dict(self._pending)

    def status(self) -> dict[str, Any]:
        """The last outcome per model."""
        with self._lock:
            return dict(self._status)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop: no API call starts any more (a write in hand is abandoned before its
        next read or patch); wait for the worker at most `timeout_s` seconds."""
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        if self._worker is not None:
            self._worker.join(timeout_s)

    def _merge_patch(
        self, what: str, fn: Callable[..., Any], name: str, namespace: str, body: Any, attempt: int
    ) -> bool:
        """Merge-patch `body` (which carries the resourceVersion it was read at) with `fn`.
        True when applied; False after a 409 conflict before the last attempt, having
        waited a jittered backoff (the caller reads the object again and retries)."""
        try:
            self._call(
                what, fn, name, namespace, body, _content_type="application/merge-patch+json"
            )
        except KubeCallError as exc:
            if exc.status == 409 and attempt < self.retries:
                delay = min(MAX_BACKOFF_S, self.backoff_s * 2**attempt)
                self._sleep(delay * random.uniform(0.9, 1.1))
                return False
            raise
        return True

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return call_with_retries(
            lambda: fn(*args, _request_timeout=self.timeout_s, **kw),
            retries=self.retries,
            backoff_s=self.backoff_s,
            sleep=self._sleep,
            what=what,
            abandon=self._halted,
        )
