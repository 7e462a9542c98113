"""Knob roll-outs for engines without live knobs: a rolling restart of the engine
Deployment, so running replicas pick up new batching knobs.

vLLM reads `max_num_seqs` / `max_num_batched_tokens` at start (`governor engine-args`
asks the governor then). When a decision adopts a knob change big enough to be worth a
restart (`Decision.rollout`, see `knob_rollout_gain_frac`), this actuator patches the
pod-template annotation `ROLLOUT_ANNOTATION` of the model's Deployment to the new knobs;
the Deployment controller then replaces the pods with its own surge settings
(`maxSurge` / `maxUnavailable`), each new pod starting with the new knobs.

Rules, per model:
- at most one roll-out in flight: a Deployment whose roll-out is still in progress
  (ours or anyone's: `status.observedGeneration < metadata.generation`, or fewer
  updated than desired replicas) is not patched; the request waits (WAITING_ROLLOUT);
- never during panic: while the model's latest decision is in panic the request waits
  (WAITING_PANIC); restarting replicas in a surge would cut capacity when it is short;
- never below what the load needs: the replicas the Deployment's strategy keeps ready
  during the roll-out (`spec.replicas` less what `replicas_down_during_rollout` lets it
  take down: maxUnavailable, 1 when both fenceposts resolve to 0, all of them for
  Recreate) must serve the model's latest raw replica need (`replicas_needed`), else
  the request waits (WAITING_CAPACITY) until a scale-up or a lighter load makes room.
  With the chart's engine strategy (maxSurge 0, maxUnavailable 1) a 1-replica fleet
  under load never restarts its only replica; a surge strategy never waits here;
- rate-limited: at most one roll-out per `min_interval_s(model)` seconds
  (`policy.rollout_min_interval_s`), else RATE_LIMITED until then;
- the newest request wins: a later knob change replaces a waiting one;
- nothing is lost when the leader changes or restarts: on the first decision this
  instance sees for a model since it last became leader, it compares the template's
  annotation (the knobs last rolled out) with the decided knobs and rolls out when they
  differ by the roll-out threshold (`worth(model, decided, annotated)`); no annotation:
  nothing on record;
- the patch carries the resourceVersion it read (409 on a concurrent write: re-read and
  retry, `retries` times; still conflicting: FAILED, kept for the next tick);
- only a leader patches: after `stand_down()` (leadership lost) or `close()`, and
  whenever the write check (`set_write_check`, the elector's `is_leader`) says no, no
  read or patch starts (ABANDONED), and the take-over check runs again when it leads
  again.
Works the same whether KEDA or the governor scales the Deployment: the roll-out only
touches the pod template, never spec.replicas.

Status per model (`status()`, shown by `governor status`): the last outcome with the
knobs and why it waits. `register_metrics(registry)` exports how long each waiting
request has waited, by why (`WAITING_SECONDS`), so an alert can catch a roll-out that
never gets its room.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from actuators.kubeapi import CallAbandoned, KubeCallError, QueuedActuatorBase, malformed_answer
from actuators.kubernetes import failure_reason
from controller.types import Decision, Knobs

ROLLOUT_ANNOTATION = "llm-governor.io/knobs"
"""Pod-template annotation whose change restarts the engines: `seqs=S,tokens=T`."""


def annotation_value(knobs: Knobs) -> str:
    return f"seqs={knobs.max_num_seqs},tokens={knobs.max_num_batched_tokens}"


def parse_annotation(value: str | None) -> Knobs | None:
    """The knobs of an `annotation_value`; None when absent or not one of ours."""
    try:
        parts = dict(p.split("=", 1) for p in (value or "").split(","))
        return Knobs(int(parts["seqs"]), int(parts["tokens"]))
    except (KeyError, ValueError):
        return None


class RolloutReason(StrEnum):
    STARTED = "ROLLOUT_STARTED"
    UNCHANGED = "ROLLOUT_UNCHANGED"  # the template already carries these knobs
    WAITING_ROLLOUT = "ROLLOUT_WAITING_IN_PROGRESS"
    WAITING_PANIC = "ROLLOUT_WAITING_PANIC"
    WAITING_CAPACITY = "ROLLOUT_WAITING_CAPACITY"  # the strategy would leave too few ready
    RATE_LIMITED = "ROLLOUT_RATE_LIMITED"
    NOT_FOUND = "ROLLOUT_NOT_FOUND"
    FAILED = "ROLLOUT_FAILED"
    ABANDONED = "ROLLOUT_ABANDONED"  # stood down or stopped with the patch in hand


WAITING = frozenset(
    {
        RolloutReason.WAITING_ROLLOUT,
        RolloutReason.WAITING_PANIC,
        RolloutReason.WAITING_CAPACITY,
        RolloutReason.RATE_LIMITED,
        RolloutReason.FAILED,
    }
)
"""Outcomes that keep the request queued for the next tick."""


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    model: str
    reason: RolloutReason
    knobs: Knobs
    detail: str
    at_unix_s: float

    def describe(self) -> str:
        k = self.knobs
        head = f"{self.reason}: seqs {k.max_num_seqs}, tokens {k.max_num_batched_tokens}"
        return head + (f" ({self.detail})" if self.detail else "")


def rollout_in_progress(dep: Any) -> bool:
    """Whether a Deployment is still rolling out, as `kubectl rollout status` tests it: its
    controller has not seen the latest spec, fewer replicas are updated than wanted, old
    ones are still terminating, or updated ones are not all available yet (pods of a
    fresh scale-up still loading the model: a roll-out now would replace them)."""
    status, spec = dep.status, dep.spec
    if status is None:
        return True
    if (status.observed_generation or 0) < (getattr(dep.metadata, "generation", None) or 0):
        return True
    want = spec.replicas if spec is not None and spec.replicas is not None else 0
    updated = status.updated_replicas or 0
    available = status.available_replicas or 0
    return updated < want or (status.replicas or 0) > updated or available < updated


DEFAULT_FENCEPOST = "25%"
"""maxSurge and maxUnavailable where a Deployment leaves them out (the API server's
defaulting writes these on create, so a read Deployment always carries both)."""


def _scaled(value: Any, total: int, round_up: bool, field: str) -> int:
    """An IntOrString fencepost as Kubernetes scales it (`GetScaledValueFromIntOrPercent`):
    an int as is, "N%" of `total` rounded up or down. Raises ValueError on anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.endswith("%") and value[:-1].isdigit():
        scaled = int(value[:-1]) * total / 100
        return math.ceil(scaled) if round_up else math.floor(scaled)
    raise ValueError(f"{field} must be a count or a percentage, got {value!r}")


