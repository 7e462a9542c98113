"""Kubernetes actuator (clusters without KEDA): sets a Deployment's replicas through its
scale subresource with the official `kubernetes` client (call helpers: actuators.kubeapi).

Per valid decision: read the scale subresource; no-op when spec.replicas already equals
the decision; otherwise a JSON merge patch of spec.replicas that carries the
resourceVersion it read as a precondition, so a concurrent writer makes the API server
answer 409 and we re-read and retry. 5xx, 429 and timeouts are retried with exponential
backoff (base `backoff_s`, doubling, capped at 5 s); other errors (403, 404, 422) are
not retried and are reported.

Refusal: a Deployment that a HorizontalPodAutoscaler also scales (autoscaling/v2
scaleTargetRef kind Deployment with the same name) is never touched: the two would
fight, each undoing the other. The refusal is logged as a warning and reported as
status reason HPA_CONFLICT. HPAs are listed once per `hpa_check_interval_s` per
namespace, not every tick; a list the API refuses (401/403: the chart's
`rbac.hpaConflictCheck: false` grants none) is logged and not asked again within the
interval, and `hpa_check=False` (`governor run --hpa-conflict-check off`) never lists.

Never blocks the control loop: with `background=True` (production) `apply` only records
the latest desired replicas per model and a worker thread does the API calls
(coalescing: only the newest value per model is applied).

No lost intent: an attempt that fails for a transient reason (5xx, 429, timeouts or
409s past the retries) keeps its desired value queued and is tried again after a
per-model backoff (`backoff_s` doubling per consecutive failure, capped at
`MAX_RETRY_DELAY_S`, +-10 % jitter), unless a newer decision replaced it meanwhile.
No duplicated intent: every write sets an absolute replica count under the
resourceVersion it read, so a retried write that already landed reads back as equal
(UNCHANGED) instead of scaling twice.

Failures are reported: each failed or refused attempt calls `on_error(reason)` with a
lower-case reason (`FAILURE_REASONS`), which the service counts in
`governor_actuation_errors_total{actuator="KubernetesScaleActuator", reason=...}`. An
answer the client cannot read (a 200 with a wrong body) fails that model's attempt
(`malformed_answer`, not retried on its own: the next decision asks again); anything
else one model's attempt raises is reported (`exception`) and retried like a transient
failure, and the other models of the batch are still written.

Only a leader writes: after `stand_down()` (leadership lost) or `close()`, and whenever
the write check says no (`set_write_check`: the elector's deadline-based `is_leader`, so
a lapsed lease stops the writes at once, not at the next tick), no read or patch starts
any more, a write in hand included (409 re-reads and retries ask first); such a write is
recorded as ABANDONED, neither an error nor retried.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog

from actuators.kubeapi import CallAbandoned, KubeCallError, QueuedActuatorBase, malformed_answer
from controller.types import Decision

MAX_RETRY_DELAY_S = 30.0
"""Cap of the delay before a failed intent is tried again, seconds."""
FAILURE_REASONS = (
    "hpa_conflict",  # an HPA also scales the Deployment: refused, never retried alone
    "not_found",  # 404: no such Deployment
    "forbidden",  # 401/403: RBAC does not allow it
    "conflict",  # 409 on every attempt: someone keeps writing the scale
    "retries_exhausted",  # 5xx, 429, timeouts on every attempt (queued again)
    "rejected",  # any other 4xx (e.g. 422)
    "malformed_answer",  # an answer the client could not read (a 200: wrong body or type)
    "exception",  # the attempt raised something else (queued again)
)
"""The `reason` label values of actuation errors."""


class ScaleReason(StrEnum):
    """Outcome of one scale attempt (status reason)."""

    SCALED = "SCALED"
    UNCHANGED = "UNCHANGED"
    HPA_CONFLICT = "HPA_CONFLICT"
    NOT_FOUND = "NOT_FOUND"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"  # stood down or stopped with the write in hand: not written


@dataclass(frozen=True, slots=True)
class ScaleStatus:
    """What happened the last time a model's Deployment was scaled."""

    model: str
    reason: ScaleReason
    desired: int
    observed: int | None
    detail: str
    at_unix_s: float
    transient: bool = False
    """A FAILED attempt that is tried again on its own (5xx, 429, timeout, 409)."""

    def describe(self) -> str:
        seen = "?" if self.observed is None else str(self.observed)
        return f"{self.reason}: desired {self.desired}, was {seen}" + (
            f" ({self.detail})" if self.detail else ""
        )


