"""Drain-aware scale-in: the ReplicaSet removes the idlest engine pods first.

Kubernetes picks which pods a scale-down deletes; among ready pods of one ReplicaSet it
deletes those with the lowest `controller.kubernetes.io/pod-deletion-cost` annotation
first (an int32; unset = 0). Before a scale-down is applied, `PodDrainer.prepare` sets
that annotation on every pod of the engine Deployment to the pod's in-flight requests
(`vllm:num_requests_running`, read from Prometheus in ONE query grouped by pod), so the
pods with the fewest running requests go first and long generations keep running.

What happens to a request on a pod that is removed anyway (every pod busy): the pod gets
SIGTERM after its preStop hook (the chart's engine template waits until the engine has
no running request, bounded by terminationGracePeriodSeconds, sized from the model's
e2e p99); vLLM stops taking new requests and finishes the running ones until the grace
period ends, and only then is the pod killed.

Only the Deployment's own pods are annotated: they are listed with its whole selector
(matchLabels and matchExpressions, `label_selector`) and kept only when their controller
is one of its ReplicaSets, which the Deployment controller names
`<deployment>-<pod-template-hash>` and whose pods carry that `pod-template-hash` label
(`owned_by`; no ReplicaSet list, so no RBAC beyond pods list/patch). A selector that
cannot be written as a label selector (none, empty, an unknown operator) is refused:
no pod is annotated and the result says so.

Missing data leaves the ReplicaSet's default order: when Prometheus cannot be read or
has no series for the model, no cost is written, and the costs an earlier drain wrote
(now stale: the idle pods then may be the busy ones now) are removed; the result says
so. Every cost the governor writes is recorded beside it in `COST_RECORD`; only a cost
still equal to that record is removed, so one someone else set is left alone. A pod
without a series (not scraped yet, e.g. just started) costs 0.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from actuators.kubeapi import KubeCallError, call_with_retries, write_allowed
from controller.types import Decision
from estimators.promql import RUNNING_METRICS

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MAX_COST = 2**31 - 1  # the annotation is an int32
POD_TEMPLATE_HASH = "pod-template-hash"
COST_RECORD = "llm-governor.io/pod-deletion-cost"
"""Pod annotation: the deletion cost the governor last wrote on the pod (ownership)."""


class QueryClient(Protocol):
    """What `prometheus_api_client.PrometheusConnect` offers (an instant query)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


RunningByPod = Callable[[str, str], Mapping[str, float] | None]
"""(model, namespace) -> running requests per pod name, or None when unknown."""


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def running_by_pod_query(
    model: str, namespace: str, model_label: str = "model_name", namespace_label: str = "namespace"
) -> str:
    """The one grouped query: running requests per pod of `model` in `namespace` (its
    series carry it in `namespace_label`). Example: `sum by (pod)
    (vllm:num_requests_running{model_name="m",namespace="llm"})`."""
    sel = f'{{{model_label}="{_quote(model)}",{namespace_label}="{_quote(namespace)}"}}'
    names = [*RUNNING_METRICS, *(n.replace(":", "_") for n in RUNNING_METRICS)]
    return f"sum by (pod) ({' or '.join(n + sel for n in names)})"


def label_selector(selector: Any) -> str | None:
    """A Deployment's spec.selector (V1LabelSelector) in the syntax of a list call's
    labelSelector: matchLabels as `k=v`, matchExpressions as `k in (a,b)`,
    `k notin (a,b)`, `k` (Exists), `!k` (DoesNotExist). None when it selects nothing
    this can express: no selector, an empty one (it would select every pod), an unknown
    operator, or In/NotIn without values."""
    if selector is None:
        return None
    parts = [f"{k}={v}" for k, v in sorted((selector.match_labels or {}).items())]
    for req in selector.match_expressions or []:
        values = ",".join(sorted(req.values or []))
        if req.operator in ("In", "NotIn") and values:
            parts.append(f"{req.key} {req.operator.lower()} ({values})")
        elif req.operator in ("Exists", "DoesNotExist") and not req.values:
            parts.append(("!" if req.operator == "DoesNotExist" else "") + req.key)
        else:
            return None
    return ",".join(parts) or None


def owned_by(pod: Any, deployment: str) -> bool:
    """Whether `pod` (V1Pod) is Deployment `deployment`'s: its controller is the
    ReplicaSet `<deployment>-<pod-template-hash>` named by its own hash label."""
    meta = pod.metadata
    pod_hash = (meta.labels or {}).get(POD_TEMPLATE_HASH) if meta is not None else None
    if not pod_hash:
        return False
    rs = f"{deployment}-{pod_hash}"
    refs = meta.owner_references or []
    return any(r.kind == "ReplicaSet" and r.controller and r.name == rs for r in refs)