def replicas_down_during_rollout(strategy: Any, desired: int) -> int:
    """How many of `desired` replicas a roll-out of a Deployment with `spec.strategy`
    (the client's V1DeploymentStrategy, or None) may have unavailable at once:
    "Recreate" stops all of them; "RollingUpdate" as `fenceposts_down` resolves its
    maxSurge and maxUnavailable. A missing field reads as the API server defaults it
    (RollingUpdate, 25 % each). Raises ValueError on a value the API server would
    refuse."""
    if desired <= 0:
        return 0
    kind = getattr(strategy, "type", None) or "RollingUpdate"
    if kind == "Recreate":
        return desired
    if kind != "RollingUpdate":
        raise ValueError(f"spec.strategy.type must be RollingUpdate or Recreate, got {kind!r}")
    rolling = getattr(strategy, "rolling_update", None)
    if rolling is None:
        return fenceposts_down(DEFAULT_FENCEPOST, DEFAULT_FENCEPOST, desired)
    return fenceposts_down(
        DEFAULT_FENCEPOST if rolling.max_surge is None else rolling.max_surge,
        DEFAULT_FENCEPOST if rolling.max_unavailable is None else rolling.max_unavailable,
        desired,
    )


def fenceposts_down(max_surge: Any, max_unavailable: Any, desired: int) -> int:
    """Replicas of `desired` a rolling update with these fenceposts (each a count or
    "N%") takes down at once, as the deployment controller resolves them
    (`ResolveFenceposts` in pkg/controller/deployment/util): maxUnavailable (a
    percentage of `desired` rounded down), and 1 when it and maxSurge (a percentage
    rounded up) both come to 0; never more than `desired`, 0 for 0 desired (nothing to
    replace). Raises ValueError on a value that is neither."""
    if desired <= 0:
        return 0
    surge = _scaled(max_surge, desired, True, "maxSurge")
    down = _scaled(max_unavailable, desired, False, "maxUnavailable")
    return min(desired, 1 if surge == 0 and down == 0 else down)