class KubernetesScaleActuator(QueuedActuatorBase):
    """Applies decisions to Deployments' scale subresource.

    `targets()` returns model -> (namespace, deployment) for the configured models.
    `request_timeout_s`: per API call, seconds. `retries`/`backoff_s`: see
    `call_with_retries`; 409 conflicts are retried by re-reading, `retries` times, with
    the same jittered backoff. `on_error(reason)`: called once per failed or refused
    attempt (reasons: `FAILURE_REASONS`). `sleep`/`wall`/`monotonic` are injected in
    tests.
    """

    def __init__(
        self,
        client: Any,
        targets: Callable[[], Mapping[str, tuple[str, str]]],
        *,
        request_timeout_s: float = 5.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        hpa_check_interval_s: float = 60.0,
        hpa_check: bool = True,
        background: bool = True,
        sleep: Callable[[float], None] | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        logger: Any = None,
        on_error: Callable[[str], None] | None = None,
        drain: Callable[[str, str, str], str] | None = None,
    ) -> None:
        from kubernetes import client as k8s

        self.apps = k8s.AppsV1Api(client)
        self.autoscaling = k8s.AutoscalingV2Api(client)
        self.targets = targets
        self.timeout_s = request_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.hpa_check_interval_s = hpa_check_interval_s
        self.hpa_check = hpa_check
        self._sleep = sleep or time.sleep
        self._wall = wall
        self._monotonic = monotonic
        self._log = logger or structlog.get_logger("actuator.kubernetes")
        self._lock = threading.Condition()
        self._pending: dict[str, int] = {}
        self._status: dict[str, ScaleStatus] = {}
        self._hpa_cache: dict[str, tuple[float, list[tuple[str, str]]]] = {}
        self._on_error = on_error
        self.drain = drain
        """`drain(model, namespace, deployment) -> detail`, called before a scale-down
        (actuators/drain.py: pod-deletion-cost from running requests); never raises."""
        self._forgotten: set[str] = set()
        self._failures: dict[str, int] = {}  # consecutive transient failures per model
        self._retry_at: dict[str, float] = {}  # monotonic s before which it is not retried
        self._stopped = False
        self._worker: threading.Thread | None = None
        if background:
            self._worker = threading.Thread(target=self._run, name="k8s-scaler", daemon=True)
            self._worker.start()

    # ------------------------------------------------------------------ actuator
    def apply(self, decisions: Sequence[Decision]) -> None:
        """Record each valid decision's replicas; the worker (or `run_pending`) applies."""
        with self._lock:
            self._stood_down = False
            self._remember(decisions)
            for d in decisions:
                if d.valid:
                    self._pending[d.model] = d.replicas
            self._lock.notify_all()
        if self._worker is None:
            self.run_pending()

    def run_pending(self) -> dict[str, ScaleStatus]:
        """Apply every pending desired value that is due now (in the calling thread).

        A model whose last attempt failed transiently is due again at its retry time;
        its value stays queued until then (a newer decision replaces it)."""
        now = self._monotonic()
        with self._lock:
            due = {
                m: r for m, r in self._pending.items() if self._retry_at.get(m, -math.inf) <= now
            }
            for m in due:
                del self._pending[m]
        targets = self.targets()
        out = {}
        for model, replicas in due.items():
            if self._halted():
                break
            if model not in targets:
                continue
            st = self._scale_isolated(model, *targets[model], replicas)
            out[model] = st
            with self._lock:
                if st.reason is ScaleReason.FAILED and st.transient:
                    if self._stood_down or model in self._forgotten:
                        continue  # stood down or paused meanwhile: not queued again
                    n = self._failures.get(model, 0) + 1
                    self._failures[model] = n
                    delay = min(MAX_RETRY_DELAY_S, self.backoff_s * 2.0 ** min(n, 30))
                    self._retry_at[model] = self._monotonic() + delay * random.uniform(0.9, 1.1)
                    self._pending.setdefault(model, replicas)  # unless a newer one came
                    self._lock.notify_all()
                else:
                    self._failures.pop(model, None)
                    self._retry_at.pop(model, None)
        return out

    def _forget_locked(self, model: str) -> None:
        self._failures.pop(model, None)
        self._retry_at.pop(model, None)

    def _scale_isolated(
        self, model: str, namespace: str, deployment: str, replicas: int
    ) -> ScaleStatus:
        """`scale`, with anything it raises (a bug, a drain hook that broke its word)
        confined to this model: FAILED, counted as `exception`, queued again."""
        try:
            return self.scale(model, namespace, deployment, replicas)
        except Exception as exc:
            self._log.error("scale_raised", model=model, error=repr(exc))
            return self._record(
                model,
                ScaleReason.FAILED,
                replicas,
                None,
                f"unexpected error: {exc!r}",
                error="exception",
                transient=True,
            )

    def _wait_due_locked(self) -> None:
        """Wait (lock held) until a pending value is due or the actuator stops."""
        while not self._stopped:
            now = self._monotonic()
            waits = [self._retry_at.get(m, -math.inf) - now for m in self._pending]
            if waits and min(waits) <= 0:
                return
            self._lock.wait(min(waits) if waits else None)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wait_due_locked()
                if self._stopped:
                    return
            try:
                self.run_pending()
            except Exception as exc:  # the worker must survive anything
                self._log.error("scaler_worker_failed", error=repr(exc))

    # ------------------------------------------------------------------ scaling
    def hpas_for(self, namespace: str, deployment: str) -> list[str]:
        """Names of the HPAs in `namespace` whose scale target is Deployment
        `deployment` (cached for `hpa_check_interval_s`)."""
        now = self._monotonic()
        cached = self._hpa_cache.get(namespace)
        if cached is None or now - cached[0] >= self.hpa_check_interval_s:
            try:
                items = self._call(
                    f"list HPAs in {namespace}",
                    self.autoscaling.list_namespaced_horizontal_pod_autoscaler,
                    namespace,
                ).items
            except KubeCallError as exc:
                if exc.status not in (401, 403):
                    raise
                # not allowed to look: no conflict seen, asked again after the interval
                self._log.warning("hpa_check_forbidden", namespace=namespace, error=str(exc))
                items = None
            refs = []
            for h in items or []:
                ref = h.spec.scale_target_ref
                if ref is not None and ref.kind == "Deployment":
                    refs.append((h.metadata.name, ref.name))
            cached = (now, refs)
            self._hpa_cache[namespace] = cached
        return [hpa for hpa, target in cached[1] if target == deployment]

    def scale(self, model: str, namespace: str, deployment: str, replicas: int) -> ScaleStatus:
        """Set `namespace/deployment` to `replicas` (see module doc); never raises."""
        where = f"deployment {namespace}/{deployment}"
        observed: int | None = None
        drained = ""
        try:
            hpas = self.hpas_for(namespace, deployment) if self.hpa_check else []
            if hpas:
                return self._record(
                    model,
                    ScaleReason.HPA_CONFLICT,
                    replicas,
                    None,
                    f"HPA {', '.join(sorted(hpas))} also scales {where}; refusing to fight it "
                    "(delete the HPA or use the KEDA actuator)",
                    warn=True,
                )
            for attempt in range(self.retries + 1):
                scale = self._call(
                    f"read scale of {where}",
                    self.apps.read_namespaced_deployment_scale,
                    deployment,
                    namespace,
                )
                # ScaleSpec.replicas is `omitempty`: the API leaves it out at 0
                observed = (scale.spec.replicas or 0) if scale.spec is not None else None
                version = getattr(scale.metadata, "resource_version", None)
                if not version:
                    raise malformed_answer(f"read scale of {where}", "no resourceVersion")
                if observed == replicas:
                    return self._record(model, ScaleReason.UNCHANGED, replicas, observed, "")
                down = observed is not None and replicas < observed
                if self.drain is not None and down and not drained:  # once, not per 409
                    drained = self.drain(model, namespace, deployment)
                body = {
                    "metadata": {"resourceVersion": version},
                    "spec": {"replicas": replicas},
                }
                patch = self.apps.patch_namespaced_deployment_scale
                if not self._merge_patch(
                    f"patch scale of {where}", patch, deployment, namespace, body, attempt
                ):
                    continue
                self._log.info("scaled", target=where, model=model, replicas=replicas, was=observed)
                return self._record(model, ScaleReason.SCALED, replicas, observed, drained)
            raise AssertionError("unreachable")  # pragma: no cover
        except CallAbandoned as exc:
            why = "stopped" if self._stopped else "not the leader any more"
            self._log.info("scale_abandoned", model=model, replicas=replicas, why=why)
            detail = f"{why}: {exc.what} not made, nothing written"
            return self._record(model, ScaleReason.ABANDONED, replicas, observed, detail)
        except KubeCallError as exc:
            reason = ScaleReason.NOT_FOUND if exc.status == 404 else ScaleReason.FAILED
            return self._record(
                model,
                reason,
                replicas,
                observed,
                str(exc),
                warn=True,
                error=failure_reason(exc),
                transient=exc.retryable or exc.status == 409,
            )

    def _record(
        self,
        model: str,
        reason: ScaleReason,
        desired: int,
        observed: int | None,
        detail: str,
        warn: bool = False,
        error: str | None = None,
        transient: bool = False,
    ) -> ScaleStatus:
        st = ScaleStatus(model, reason, desired, observed, detail, self._wall(), transient)
        with self._lock:
            self._status[model] = st
        if warn:
            self._log.warning("scale_refused_or_failed", model=model, reason=reason, detail=detail)
        if reason is ScaleReason.HPA_CONFLICT:
            error = "hpa_conflict"
        if error is not None:
            self._report_error(error)
        return st


def failure_reason(exc: KubeCallError) -> str:
    """The `FAILURE_REASONS` label of a failed scale call."""
    if exc.malformed:
        return "malformed_answer"
    if exc.status == 404:
        return "not_found"
    if exc.status in (401, 403):
        return "forbidden"
    if exc.status == 409:
        return "conflict"
    if exc.retryable:
        return "retries_exhausted"
    return "rejected"