def prometheus_running_by_pod(
    client: QueryClient, model_label: str = "model_name", namespace_label: str | None = "namespace"
) -> RunningByPod:
    """A `RunningByPod` over a Prometheus client; None when the query fails, answers
    garbage or has no series (no data is not zero). `namespace_label`: the label of the
    pods' namespace (None, no scoping configured: `namespace`, which a pod's series
    needs to be told from another namespace's pod of one name anyway)."""
    ns_label = namespace_label or "namespace"
    log = structlog.get_logger("actuator.drain")

    def running(model: str, namespace: str) -> Mapping[str, float] | None:
        query = running_by_pod_query(model, namespace, model_label, ns_label)
        try:
            result = client.custom_query(query)
        except Exception as exc:  # any client failure: unknown, not zero
            log.warning("running_by_pod_failed", model=model, error=repr(exc))
            return None
        out: dict[str, float] = {}
        for item in result if isinstance(result, list) else []:
            try:
                pod = item["metric"]["pod"]
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if isinstance(pod, str) and math.isfinite(value) and value >= 0:
                out[pod] = value
        return out or None

    return running


class PodDrainer:
    """Sets pod-deletion-cost on a Deployment's pods from their running requests.

    `core`/`apps`: kubernetes CoreV1Api / AppsV1Api; `running`: a `RunningByPod`;
    `call(what, fn)`: runs one API call with retries (default `call_with_retries`).
    """

    def __init__(
        self,
        core: Any,
        apps: Any,
        running: RunningByPod,
        *,
        request_timeout_s: float = 5.0,
        call: Callable[[str, Callable[[], Any]], Any] | None = None,
    ) -> None:
        self.core, self.apps, self.running = core, apps, running
        self.timeout_s = request_timeout_s
        self._call = call or (lambda what, fn: call_with_retries(fn, what=what))
        self._log = structlog.get_logger("actuator.drain")

    def prepare(self, model: str, namespace: str, deployment: str) -> str:
        """Annotate every pod of `namespace/deployment` with its deletion cost, or without
        per-pod data remove the costs the governor wrote (default order); returns a
        one-line account for status (never raises)."""
        running = self.running(model, namespace)
        where = f"deployment {namespace}/{deployment}"
        try:
            pods = self._own_pods(namespace, deployment, where)
            if pods is None:
                self._log.warning("drain_refused_selector", model=model, target=where)
                return f"drain: {where} has no usable label selector; no cost set, default order"
            if running is None:
                cleared = self._clear(namespace, pods)
                note = f" ({cleared} earlier costs removed)" if cleared else ""
                return (
                    f"drain: no per-pod running requests from Prometheus; default pod order{note}"
                )
            costs = self._annotate(namespace, pods, running)
        except KubeCallError as exc:
            self._log.warning("drain_prepare_failed", model=model, error=str(exc))
            return f"drain: could not set deletion costs ({exc}); default pod order"
        shown = ", ".join(f"{n}={c}" for n, c in sorted(costs.items(), key=lambda kv: kv[1]))
        self._log.info("drain_prepared", model=model, costs=costs)
        return f"drain: deletion cost = running requests ({shown})"

    def _own_pods(self, namespace: str, deployment: str, where: str) -> list[Any] | None:
        """The Deployment's own pods (V1Pod), listed with its selector; None when its
        selector cannot be written (nothing is listed then)."""
        dep = self._call(
            f"read {where}",
            lambda: self.apps.read_namespaced_deployment(
                deployment, namespace, _request_timeout=self.timeout_s
            ),
        )
        selector = label_selector(dep.spec.selector if dep.spec else None)
        if selector is None:
            return None
        pods = self._call(
            f"list pods of {where}",
            lambda: self.core.list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=self.timeout_s
            ),
        )
        return [pod for pod in pods.items or [] if owned_by(pod, deployment)]

    def _annotate(
        self, namespace: str, pods: list[Any], running: Mapping[str, float]
    ) -> dict[str, int]:
        """Set each pod's cost (and its record) to its running requests; the costs."""
        costs: dict[str, int] = {}
        for pod in pods:
            name = pod.metadata.name
            cost = str(min(MAX_COST, round(running.get(name, 0.0))))
            costs[name] = int(cost)
            have = pod.metadata.annotations or {}
            if have.get(DELETION_COST) != cost or have.get(COST_RECORD) != cost:
                self._patch(namespace, name, {DELETION_COST: cost, COST_RECORD: cost})
        return costs

    def _clear(self, namespace: str, pods: list[Any]) -> int:
        """Remove the costs the governor wrote that nobody changed since; how many."""
        cleared = 0
        for pod in pods:
            have = pod.metadata.annotations or {}
            if COST_RECORD in have and have.get(DELETION_COST) == have[COST_RECORD]:
                self._patch(namespace, pod.metadata.name, {DELETION_COST: None, COST_RECORD: None})
                cleared += 1
        return cleared

    def _patch(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        """Merge-patch pod `namespace/name`'s annotations (None removes one)."""
        body = {"metadata": {"annotations": annotations}}
        self._call(
            f"annotate pod {namespace}/{name}",
            lambda: self.core.patch_namespaced_pod(
                name, namespace, body, _request_timeout=self.timeout_s
            ),
        )


class DrainBeforeScaleDown:
    """KEDA (or plain-HPA) mode: the HPA applies the replicas, so the costs are set when a
    decision lowers a model's replicas below the previous decision, in a worker thread
    (never blocking the tick). KEDA polls every pollingInterval (15 s) and the HPA syncs
    every 15 s, so the costs are normally in place before the pods are picked.

    `drain(model, namespace, deployment) -> detail` (`PodDrainer.prepare`); `targets()`:
    model -> (namespace, deployment), read when each drain starts; `background`: False
    in tests (drain in `apply`).

    At most one drain per model at a time: a decision that lowers a model whose drain is
    still under way (a slow API) starts none; it is coalesced with any other such
    request into one (the newest decision's replicas win, `pending()`), which the same
    thread runs when the drain under way ends, with the running requests of then.
    Other models are not held up by it.

    Only a leader drains: the write check (`set_write_check`, ServiceCore sets the
    elector's `is_leader`) is asked before each drain; once it says no, the rest of that
    batch is skipped and its coalesced requests dropped (a drain already started
    finishes its pods). `stand_down` (leadership lost) and `forget` (a paused model)
    drop the requests not started; `close` also starts no more drains and waits for
    those in hand, so none writes once ServiceCore has released the lease.
    """

    def __init__(
        self,
        drain: Callable[[str, str, str], str],
        targets: Callable[[], Mapping[str, tuple[str, str]]],
        *,
        background: bool = True,
    ) -> None:
        self.drain, self.targets, self.background = drain, targets, background
        self._last: dict[str, int] = {}
        self._status: dict[str, str] = {}
        self._wanted: dict[str, int] = {}  # model -> replicas: a drain not started yet
        self._claimed: set[str] = set()  # models a drain thread owns (draining or next)
        self._threads: set[threading.Thread] = set()  # drains running in the background
        self._closed = False
        self._lock = threading.Lock()
        self._may_write: Callable[[], bool] | None = None
        self._log = structlog.get_logger("actuator.drain")

    def set_write_check(self, may_write: Callable[[], bool] | None) -> None:
        """Set `may_write()`, asked before each model's drain (None: always drain)."""
        self._may_write = may_write

    def apply(self, decisions: Sequence[Decision]) -> None:
        lowered = []
        with self._lock:
            if self._closed:
                return
            for d in decisions:
                if not d.valid:
                    continue
                prev = self._last.get(d.model)
                self._last[d.model] = d.replicas
                if prev is None or d.replicas >= prev:
                    continue
                self._wanted[d.model] = d.replicas  # the newest wins
                if d.model in self._claimed:
                    self._log.info("drain_coalesced", model=d.model, replicas=d.replicas)
                else:
                    self._claimed.add(d.model)
                    lowered.append(d.model)
        if not lowered:
            return
        if self.background:
            thread = threading.Thread(target=self._run_tracked, args=(lowered,), daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()
        else:
            self._run(lowered)

    def _run_tracked(self, models: list[str]) -> None:
        """`_run` in a background thread, which `close` can wait for."""
        try:
            self._run(models)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def stand_down(self) -> int:
        """This instance lost the leadership: drop every drain requested and not started
        (a drain in hand finishes its pods). Returns how many were dropped."""
        with self._lock:
            dropped = len(self._wanted)
            self._wanted.clear()
            return dropped

    def forget(self, model: str) -> bool:
        """`model` was paused (ControlLoop.pause): drop its drain not started; whether
        there was one."""
        with self._lock:
            return self._wanted.pop(model, None) is not None

    def close(self, timeout_s: float = 5.0) -> None:
        """Start no more drains, drop those not started, and wait at most `timeout_s`
        seconds in all for the drains in hand."""
        with self._lock:
            self._closed = True
            self._wanted.clear()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self, models: list[str]) -> None:
        """Drain each of `models` (claimed by `apply` for this thread), once more for
        each coalesced request; release every claim still held however it ends."""
        done = 0
        try:
            for model in models:
                while self._take(model):
                    check = self._may_write
                    if check is not None and not write_allowed(check, self._log):
                        self._log.info("drain_skipped_not_leader", skipped=models[done:])
                        return
                    target = self.targets().get(model)
                    if target is not None:
                        detail = self.drain(model, *target)
                        with self._lock:
                            self._status[model] = detail
                done += 1
        finally:
            with self._lock:
                for model in models[done:]:
                    self._wanted.pop(model, None)
                    self._claimed.discard(model)

    def _take(self, model: str) -> bool:
        """Whether a drain of `model` is wanted (taking the request); if not, release
        the claim, so the next lowering decision starts a new thread."""
        with self._lock:
            if self._wanted.pop(model, None) is not None:
                return True
            self._claimed.discard(model)
            return False

    def pending(self) -> dict[str, int]:
        """Drains requested and not started yet, per model: the replicas of the newest
        decision that lowered them."""
        with self._lock:
            return dict(self._wanted)

    def status(self) -> dict[str, str]:
        """The last drain account per model (for `governor status`)."""
        with self._lock:
            return dict(self._status)