def replicas_needed(decision: Decision) -> float:
    """Replicas the model's load needs now: the decision's raw count (demand over the
    capacity of one replica at the SLA), its final replicas where it has none."""
    raw = decision.raw_replicas
    return float(decision.replicas) if raw is None or not math.isfinite(raw) else raw


def can_spare(desired: int, down: int, needed: float) -> bool:
    """Whether a roll-out that takes `down` of `desired` replicas down at a time
    (`replicas_down_during_rollout`) leaves enough ready for a need of `needed` replicas
    (`replicas_needed`). One that takes none down (a surge) always does: it never serves
    with fewer than it has, even where the load needs more."""
    return down <= 0 or desired - down >= needed


WAITING_SECONDS = "governor_knob_rollout_waiting_seconds"
WAITING_SECONDS_HELP = (
    "Seconds the model's queued knob roll-out has waited, labelled with why it waits now "
    "(a RolloutReason of WAITING); no series while none waits"
)


def _waiting_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(WAITING_SECONDS, WAITING_SECONDS_HELP, labels=["model", "reason"])


class _WaitingCollector:
    """Exports `WAITING_SECONDS` from `waiting()` (KnobRolloutActuator.waiting) at each
    scrape, against the wall clock `wall` (seconds)."""

    def __init__(
        self,
        waiting: Callable[[], Mapping[str, tuple[RolloutReason, float]]],
        wall: Callable[[], float],
    ) -> None:
        self.waiting, self.wall = waiting, wall

    def describe(self) -> list[Metric]:
        return [_waiting_family()]

    def collect(self) -> Iterator[Metric]:
        family, now = _waiting_family(), self.wall()
        for model, (reason, since) in sorted(self.waiting().items()):
            family.add_metric([model, reason.value], max(0.0, now - since))
        yield family


class KnobRolloutActuator(QueuedActuatorBase):
    """Applies `Decision.rollout` as a pod-template annotation patch (see module doc).

    `targets()`: model -> (namespace, deployment). `min_interval_s(model)`: seconds
    between two roll-outs of a model. `worth(model, decided, annotated)`: whether the
    template's knobs are stale enough to roll out when this instance takes over (None:
    no catch-up). `background`: do the API calls in a worker thread (production)
    instead of inside `apply`.
    """

    def __init__(
        self,
        client: Any,
        targets: Callable[[], Mapping[str, tuple[str, str]]],
        min_interval_s: Callable[[str], float],
        *,
        request_timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        background: bool = True,
        sleep: Callable[[float], None] | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_error: Callable[[str], None] | None = None,
        worth: Callable[[str, Knobs, Knobs], bool] | None = None,
    ) -> None:
        from kubernetes import client as k8s

        self.apps = k8s.AppsV1Api(client)
        self.worth = worth
        self._seen: set[str] = set()
        self._forgotten: set[str] = set()
        self._catch_up: set[str] = set()  # pending entries that are a take-over check
        self.targets, self.min_interval_s = targets, min_interval_s
        self.timeout_s, self.retries, self.backoff_s = request_timeout_s, retries, backoff_s
        self._sleep, self._wall, self._monotonic = sleep or time.sleep, wall, monotonic
        self._on_error = on_error
        self._log = structlog.get_logger("actuator.rollout")
        self._lock = threading.Condition()
        self._pending: dict[str, Knobs] = {}
        self._panic: dict[str, bool] = {}
        self._needed: dict[str, float] = {}  # replicas_needed of the latest decision
        self._last_start: dict[str, float] = {}  # monotonic s of our last roll-out start
        self._status: dict[str, RolloutStatus] = {}
        self._waiting_since: dict[str, float] = {}  # wall s of a queued request's first wait
        self._stopped = False
        self._applied = 0  # `apply` calls so far (the worker runs once per new one)
        self._worker: threading.Thread | None = None
        if background:
            self._worker = threading.Thread(target=self._run, name="k8s-rollout", daemon=True)
            self._worker.start()

    # ------------------------------------------------------------------ actuator
    def apply(self, decisions: Sequence[Decision]) -> None:
        with self._lock:
            self._stood_down = False
            self._remember(decisions)
            for d in decisions:
                if not d.valid:
                    continue
                self._panic[d.model] = d.panic
                self._needed[d.model] = replicas_needed(d)
                if d.rollout:
                    if d.model not in self._pending:
                        self._waiting_since.pop(d.model, None)  # a new request
                    self._pending[d.model] = d.knobs
                    self._catch_up.discard(d.model)
                elif d.model not in self._seen and self.worth is not None:
                    self._pending.setdefault(d.model, d.knobs)
                    self._catch_up.add(d.model)
                self._seen.add(d.model)
            self._applied += 1
            self._lock.notify_all()
        if self._worker is None:
            self.run_pending()

    def rollout_waiting(self, model: str) -> bool:
        """controller.actuation.RolloutGate: a roll-out asked for `model` is queued and
        not started (a leader's take-over check is no such request)."""
        with self._lock:
            return model in self._pending and model not in self._catch_up

    def waiting(self) -> dict[str, tuple[RolloutReason, float]]:
        """model -> (why it waits now, wall s it first waited) for each queued roll-out
        whose last try waited."""
        with self._lock:
            return {
                m: (self._status[m].reason, since)
                for m, since in self._waiting_since.items()
                if m in self._pending  # set with a waiting status, dropped with it
            }

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export `WAITING_SECONDS` on `registry` (the service's /metrics)."""
        registry.register(_WaitingCollector(self.waiting, self._wall))  # type: ignore[arg-type]

    def stand_down(self) -> int:
        """`QueuedActuatorBase.stand_down`, and forget which models this instance has
        seen: when it leads again, its first decision per model compares the template
        with the decided knobs again (a roll-out dropped here is caught up then)."""
        with self._lock:
            self._seen.clear()
            self._catch_up.clear()
            return super().stand_down()

    def _forget_locked(self, model: str) -> None:
        """Paused: its first decision after the pause compares the template with the
        decided knobs again, as after a take-over (a roll-out dropped here is caught up)."""
        self._seen.discard(model)
        self._catch_up.discard(model)

    def _run(self) -> None:
        """The worker: one run per `apply` that left something queued. An `apply` made
        during a run is counted (`_applied`), so the next run starts as soon as this one
        ends (no wake-up is lost while the worker is not waiting); waiting requests are
        looked at again on the next `apply` (tick), never in a busy loop."""
        handled = 0  # `_applied` when the last run started
        while True:
            with self._lock:
                while not self._stopped and (not self._pending or self._applied == handled):
                    self._lock.wait()
                if self._stopped:
                    return
                handled = self._applied
            try:
                self.run_pending()
            except Exception as exc:  # the worker must survive anything
                self._log.error("rollout_worker_failed", error=repr(exc))

    # ------------------------------------------------------------------ roll-outs
    def run_pending(self) -> dict[str, RolloutStatus]:
        """Try every queued roll-out once (in the calling thread)."""
        with self._lock:
            queued = dict(self._pending)
        targets = self.targets()
        out = {}
        for model, knobs in queued.items():
            if self._halted():
                break
            if model not in targets:
                with self._lock:
                    self._pending.pop(model, None)
                continue
            with self._lock:
                catch_up = model in self._catch_up
            st = self._try_isolated(model, *targets[model], knobs, catch_up)
            out[model] = st
            with self._lock:
                self._status[model] = st
                if st.reason in WAITING:
                    self._waiting_since.setdefault(model, st.at_unix_s)
                else:
                    self._waiting_since.pop(model, None)
                if st.reason not in WAITING and self._pending.get(model) == knobs:
                    del self._pending[model]
                    self._catch_up.discard(model)
        return out

    def _too_few_stay_ready(self, model: str, dep: Any) -> str:
        """Why the Deployment's strategy would leave fewer replicas ready during a roll-out
        than the model's latest decision needs ("" when it leaves enough)."""
        spec = dep.spec
        desired = spec.replicas if spec is not None and spec.replicas is not None else 0
        try:
            down = replicas_down_during_rollout(getattr(spec, "strategy", None), desired)
        except ValueError as exc:
            return f"the Deployment's strategy cannot be read ({exc}); not rolling out"
        with self._lock:
            needed = self._needed.get(model, float(desired))
        if can_spare(desired, down, needed):
            return ""
        return (
            f"its strategy takes {down} of {desired} replicas down at a time, leaving "
            f"{desired - down} ready; the load needs {needed:.2f}"
        )

    def _try_isolated(
        self, model: str, namespace: str, deployment: str, knobs: Knobs, catch_up: bool
    ) -> RolloutStatus:
        """`_try`, with anything it raises (an answer of a shape it did not expect, a bug)
        confined to this model: FAILED, counted as `exception`. The models queued behind
        it still roll out (one Deployment read without metadata had stopped them all)."""
        try:
            return self._try(model, namespace, deployment, knobs, catch_up)
        except Exception as exc:
            self._log.error("rollout_raised", model=model, error=repr(exc))
            self._report_error("exception")
            detail = f"unexpected error: {exc!r}"
            return RolloutStatus(model, RolloutReason.FAILED, knobs, detail, self._wall())

    def _try(
        self, model: str, namespace: str, deployment: str, knobs: Knobs, catch_up: bool = False
    ) -> RolloutStatus:
        def done(reason: RolloutReason, detail: str = "") -> RolloutStatus:
            return RolloutStatus(model, reason, knobs, detail, self._wall())

        with self._lock:
            panic = self._panic.get(model, False)
            last = self._last_start.get(model)
        if panic:
            return done(RolloutReason.WAITING_PANIC, "the model is in panic mode")
        interval = self.min_interval_s(model)
        now = self._monotonic()
        if last is not None and now - last < interval:
            return done(
                RolloutReason.RATE_LIMITED,
                f"last roll-out {now - last:.0f} s ago, at most one per {interval:.0f} s",
            )
        where = f"deployment {namespace}/{deployment}"
        value = annotation_value(knobs)
        try:
            for attempt in range(self.retries + 1):
                dep = self._call(
                    f"read {where}", self.apps.read_namespaced_deployment, deployment, namespace
                )
                version = getattr(dep.metadata, "resource_version", None)
                if not version:  # the patch below is conditional on it
                    raise malformed_answer(f"read {where}", "no metadata.resourceVersion")
                template = dep.spec.template.metadata if dep.spec and dep.spec.template else None
                current = ((template.annotations if template else None) or {}).get(
                    ROLLOUT_ANNOTATION
                )
                if current == value:
                    return done(RolloutReason.UNCHANGED)
                if catch_up:
                    last = parse_annotation(current)
                    if last is None or not (self.worth and self.worth(model, knobs, last)):
                        return done(RolloutReason.UNCHANGED, f"template knobs: {current}")
                if rollout_in_progress(dep):
                    return done(RolloutReason.WAITING_ROLLOUT, f"{where} is still rolling out")
                short = self._too_few_stay_ready(model, dep)
                if short:
                    return done(RolloutReason.WAITING_CAPACITY, short)
                body = {
                    "metadata": {"resourceVersion": version},
                    "spec": {
                        "template": {"metadata": {"annotations": {ROLLOUT_ANNOTATION: value}}}
                    },
                }
                patch = self.apps.patch_namespaced_deployment
                if not self._merge_patch(
                    f"patch {where}", patch, deployment, namespace, body, attempt
                ):
                    continue
                with self._lock:
                    self._last_start[model] = self._monotonic()
                self._log.info("rollout_started", model=model, target=where, knobs=value)
                return done(RolloutReason.STARTED, f"{where}: {ROLLOUT_ANNOTATION}={value}")
            raise AssertionError("unreachable")  # pragma: no cover
        except CallAbandoned as exc:
            self._log.info("rollout_abandoned", model=model, knobs=value)
            return done(RolloutReason.ABANDONED, f"{exc.what} not made, nothing patched")
        except KubeCallError as exc:
            self._log.warning("rollout_failed", model=model, error=str(exc))
            self._report_error(failure_reason(exc))
            if exc.status == 404:
                return done(RolloutReason.NOT_FOUND, str(exc))
            return done(RolloutReason.FAILED, str(exc))
