"""The governor service: control loop + persistence + leader election + gRPC servers.

Owns the wiring that `governor run` starts:

- `ServiceCore` (threads, no asyncio): the target set (validated, persisted through a
  `controller.store.Store`), the `ControlLoop`, the `DecisionBoard` that engines and
  KEDA read, the leader `Elector`, and one `tick()` per interval:
  poll stored targets (apply valid changes, refuse invalid ones, keeping the last valid
  set) -> if leader: loop tick (actuate) and save state; else: mirror the leader's
  published state into the board. Admin operations (`set_target`, ...) validate first
  and change nothing when anything is wrong (`AdminError` with a gRPC status code).
- The gRPC servicers (asyncio): `BatchingServicer` (engines), `AdminServicer`
  (operators) and KEDA's `ExternalScalerService` (actuators.keda), with the standard
  health and reflection services.
- `GovernorServer`: the grpc.aio server (message-size limits, bounded concurrency,
  keepalive), the HTTP /metrics endpoint, the ticker thread, and the graceful shutdown:
  health NOT_SERVING -> stop accepting -> end streams (board closed) -> let in-flight
  calls finish within the grace period -> final state flush -> release the Lease.
  Security (controller.security): the admin API needs `authorization: Bearer <token>`
  (the token from `--admin-token-file`, a mounted Secret); without a token it is
  disabled. The engines' and KEDA's read-only APIs need none. TLS from PEM files,
  optionally mTLS. Every unary request is parsed by the server itself (malformed bytes:
  INVALID_ARGUMENT) and error messages are clipped.
- Limits (each refusal names the limit): request message size (`MAX_REQUEST_BYTES`),
  concurrent RPCs, concurrent watch streams (`MAX_WATCH_STREAMS`), configured models
  (`MAX_MODELS`, for admin additions), models per GetStatus, string lengths (model and
  engine names: 253 characters; everything else through the config models).
- `run_service(args)`: the `governor run` entry point (signals, exit status).
- `WallClockSource`: the loop measures windows on the monotonic clock; Prometheus is
  queried at wall time. The adapter gives the source the wall time of each tick.
- `simulated_fleet_factory`: the seam `--simulated-fleet` uses (see its docstring).

Restart safety: state is saved after every tick with monotonic times converted to wall
time (controller.store.to_wall) and restored at start, so the stabilization windows
continue across a restart and a restart never causes a scale-down burst.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
from google.protobuf import json_format
from pydantic import ValidationError

from actuators.base import Actuator
from actuators.keda import ExternalScalerService
from actuators.publisher import (
    ORIGIN_LEADER,
    DecisionBoard,
    LatencyDistribution,
    ModelSlot,
    Published,
    latency_quantiles,
)
from controller.config import (
    ConfigError,
    GovernorConfig,
    ModelConfig,
    format_validation_error,
    load_config,
)
from controller.leader import AlwaysLeader, Elector
from controller.loop import Clock, ControlLoop, SystemClock
from controller.metrics import GovernorMetrics
from controller.security import (
    AdminAuthInterceptor,
    AdminToken,
    HardeningInterceptor,
    SecurityConfigError,
    StreamLimiter,
    TlsFiles,
    clip,
    server_credentials,
)
from controller.store import (
    ConflictError,
    FileStore,
    LatencyDoc,
    MemoryStore,
    QuantilesDoc,
    Store,
    StoreError,
    TargetsDoc,
    TargetsInvalidError,
    build_config,
    config_to_targets,
    from_wall,
    published_doc,
    restore_offset,
    to_wall,
)
from controller.types import Decision, Knobs
from estimators.types import (
    LatencyQuantiles,
    MetricSource,
    NoDataError,
    Observation,
    SourceError,
)
from governor_api import externalscaler_pb2_grpc, governor_v1_pb2, governor_v1_pb2_grpc

pb = governor_v1_pb2

DEFAULT_GRPC_LISTEN = "0.0.0.0:50051"
DEFAULT_METRICS_LISTEN = "0.0.0.0:9464"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # largest response (GetStatus of many models), bytes
MAX_REQUEST_BYTES = 1024 * 1024  # largest request a client may send, bytes
MAX_CONCURRENT_RPCS = 2048
MAX_WATCH_STREAMS = 1024  # WatchBatchingConfig + StreamIsActive streams open at once
MAX_MODELS = 2000  # models a target set may hold after an admin addition
MAX_NAME_CHARS = 253
ADMIN_TOKEN_ENV = "GOVERNOR_ADMIN_TOKEN_FILE"
ADMIN_CALL_TIMEOUT_S = 10.0  # server-side cap on one admin call's store I/O
SHUTDOWN_GRACE_S = 10.0
MAX_ENGINES_TRACKED = 10_000  # per model, for status
DEMO_MODEL = "demo"


class AdminError(Exception):
    """An admin request that cannot be done; nothing was changed."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = clip(message)
        super().__init__(f"{code.name}: {self.message}")


class SimulatorUnavailableError(Exception):
    """`--simulated-fleet` was asked for but the simulator cannot provide a fleet."""


# ====================================================================== conversions
def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_strip_none(v) for v in value]
    return value


def target_to_pb(model: ModelConfig) -> governor_v1_pb2.ModelTarget:
    """A ModelConfig as the API's ModelTarget (field names are the config keys)."""
    data = _strip_none(model.model_dump(mode="json"))
    return json_format.ParseDict(data, pb.ModelTarget())


def target_from_pb(target: governor_v1_pb2.ModelTarget) -> dict[str, Any]:
    """The set fields of a ModelTarget as a config mapping (unset -> config default)."""
    return json_format.MessageToDict(target, preserving_proto_field_name=True)


def validate_target(data: dict[str, Any]) -> ModelConfig:
    """Validate one model's target; AdminError(INVALID_ARGUMENT) naming each problem."""
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        problems = format_validation_error(exc, prefix="target")
        raise AdminError(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems)) from None


_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def profile_name_problem(profile: str, allowed: Iterable[str] = ()) -> str | None:
    """Why an admin call may not use `profile`, or None.

    Through the admin API a profile is a shipped profile's name, never a file path (an
    operator may point the config file at a profile file; a remote caller may not make
    the server read files), unless it is one already configured (`allowed`)."""
    if profile in set(allowed):
        return None
    if _PROFILE_NAME.fullmatch(profile) and not profile.endswith((".yaml", ".yml")):
        return None
    return (
        "target.profile: must be the name of a shipped profile, not a path "
        f"(got {clip(profile, 80)!r})"
    )


def _quantiles_pb(q: LatencyQuantiles) -> governor_v1_pb2.LatencyQuantiles:
    out = pb.LatencyQuantiles()
    for k in ("p50_ms", "p90_ms", "p95_ms", "p99_ms"):
        v = getattr(q, k)
        if v is not None:
            setattr(out, k, float(v))
    return out


def latency_to_pb(
    model: str, dist: LatencyDistribution | None
) -> governor_v1_pb2.LatencyDistribution:
    """GetLatencyDistribution's answer; `present` False when nothing was observed yet."""
    if dist is None:
        return pb.LatencyDistribution(model=model, present=False)
    return pb.LatencyDistribution(
        model=model,
        present=True,
        observed_at_unix_s=dist.observed_at_unix_s,
        ttft=_quantiles_pb(dist.ttft),
        itl=_quantiles_pb(dist.itl),
        e2e=_quantiles_pb(dist.e2e),
    )


def _latency_doc(dist: LatencyDistribution | None) -> LatencyDoc | None:
    if dist is None:
        return None
    return LatencyDoc(
        ttft=QuantilesDoc(**asdict(dist.ttft)),
        itl=QuantilesDoc(**asdict(dist.itl)),
        e2e=QuantilesDoc(**asdict(dist.e2e)),
        observed_at_unix_s=dist.observed_at_unix_s,
    )


def _latency_from_doc(doc: LatencyDoc | None) -> LatencyDistribution | None:
    if doc is None:
        return None
    return LatencyDistribution(
        ttft=LatencyQuantiles(**doc.ttft.model_dump()),
        itl=LatencyQuantiles(**doc.itl.model_dump()),
        e2e=LatencyQuantiles(**doc.e2e.model_dump()),
        observed_at_unix_s=doc.observed_at_unix_s,
    )


def observation_to_pb(
    obs: Observation | NoDataError | SourceError | None,
) -> governor_v1_pb2.ObservationStatus:
    """Status view of an observation. Latency quantiles as `latency_quantiles` reads
    them: the source's distributions, else the point fields and `extra` keys."""
    if obs is None:
        return pb.ObservationStatus(present=False, no_data="no tick yet")
    if not isinstance(obs, Observation):
        return pb.ObservationStatus(present=False, no_data=str(obs))
    out = pb.ObservationStatus(
        present=True,
        observed_at_s=obs.observed_at_s,
        staleness_s=obs.staleness_s,
        arrival_rate_rps=obs.arrival_rate_rps,
        ttft=_quantiles_pb(latency_quantiles(obs, "ttft")),
        itl=_quantiles_pb(latency_quantiles(obs, "itl")),
        e2e=_quantiles_pb(latency_quantiles(obs, "e2e")),
        queue_time=_quantiles_pb(latency_quantiles(obs, "queue_time")),
    )
    for name in (
        "arrival_rate_short_rps",
        "prompt_tokens_p95",
        "output_tokens_p95",
        "running",
        "waiting",
        "kv_usage_frac",
        "ttft_attainment_frac",
        "itl_attainment_frac",
    ):
        v = getattr(obs, name)
        if v is not None and math.isfinite(v):
            setattr(out, name, float(v))
    if obs.ready_replicas is not None:
        out.ready_replicas = int(obs.ready_replicas)
    return out


def decision_to_pb(d: Decision) -> governor_v1_pb2.DecisionSummary:
    out = pb.DecisionSummary(
        valid=d.valid,
        replicas=d.replicas,
        max_num_seqs=d.knobs.max_num_seqs,
        max_num_batched_tokens=d.knobs.max_num_batched_tokens,
        knob_reason=d.knob_reason.value,
        stage_reasons=[f"{s.name}:{s.reason.value}" for s in d.stages],
        at_s=d.at_s,
        panic=d.panic,
        detail=d.detail,
    )
    for name in ("demand_rps", "capacity_rps_per_replica", "raw_replicas"):
        v = getattr(d, name)
        if v is not None and math.isfinite(v):
            setattr(out, name, float(v))
    return out


def trace_to_pb(d: Decision) -> governor_v1_pb2.DecisionTrace:
    return pb.DecisionTrace(
        summary=decision_to_pb(d),
        stages=[
            pb.StageTrace(
                name=s.name, before=s.before, after=s.after, reason=s.reason.value, detail=s.detail
            )
            for s in d.stages
        ],
        text=d.explain(),
    )


def batching_to_pb(p: Published) -> governor_v1_pb2.BatchingConfig:
    return pb.BatchingConfig(
        model=p.model,
        max_num_seqs=p.knobs.max_num_seqs,
        max_num_batched_tokens=p.knobs.max_num_batched_tokens,
        generation=p.generation,
        reason=p.reason,
        decided_at_unix_s=p.decided_at_unix_s or 0.0,
        engine_args=p.knobs.engine_args(),
    )


# ====================================================================== core
@dataclass(frozen=True, slots=True)
class ModelStatusView:
    """Everything GetStatus reports about one model (plain data, no protobuf)."""

    model: str
    paused: bool
    observation: Observation | NoDataError | SourceError | None
    decision: Decision | None
    published: Published
    engines_seen: int
    actuation: str


@dataclass(frozen=True, slots=True)
class StatusView:
    models: tuple[ModelStatusView, ...]
    instance: str
    leader: bool
    leader_identity: str
    last_tick_unix_s: float | None
    store: str
    targets_revision: str
    targets_problem: str


@dataclass
class _Counters:
    ticks: int = 0
    targets_refused: int = 0
    state_save_failures: int = 0


def _slots(cfg: GovernorConfig) -> list[ModelSlot]:
    return [
        ModelSlot(
            m.name,
            m.namespace,
            Knobs(m.knobs.default_max_num_seqs, m.knobs.default_max_num_batched_tokens),
        )
        for m in cfg.models
    ]


def _published(
    saved: Mapping[str, Any], keep: Container[str] | None = None
) -> dict[str, Published]:
    """Board entries from a state document's saved publications (only the `keep` models)."""
    return {
        name: Published(
            model=name,
            namespace="",
            knobs=Knobs(p.max_num_seqs, p.max_num_batched_tokens),
            generation=p.generation,
            replicas=p.replicas,
            reason=p.reason,
            decided_at_unix_s=p.decided_at_unix_s,
            latency=_latency_from_doc(p.latency),
        )
        for name, p in saved.items()
        if keep is None or name in keep
    }


class ServiceCore:
    """Targets, loop, board, persistence and leadership of one governor instance.

    `base_config`: the config file (global policy, Prometheus settings, and the models
    used when the store holds no targets yet). `source`: the MetricSource.
    `store`: where targets and state persist. `actuators`: besides the board (always
    first), e.g. the Kubernetes scale actuator. `elector`: who actuates (default: this
    instance). `clock`: monotonic + wall time (injected in tests).

    Raises StoreError at construction when the store holds a corrupt state document or
    cannot be read: the service must not start with garbage.
    """

    def __init__(
        self,
        base_config: GovernorConfig,
        source: MetricSource,
        store: Store | None = None,
        *,
        actuators: Sequence[Actuator] = (),
        elector: Elector | None = None,
        clock: Clock | None = None,
        metrics: GovernorMetrics | None = None,
        logger: Any = None,
        max_models: int = MAX_MODELS,
    ) -> None:
        self.base = base_config
        self.max_models = max_models
        self.source = source
        self.store: Store = store if store is not None else MemoryStore()
        self.clock: Clock = clock or SystemClock()
        self.metrics = metrics or GovernorMetrics()
        self.elector: Elector = elector or AlwaysLeader()
        self.extra_actuators = list(actuators)
        self.log = logger or structlog.get_logger("governor.service")
        self._loop_logger = logger  # None: the loop's own default logger
        self.board = DecisionBoard(wall=self.clock.wall, logger=logger)
        self._targets_lock = threading.RLock()
        self._tick_lock = threading.Lock()
        self._engines: dict[str, dict[str, float]] = {}
        self._engines_lock = threading.Lock()
        self.counters = _Counters()
        self._install_metrics()
        for act in self.extra_actuators:
            self._wire_error_hook(act)
        self.config: GovernorConfig = base_config
        self.targets: TargetsDoc = config_to_targets(base_config)
        self.targets_revision = ""
        self.targets_problem = ""
        self._refused_revision: str | None = None
        self._was_leader = True
        self.loop = self._restore()

    # ------------------------------------------------------------------ metrics
    def _install_metrics(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        r = self.metrics.registry
        self.m_leader = Gauge(
            "governor_leader", "1 while this instance is the leader (actuates)", registry=r
        )
        self.m_targets_refused = Counter(
            "governor_targets_refused", "Stored target sets refused as invalid", registry=r
        )
        self.m_store_errors = Counter(
            "governor_store_errors", "Store read/write failures by operation", ["op"], registry=r
        )
        self.m_admin_denied = Counter(
            "governor_admin_unauthenticated",
            "Admin API calls refused for missing or wrong credentials",
            registry=r,
        )
        self.m_streams_refused = Counter(
            "governor_watch_streams_refused",
            "Watch streams (engines + KEDA) refused at the --max-watch-streams limit",
            registry=r,
        )
        self.m_watch_streams = Gauge(
            "governor_watch_streams", "Open watch streams (engines + KEDA)", registry=r
        )
        self.m_tick_lateness = Histogram(
            "governor_tick_lateness_seconds",
            "How long after its scheduled time each tick started (the ticker's monotonic "
            "schedule; 0 = on time)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )

    def _wire_error_hook(self, act: Actuator) -> None:
        """Count an actuator's own failure reports (e.g. the Kubernetes actuator's 403,
        404, HPA conflict, retries exhausted) in governor_actuation_errors_total."""
        hook = getattr(act, "set_error_hook", None)
        if not callable(hook):
            return
        errors = self.metrics.actuation_errors
        name = type(act).__name__
        hook(lambda reason: errors.labels(name, reason).inc())

    # ------------------------------------------------------------------ restore
    def _offset(self) -> float:
        """wall - monotonic, seconds (see controller.store.to_wall)."""
        return self.clock.wall() - self.clock.monotonic()

    def _restore(self) -> ControlLoop:
        """Load targets and state from the store and build the loop."""
        state_doc = self.store.load_state()  # StoreError propagates: refuse to start
        cfg, doc, revision = self.base, config_to_targets(self.base), ""
        try:
            stored = self.store.load_targets()
        except TargetsInvalidError as exc:
            self._refuse(exc.revision, str(exc))
            stored = None
            if state_doc is not None and state_doc.targets is not None:
                # the last valid targets this service applied before the restart
                try:
                    cfg = build_config(self.base, state_doc.targets, "last valid targets")
                    doc = state_doc.targets
                except ConfigError as exc2:
                    self.log.error("last_valid_targets_invalid", error=str(exc2))
            revision = exc.revision
        if stored is not None:
            try:
                cfg = build_config(self.base, stored.doc, self.store.description)
                doc, revision = stored.doc, stored.revision
            except ConfigError as exc:
                if isinstance(self.store, FileStore):
                    raise StoreError(str(exc)) from None
                self._refuse(stored.revision, str(exc))
                revision = stored.revision
        elif not revision:
            # Nothing stored yet: seed the store with the config file's models.
            try:
                revision = self.store.save_targets(doc, "")
            except ConflictError:
                revision = ""  # someone else seeded it; the first poll picks it up
            except StoreError as exc:
                self.m_store_errors.labels("save_targets").inc()
                self.log.error("targets_seed_failed", error=str(exc))
        self.config, self.targets, self.targets_revision = cfg, doc, revision
        self.board.configure(_slots(cfg))
        states = {}
        if state_doc is not None:
            offset = restore_offset(
                self.clock.wall(), self.clock.monotonic(), state_doc.saved_at_unix_s
            )
            names = {m.name for m in cfg.models}
            for name, raw in state_doc.models.items():
                if name in names:
                    states[name] = from_wall(raw, offset, f"{self.store.description}: {name}")
            self.board.restore(_published(state_doc.published, keep=names))
            self.log.info(
                "state_restored",
                store=self.store.description,
                models=sorted(states),
                saved_at_unix_s=state_doc.saved_at_unix_s,
            )
        loop = ControlLoop(
            cfg,
            self.source,
            [self.board, *self.extra_actuators],
            clock=self.clock,
            metrics=self.metrics,
            logger=self._loop_logger,
            states=states,
        )
        for name in doc.paused:
            with contextlib.suppress(KeyError):
                loop.pause(name)
        return loop

    # ------------------------------------------------------------------ tick
    def tick(self, now_s: float | None = None) -> list[Decision]:
        """One service tick at `now_s` (monotonic seconds; default the clock's)."""
        with self._tick_lock:
            self.poll_targets()
            leader = self.elector.is_leader()
            self.m_leader.set(1 if leader else 0)
            if leader and not self._was_leader:
                self._take_over()
            self._was_leader = leader
            self.counters.ticks += 1
            if not leader:
                self._follow()
                return []
            decisions = self.loop.tick(now_s)
            self._publish_latency()
            self._save_state()
            return decisions

    def _publish_latency(self) -> None:
        """Put each model's latency distribution of this tick on the board (served by
        GetLatencyDistribution, saved with the publications so followers serve it too);
        a model without latency data this tick keeps its last one."""
        wall = self.clock.wall()
        latencies = {}
        for name, ms in self.loop.snapshot().models.items():
            if isinstance(ms.observation, Observation):
                dist = LatencyDistribution.of(ms.observation, wall)
                if dist is not None:
                    latencies[name] = dist
        self.board.set_latency(latencies)

    def _take_over(self) -> None:
        """We just became leader: continue from the leader's last saved state."""
        with self._targets_lock:  # no admin change may land on the loop being replaced
            self._take_over_locked()

    def _take_over_locked(self) -> None:
        try:
            doc = self.store.load_state()
        except StoreError as exc:
            self.log.error("takeover_state_unreadable", error=str(exc))
            doc = None
        states = {}
        if doc is not None:
            offset = restore_offset(self.clock.wall(), self.clock.monotonic(), doc.saved_at_unix_s)
            for name, raw in doc.models.items():
                if name in {m.name for m in self.config.models}:
                    try:
                        states[name] = from_wall(raw, offset, name)
                    except StoreError as exc:
                        self.log.error("takeover_state_invalid", model=name, error=str(exc))
        paused = self.loop.paused()
        loop = ControlLoop(
            self.config,
            self.source,
            [self.board, *self.extra_actuators],
            clock=self.clock,
            metrics=self.metrics,
            logger=self._loop_logger,
            states=states,
        )
        for name in paused:
            with contextlib.suppress(KeyError):
                loop.pause(name)
        self.loop = loop
        self.log.info("took_over", identity=self.elector.identity, models=sorted(states))

    def _follow(self) -> None:
        """Mirror the leader's published values (engines and KEDA get the leader's
        decisions whichever instance they reach)."""
        try:
            doc = self.store.load_state()
        except StoreError as exc:
            self.m_store_errors.labels("load_state").inc()
            self.log.warning("follow_failed", error=str(exc))
            return
        if doc is None:
            return
        self.board.restore(_published(doc.published), origin=ORIGIN_LEADER)

    def _state_doc(self) -> Any:
        from controller.store import StateDoc

        offset = self._offset()
        published = {
            name: published_doc(
                p.knobs,
                generation=p.generation,
                replicas=p.replicas,
                reason=p.reason[:64],
                decided_at_unix_s=p.decided_at_unix_s,
                latency=_latency_doc(p.latency),
            )
            for name, p in self.board.snapshot().items()
        }
        return StateDoc(
            saved_at_unix_s=self.clock.wall(),
            leader=self.elector.identity,
            models={name: to_wall(st, offset) for name, st in self.loop.states().items()},
            published=published,
            targets=self.targets,
            targets_revision=self.targets_revision,
        )

    def _save_state(self) -> None:
        try:
            self.store.save_state(self._state_doc())
        except StoreError as exc:
            self.counters.state_save_failures += 1
            self.m_store_errors.labels("save_state").inc()
            self.log.error("state_save_failed", error=str(exc))

    def flush(self) -> None:
        """Save the state now (graceful shutdown), if this instance is the leader."""
        with self._tick_lock:
            if self.elector.is_leader() and self.counters.ticks > 0:
                self._save_state()

    def close(self) -> None:
        """Release leadership and stop actuator workers."""
        self.elector.stop(release=True)
        for act in self.extra_actuators:
            close = getattr(act, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:
                    self.log.error("actuator_close_failed", error=repr(exc))

    # ------------------------------------------------------------------ targets
    def _refuse(self, revision: str, problem: str) -> None:
        if revision == self._refused_revision:
            return
        self._refused_revision = revision
        self.targets_problem = problem
        self.counters.targets_refused += 1
        self.m_targets_refused.inc()
        self.log.warning(
            "targets_refused", revision=revision, problem=problem, kept=self.targets_revision
        )

    def poll_targets(self) -> None:
        """Apply the stored targets if they changed and are valid (see module doc)."""
        with self._targets_lock:
            try:
                stored = self.store.load_targets()
            except TargetsInvalidError as exc:
                self._refuse(exc.revision, str(exc))
                return
            except StoreError as exc:
                self.m_store_errors.labels("load_targets").inc()
                self.log.warning("targets_unreadable", error=str(exc))
                return
            if stored is None or stored.revision == self.targets_revision:
                return
            if stored.revision == self._refused_revision:
                return
            try:
                cfg = build_config(self.base, stored.doc, self.store.description)
            except ConfigError as exc:
                self._refuse(stored.revision, str(exc))
                return
            self._apply(cfg, stored.doc, stored.revision)

    def _apply(self, cfg: GovernorConfig, doc: TargetsDoc, revision: str) -> None:
        self.loop.set_config(cfg)
        self.board.configure(_slots(cfg))
        for m in cfg.models:
            if m.name in doc.paused:
                self.loop.pause(m.name)
            else:
                self.loop.resume(m.name)
        changed = [m.name for m in cfg.models if m not in self.config.models]
        removed = sorted({m.name for m in self.config.models} - {m.name for m in cfg.models})
        self.config, self.targets, self.targets_revision = cfg, doc, revision
        self.targets_problem = ""
        self._refused_revision = None
        self.log.info(
            "targets_applied", revision=revision, changed=changed, removed=removed,
            paused=list(doc.paused),
        )  # fmt: skip

    def _update_targets(
        self,
        change: Callable[[TargetsDoc], TargetsDoc],
        expected_revision: str | None,
        dry_run: bool = False,
    ) -> tuple[GovernorConfig, str]:
        """Read-modify-write of the target set with optimistic concurrency."""
        with self._targets_lock:
            for _ in range(5):
                try:
                    stored = self.store.load_targets()
                except TargetsInvalidError as exc:
                    # Stored set is broken: build on the last valid one, replacing it.
                    stored_doc, stored_rev = self.targets, exc.revision
                except StoreError as exc:
                    raise AdminError(grpc.StatusCode.UNAVAILABLE, f"store: {exc}") from None
                else:
                    stored_doc = stored.doc if stored else self.targets
                    stored_rev = stored.revision if stored else ""
                if expected_revision is not None and expected_revision != stored_rev:
                    raise AdminError(
                        grpc.StatusCode.ABORTED,
                        f"targets changed since revision {expected_revision} (now "
                        f"{stored_rev or 'none'}); read them again and retry",
                    )
                doc = change(stored_doc)
                try:
                    cfg = build_config(self.base, doc, "target")
                except ConfigError as exc:
                    raise AdminError(
                        grpc.StatusCode.INVALID_ARGUMENT, "; ".join(exc.problems)
                    ) from None
                if dry_run:
                    return cfg, stored_rev
                try:
                    rev = self.store.save_targets(doc, stored_rev)
                except ConflictError:
                    if expected_revision is not None:
                        raise AdminError(
                            grpc.StatusCode.ABORTED,
                            "targets changed concurrently; read them again and retry",
                        ) from None
                    continue
                except StoreError as exc:
                    self.m_store_errors.labels("save_targets").inc()
                    raise AdminError(grpc.StatusCode.UNAVAILABLE, f"store: {exc}") from None
                self._apply(cfg, doc, rev)
                return cfg, rev
            raise AdminError(grpc.StatusCode.ABORTED, "targets kept changing; retry")

    def set_target(
        self, data: dict[str, Any], expected_revision: str | None = None, dry_run: bool = False
    ) -> tuple[ModelConfig, str]:
        """Create or replace one model's target (validated alone, then as a whole)."""
        model = validate_target(data)
        configured = [m.profile for m in (*self.base.models, *self.config.models)]
        problem = profile_name_problem(model.profile, configured)
        if problem is not None:
            raise AdminError(grpc.StatusCode.INVALID_ARGUMENT, problem)
        entry = model.model_dump(mode="json", exclude_defaults=True) | {"name": model.name}

        def change(doc: TargetsDoc) -> TargetsDoc:
            models = list(doc.models)
            for i, m in enumerate(models):
                if m.get("name") == model.name:
                    models[i] = entry
                    break
            else:
                if len(models) >= self.max_models:
                    raise AdminError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"the target set holds {len(models)} models, the limit "
                        f"(--max-models {self.max_models}); delete one first",
                    )
                models.append(entry)
            return TargetsDoc(models=tuple(models), paused=doc.paused)

        cfg, rev = self._update_targets(change, expected_revision, dry_run)
        return cfg.model(model.name), rev

    def _require(self, name: str) -> ModelConfig:
        if not name:
            raise AdminError(grpc.StatusCode.INVALID_ARGUMENT, "model: must not be empty")
        try:
            return self.config.model(name)
        except KeyError:
            known = ", ".join(m.name for m in self.config.models)
            raise AdminError(
                grpc.StatusCode.NOT_FOUND,
                f"model {name!r} is not configured (configured: {known})",
            ) from None

    def get_target(self, name: str) -> tuple[ModelConfig, str, bool]:
        with self._targets_lock:
            m = self._require(name)
            return m, self.targets_revision, name in self.targets.paused

    def list_targets(self) -> tuple[list[tuple[ModelConfig, bool]], str]:
        with self._targets_lock:
            paused = set(self.targets.paused)
            return [(m, m.name in paused) for m in self.config.models], self.targets_revision

    def delete_target(self, name: str, expected_revision: str | None = None) -> str:
        with self._targets_lock:
            self._require(name)
            if len(self.config.models) == 1:
                raise AdminError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"model {name!r} is the last one; a config holds at least one model",
                )

            def change(doc: TargetsDoc) -> TargetsDoc:
                return TargetsDoc(
                    models=tuple(m for m in doc.models if m.get("name") != name),
                    paused=tuple(p for p in doc.paused if p != name),
                )

            return self._update_targets(change, expected_revision)[1]

    def set_paused(self, name: str, paused: bool) -> bool:
        """Shadow mode on (`paused`) or off for `name`; persisted with the targets."""
        with self._targets_lock:
            self._require(name)

            def change(doc: TargetsDoc) -> TargetsDoc:
                rest = tuple(p for p in doc.paused if p != name)
                return TargetsDoc(models=doc.models, paused=(*rest, name) if paused else rest)

            self._update_targets(change, None)
            return paused

    # ------------------------------------------------------------------ reads
    def deployments(self) -> dict[str, tuple[str, str]]:
        """model -> (namespace, deployment), for the Kubernetes actuator."""
        return {m.name: (m.namespace, m.deployment) for m in self.config.models}

    def record_engine(self, model: str, engine_id: str) -> None:
        if not engine_id:
            return
        with self._engines_lock:
            seen = self._engines.setdefault(model, {})
            if engine_id in seen or len(seen) < MAX_ENGINES_TRACKED:
                seen[engine_id] = self.clock.wall()

    def explain(self, name: str, last: int = 0) -> tuple[Decision, ...]:
        self._require(name)
        snap = self.loop.snapshot().models.get(name)
        history = snap.history if snap is not None else ()
        return history[-last:] if last > 0 else history

    def status(self, names: Iterable[str] = ()) -> StatusView:
        wanted = list(names)
        for n in wanted:
            self._require(n)
        snap = self.loop.snapshot()
        actuation: dict[str, str] = {}
        for act in self.extra_actuators:
            status_fn = getattr(act, "status", None)
            if callable(status_fn):
                for model, st in status_fn().items():
                    describe = getattr(st, "describe", None)
                    actuation[model] = describe() if callable(describe) else str(st)
        models = []
        for m in self.config.models:
            if wanted and m.name not in wanted:
                continue
            ms = snap.models.get(m.name)
            try:
                published = self.board.get(m.name)
            except KeyError:
                continue
            with self._engines_lock:
                engines = len(self._engines.get(m.name, {}))
            models.append(
                ModelStatusView(
                    model=m.name,
                    paused=m.name in self.loop.paused(),
                    observation=ms.observation if ms is not None else None,
                    decision=ms.decision if ms is not None else None,
                    published=published,
                    engines_seen=engines,
                    actuation=actuation.get(m.name, ""),
                )
            )
        return StatusView(
            models=tuple(models),
            instance=self.elector.identity,
            leader=self.elector.is_leader(),
            leader_identity=self.elector.leader_identity(),
            last_tick_unix_s=snap.wall_s,
            store=self.store.description,
            targets_revision=self.targets_revision,
            targets_problem=self.targets_problem,
        )


# ====================================================================== servicers
async def _abort_admin(context: grpc.aio.ServicerContext, exc: AdminError) -> None:
    await context.abort(exc.code, exc.message)


class _Blocking:
    """Runs a core call in a worker thread under the call's deadline (capped)."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    async def run(
        self, context: grpc.aio.ServicerContext, fn: Callable[..., Any], *args: Any
    ) -> Any:
        remaining = context.time_remaining()
        cap = ADMIN_CALL_TIMEOUT_S
        timeout = cap if remaining is None else min(remaining, cap)
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), max(timeout, 0.001))
        except AdminError as exc:
            await _abort_admin(context, exc)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the store did not answer within {timeout:.1f} s; the change may still apply",
            )


def _model_arg(name: str, what: str = "model") -> str | None:
    """A problem with a model argument, or None."""
    if not name:
        return f"{what}: must not be empty"
    if len(name) > 253:
        return f"{what}: at most 253 characters (got {len(name)})"
    return None


class BatchingServicer(governor_v1_pb2_grpc.BatchingServiceServicer):
    """Engines' API: knobs from the board (last-known values, never waits).
    `streams` bounds the open WatchBatchingConfig streams (shared with KEDA's)."""

    def __init__(self, core: ServiceCore, streams: StreamLimiter | None = None) -> None:
        self.core = core
        self.streams = streams

    async def _entry(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> Published:
        problem = _model_arg(request.model) or (
            "engine_id: at most 253 characters" if len(request.engine_id) > 253 else None
        )
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            entry = self.core.board.get(request.model)
        except KeyError:
            known = ", ".join(self.core.board.models()) or "none"
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {request.model!r} is not configured (configured: {known})",
            )
        self.core.record_engine(request.model, request.engine_id)
        return entry

    async def GetBatchingConfig(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.BatchingConfig:
        return batching_to_pb(await self._entry(request, context))

    async def GetLatencyDistribution(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.LatencyDistribution:
        entry = await self._entry(request, context)
        return latency_to_pb(entry.model, entry.latency)

    async def WatchBatchingConfig(
        self, request: governor_v1_pb2.GetBatchingConfigRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        await self._entry(request, context)
        if self.streams is not None and not self.streams.try_acquire():
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, self.streams.message("WatchBatchingConfig")
            )
        try:
            last: tuple[int, Knobs] | None = None
            async for _ in self.core.board.watch():
                try:
                    entry = self.core.board.get(request.model)
                except KeyError:
                    await context.abort(
                        grpc.StatusCode.NOT_FOUND, f"model {request.model!r} was removed"
                    )
                key = (entry.generation, entry.knobs)
                if key != last:
                    last = key
                    yield batching_to_pb(entry)
        finally:
            if self.streams is not None:
                self.streams.release()


class AdminServicer(governor_v1_pb2_grpc.AdminServiceServicer):
    """Operators' API over ServiceCore (see the .proto for each rpc's contract)."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self._blocking = _Blocking(core)

    async def SetTarget(
        self, request: governor_v1_pb2.SetTargetRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.TargetResponse:
        if not request.HasField("target"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "target: required")
        data = target_from_pb(request.target)
        expected = request.expected_revision if request.HasField("expected_revision") else None
        model, rev = await self._blocking.run(
            context, self.core.set_target, data, expected, request.dry_run
        )
        return pb.TargetResponse(
            target=target_to_pb(model), revision=rev, paused=model.name in self.core.targets.paused
        )

    async def GetTarget(
        self, request: governor_v1_pb2.GetTargetRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.TargetResponse:
        model, rev, paused = await self._blocking.run(context, self.core.get_target, request.model)
        return pb.TargetResponse(target=target_to_pb(model), revision=rev, paused=paused)

    async def ListTargets(
        self, request: governor_v1_pb2.ListTargetsRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.ListTargetsResponse:
        items, rev = await self._blocking.run(context, self.core.list_targets)
        return pb.ListTargetsResponse(
            targets=[
                pb.TargetResponse(target=target_to_pb(m), revision=rev, paused=p) for m, p in items
            ],
            revision=rev,
        )

    async def DeleteTarget(
        self, request: governor_v1_pb2.DeleteTargetRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.DeleteTargetResponse:
        expected = request.expected_revision if request.HasField("expected_revision") else None
        rev = await self._blocking.run(context, self.core.delete_target, request.model, expected)
        return pb.DeleteTargetResponse(revision=rev)

    async def GetStatus(
        self, request: governor_v1_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.GetStatusResponse:
        if len(request.models) > self.core.max_models:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"models: at most {self.core.max_models} names (got {len(request.models)})",
            )
        view: StatusView = await self._blocking.run(context, self.core.status, list(request.models))
        models = []
        for m in view.models:
            p = m.published
            ms = pb.ModelStatus(
                model=m.model,
                paused=m.paused,
                observation=observation_to_pb(m.observation),
                published=pb.PublishedStatus(
                    has_replicas=p.replicas is not None,
                    replicas=p.replicas or 0,
                    max_num_seqs=p.knobs.max_num_seqs,
                    max_num_batched_tokens=p.knobs.max_num_batched_tokens,
                    generation=p.generation,
                    reason=p.reason,
                    decided_at_unix_s=p.decided_at_unix_s or 0.0,
                    origin=p.origin,
                    engines_seen=m.engines_seen,
                ),
                actuation=m.actuation,
            )
            if m.decision is not None:
                ms.decision.CopyFrom(decision_to_pb(m.decision))
            models.append(ms)
        return pb.GetStatusResponse(
            models=models,
            instance=view.instance,
            leader=view.leader,
            leader_identity=view.leader_identity,
            last_tick_unix_s=view.last_tick_unix_s or 0.0,
            store=view.store,
            targets_revision=view.targets_revision,
            targets_problem=view.targets_problem,
        )

    async def Explain(
        self, request: governor_v1_pb2.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.ExplainResponse:
        history = await self._blocking.run(context, self.core.explain, request.model, request.last)
        return pb.ExplainResponse(model=request.model, decisions=[trace_to_pb(d) for d in history])

    async def PauseActuation(
        self, request: governor_v1_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.PauseResponse:
        paused = await self._blocking.run(context, self.core.set_paused, request.model, True)
        return pb.PauseResponse(model=request.model, paused=paused)

    async def ResumeActuation(
        self, request: governor_v1_pb2.PauseRequest, context: grpc.aio.ServicerContext
    ) -> governor_v1_pb2.PauseResponse:
        paused = await self._blocking.run(context, self.core.set_paused, request.model, False)
        return pb.PauseResponse(model=request.model, paused=paused)


# ====================================================================== server
def parse_listen(value: str, what: str = "address") -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::]:PORT`) -> (host, port); ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what} must be HOST:PORT (got {value!r})")
    host = host.strip("[]")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what}: port must be 0-65535 (got {port!r} in {value!r})")
    return host, int(port)


class _Ticker:
    """Calls `fn()` every `interval_s` seconds on a thread, first at once; a slow tick
    delays the next one instead of queueing several (missed ticks are coalesced).
    `on_late(seconds)` gets each tick's lateness: how long after its scheduled monotonic
    time it started (0 when on time; a tick delayed by a slow previous one or by a
    starved thread shows here)."""

    def __init__(
        self,
        fn: Callable[[], Any],
        interval_s: float,
        logger: Any,
        on_late: Callable[[float], None] | None = None,
    ) -> None:
        self.fn = fn
        self.interval_s = interval_s
        self.log = logger
        self.on_late = on_late
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="governor-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            if self.on_late is not None:
                with contextlib.suppress(Exception):
                    self.on_late(max(0.0, time.monotonic() - next_at))
            try:
                self.fn()
            except Exception as exc:
                self.log.error("tick_failed", error=repr(exc))
            now = time.monotonic()
            next_at = max(next_at + self.interval_s, now + 0.001)

    def stop(self, timeout_s: float = SHUTDOWN_GRACE_S) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


class GovernorServer:
    """The gRPC server (asyncio), /metrics and the ticker around one ServiceCore.

    `grpc_listen`/`metrics_listen`: HOST:PORT (port 0: pick one; see `port` and
    `metrics_port` after `start`); `metrics_listen` None: no HTTP server.
    `autotick` False: the caller drives `core.tick()` (tests).
    `admin_token`: required on AdminService calls (controller.security); None: the admin
    API is disabled unless `allow_unauthenticated_admin` (tests, loopback development).
    `tls`: serve TLS (mTLS with a client CA) instead of plaintext.
    `admin_listen`: HOST:PORT serving the AdminService (and health) alone, e.g. a
    loopback address reached with `kubectl port-forward`; the `grpc_listen` listener
    then serves only the engines' and KEDA's read-only APIs (admin calls there:
    UNIMPLEMENTED). None: everything on `grpc_listen`.
    `max_watch_streams`: open WatchBatchingConfig + StreamIsActive streams at most.
    `max_request_bytes`/`max_message_bytes`: largest request received / response sent.
    """

    def __init__(
        self,
        core: ServiceCore,
        *,
        grpc_listen: str = DEFAULT_GRPC_LISTEN,
        metrics_listen: str | None = DEFAULT_METRICS_LISTEN,
        autotick: bool = True,
        tick_interval_s: float | None = None,
        max_concurrent_rpcs: int = MAX_CONCURRENT_RPCS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        max_watch_streams: int = MAX_WATCH_STREAMS,
        admin_token: AdminToken | None = None,
        allow_unauthenticated_admin: bool = False,
        tls: TlsFiles | None = None,
        admin_listen: str | None = None,
        logger: Any = None,
    ) -> None:
        self.core = core
        self.admin_listen = admin_listen
        self.max_request_bytes = max_request_bytes
        self.admin_token = admin_token
        self.allow_unauthenticated_admin = allow_unauthenticated_admin
        self.tls = tls
        self.streams = StreamLimiter(max_watch_streams, on_refused=core.m_streams_refused.inc)
        self.grpc_listen = grpc_listen
        self.metrics_listen = metrics_listen
        self.autotick = autotick
        self.tick_interval_s = tick_interval_s or core.config.policy.tick_interval_s
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.max_message_bytes = max_message_bytes
        self.log = logger or structlog.get_logger("governor.server")
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._admin_server: grpc.aio.Server | None = None
        self.admin_port: int | None = None
        self._health: Any = None
        self._httpd: Any = None
        self._ticker: _Ticker | None = None
        parse_listen(grpc_listen, "--grpc-listen")
        if admin_listen is not None:
            parse_listen(admin_listen, "--admin-listen")
        if metrics_listen is not None:
            parse_listen(metrics_listen, "--metrics-listen")

    async def start(self) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection

        streams = self.streams
        self.core.m_watch_streams.set_function(lambda: streams.active)
        interceptors = [
            AdminAuthInterceptor(
                self.admin_token,
                allow_unauthenticated=self.allow_unauthenticated_admin,
                on_denied=self.core.m_admin_denied.inc,
            ),
            HardeningInterceptor(),
        ]
        options = [
            ("grpc.max_receive_message_length", self.max_request_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            ("grpc.so_reuseport", 0),
        ]

        def new_server() -> grpc.aio.Server:
            return grpc.aio.server(
                options=options,
                maximum_concurrent_rpcs=self.max_concurrent_rpcs,
                interceptors=interceptors,
            )

        server = new_server()
        admin_server = server if self.admin_listen is None else new_server()
        governor_v1_pb2_grpc.add_BatchingServiceServicer_to_server(
            BatchingServicer(self.core, self.streams), server
        )
        governor_v1_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(self.core), admin_server
        )
        externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(
            ExternalScalerService(self.core.board, streams=self.streams), server
        )
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        admin_name = governor_v1_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
        names = [
            governor_v1_pb2.DESCRIPTOR.services_by_name["BatchingService"].full_name,
            "externalscaler.ExternalScaler",
        ]
        if admin_server is server:
            names.insert(1, admin_name)
        else:
            health_pb2_grpc.add_HealthServicer_to_server(self._health, admin_server)
            reflection.enable_server_reflection(
                [admin_name, health.SERVICE_NAME, reflection.SERVICE_NAME], admin_server
            )
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        self.port = self._bind(server, self.grpc_listen, "--grpc-listen")
        if admin_server is not server:
            assert self.admin_listen is not None
            self.admin_port = self._bind(admin_server, self.admin_listen, "--admin-listen")
            await admin_server.start()
            self._admin_server = admin_server
        await server.start()
        self._server = server
        for name in ["", *names, admin_name]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.metrics_listen is not None:
            from prometheus_client import start_http_server

            mhost, mport = parse_listen(self.metrics_listen, "--metrics-listen")
            self._httpd, _ = start_http_server(
                mport, addr=mhost, registry=self.core.metrics.registry
            )
            self.metrics_port = self._httpd.server_address[1]
        self.core.elector.start()
        if self.autotick:
            self._ticker = _Ticker(
                self.core.tick,
                self.tick_interval_s,
                self.log,
                on_late=self.core.m_tick_lateness.observe,
            )
            self._ticker.start()
        if self.admin_token is not None:
            admin = f"token from {self.admin_token.path}"
        elif self.allow_unauthenticated_admin:
            admin = "UNAUTHENTICATED (development only)"
        else:
            admin = "disabled (no admin token)"
        self.log.info(
            "serving",
            grpc_port=self.port,
            metrics_port=self.metrics_port,
            store=self.core.store.description,
            models=[m.name for m in self.core.config.models],
            identity=self.core.elector.identity,
            tls="mtls" if self.tls and self.tls.client_ca_file else ("tls" if self.tls else "off"),
            admin_api=admin,
            admin_port=self.admin_port or self.port,
            max_watch_streams=self.streams.limit,
        )

    def _bind(self, server: grpc.aio.Server, listen: str, flag: str) -> int:
        """Add the listener `listen` (TLS when configured); its port. OSError when it
        cannot listen."""
        host, port = parse_listen(listen, flag)
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self.tls is not None:
                return int(server.add_secure_port(bind, server_credentials(self.tls)))
            return int(server.add_insecure_port(bind))
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {listen} for gRPC ({flag}): {exc}") from None

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Graceful shutdown within `grace_s` seconds (see module doc)."""
        started = time.monotonic()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        stop_task = (
            asyncio.create_task(self._server.stop(grace_s)) if self._server is not None else None
        )
        admin_stop = (
            asyncio.create_task(self._admin_server.stop(grace_s))
            if self._admin_server is not None
            else None
        )
        self.core.board.close()  # ends watch streams: clients reconnect elsewhere
        waits: list[Any] = []
        if stop_task is not None:
            waits.append(stop_task)
        if admin_stop is not None:
            waits.append(admin_stop)
        if self._ticker is not None:
            waits.append(asyncio.to_thread(self._ticker.stop, grace_s))
        await asyncio.gather(*waits)
        left = max(0.5, grace_s - (time.monotonic() - started))
        try:
            await asyncio.wait_for(asyncio.to_thread(self.core.flush), left)
        except TimeoutError:
            self.log.error("final_flush_timed_out", grace_s=grace_s)
        await asyncio.to_thread(self.core.close)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        self.log.info("stopped", seconds=round(time.monotonic() - started, 3))


class WallClockSource:
    """Feeds a wall-time metric source from the monotonic control loop.

    The loop's `now_s` is monotonic seconds (windows must not jump with the wall
    clock); Prometheus evaluates queries at a Unix time. `observe(models, now_s)` asks
    `inner` at `clock.wall()` instead. Example: a loop tick at monotonic 8123.4 s on a
    host whose wall clock reads 1,764,400,000.0 queries Prometheus at time=1764400000.
    """

    def __init__(self, inner: MetricSource, clock: Clock) -> None:
        self.inner = inner
        self.clock = clock

    def observe(self, models: Any, now_s: float) -> Any:
        return self.inner.observe(models, self.clock.wall())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# ====================================================================== governor run
def simulated_fleet_factory(
    trace: str, config: GovernorConfig, *, rate_scale: float = 1.0, speed: float = 1.0
) -> tuple[MetricSource, Actuator]:
    """The seam `governor run --simulated-fleet TRACE` uses: build the embedded simulated
    fleet for `trace` (a trace file path or `synthetic:NAME`) serving `config`'s models,
    and return (its MetricSource, the Actuator that resizes it), both in real time.

    `rate_scale` multiplies the trace's rate (same span); `speed` is simulated seconds
    per real second. Raises SimulatorUnavailableError with a clear message when the trace
    spec is wrong or the simulator cannot be imported.
    """
    if trace.startswith(("synthetic:", "azure:")):
        if not trace.removeprefix("synthetic:"):
            raise SimulatorUnavailableError(
                "--simulated-fleet synthetic:NAME needs a NAME (e.g. synthetic:steady)"
            )
    elif not Path(trace).is_file():
        raise SimulatorUnavailableError(
            f"--simulated-fleet: trace file {trace!r} not found (give a CSV/JSONL path "
            "or synthetic:NAME)"
        )
    import importlib

    try:
        realtime = importlib.import_module("simulator.realtime")
    except ImportError as exc:
        raise SimulatorUnavailableError(
            "--simulated-fleet needs the simulator (simulator.realtime), "
            f"which is not available in this build: {exc}"
        ) from None
    try:
        fleet = realtime.build(trace, config, rate_scale=rate_scale, speed=speed)
    except (OSError, ValueError) as exc:
        raise SimulatorUnavailableError(f"--simulated-fleet {trace}: {exc}") from None
    return fleet, fleet


def demo_config() -> GovernorConfig:
    """The config `--simulated-fleet` uses without `--config`: one model named `demo`."""
    return GovernorConfig.model_validate(
        {
            "models": [
                {
                    "name": DEMO_MODEL,
                    "deployment": DEMO_MODEL,
                    "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 50},
                    "replicas": {"min_replicas": 1, "max_replicas": 16},
                }
            ]
        }
    )


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _pod_namespace(default: str = "default") -> str:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    with contextlib.suppress(OSError):
        return path.read_text().strip() or default
    return os.environ.get("POD_NAMESPACE", default)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The `governor run` options (registered by controller.admin_cli)."""
    p.add_argument("--config", help="YAML config file (required unless --simulated-fleet)")
    p.add_argument(
        "--simulated-fleet",
        metavar="TRACE",
        help="run against the embedded simulated fleet in real time: a trace path, "
        "azure:conv|azure:code or synthetic:NAME (serves one model `demo` unless --config "
        "names others)",
    )
    p.add_argument(
        "--sim-rate-scale",
        type=float,
        default=1.0,
        metavar="K",
        help="with --simulated-fleet: K times the trace's requests over the same span",
    )
    p.add_argument(
        "--sim-speed",
        type=float,
        default=1.0,
        metavar="X",
        help="with --simulated-fleet: simulated seconds per real second",
    )
    p.add_argument("--grpc-listen", default=DEFAULT_GRPC_LISTEN, metavar="HOST:PORT")
    p.add_argument("--metrics-listen", default=DEFAULT_METRICS_LISTEN, metavar="HOST:PORT")
    p.add_argument(
        "--store",
        choices=("auto", "file", "configmap", "memory"),
        default="auto",
        help="where targets and state persist (auto: configmap in-cluster, else file)",
    )
    p.add_argument("--state-file", default="governor-state.json", help="for --store file")
    p.add_argument("--configmap", default="governor-targets", help="for --store configmap")
    p.add_argument("--namespace", default=None, help="of the ConfigMap and Lease (default: pod's)")
    p.add_argument(
        "--leader-election",
        choices=("auto", "on", "off"),
        default="auto",
        help="Kubernetes Lease election (auto: on with --store configmap)",
    )
    p.add_argument("--lease", default="llm-governor-leader", help="Lease name")
    p.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="this instance's identity (default: $POD_NAME or the host name)",
    )
    p.add_argument(
        "--scale-via",
        choices=("keda", "kubernetes"),
        default="keda",
        help="keda: serve the external scaler only; kubernetes: also patch Deployments' "
        "scale subresource (clusters without KEDA)",
    )
    p.add_argument("--shutdown-grace-s", type=float, default=SHUTDOWN_GRACE_S)
    p.add_argument("--max-concurrent-rpcs", type=int, default=MAX_CONCURRENT_RPCS)
    p.add_argument(
        "--max-watch-streams",
        type=int,
        default=None,
        help=f"open WatchBatchingConfig + StreamIsActive streams at most (default "
        f"{MAX_WATCH_STREAMS}, at most half of --max-concurrent-rpcs)",
    )
    p.add_argument(
        "--max-models",
        type=int,
        default=MAX_MODELS,
        help="models the target set may hold after an admin addition",
    )
    p.add_argument(
        "--admin-token-file",
        default=os.environ.get(ADMIN_TOKEN_ENV) or None,
        metavar="FILE",
        help="file holding the admin API's bearer token, e.g. a mounted Secret key "
        f"(default ${ADMIN_TOKEN_ENV}); without it the admin API is disabled",
    )
    p.add_argument(
        "--admin-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve the admin API on this listener only (e.g. 127.0.0.1:50052); "
        "--grpc-listen then serves the engines' and KEDA's read-only APIs alone",
    )
    p.add_argument(
        "--insecure-admin",
        action="store_true",
        help="serve the admin API without a token (development only; needs a loopback "
        "--grpc-listen)",
    )
    p.add_argument("--tls-cert-file", metavar="PEM", help="serve gRPC over TLS: certificate")
    p.add_argument("--tls-key-file", metavar="PEM", help="the certificate's private key")
    p.add_argument(
        "--tls-client-ca-file",
        metavar="PEM",
        help="require client certificates signed by this CA (mTLS)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _fail(message: str, code: int) -> int:
    print(f"governor run: {message}", file=sys.stderr)
    return code


def run_service(args: argparse.Namespace) -> int:
    """`governor run`: 0 after a graceful shutdown (SIGTERM/SIGINT), 2 for bad
    arguments or config, 1 when the service cannot start."""
    from controller.logs import configure_logging

    listens = (("--grpc-listen", args.grpc_listen), ("--metrics-listen", args.metrics_listen))
    if args.admin_listen is not None:
        listens += (("--admin-listen", args.admin_listen),)
    for flag, value in listens:
        try:
            parse_listen(value, flag)
        except ValueError as exc:
            return _fail(str(exc), 2)
    if not math.isfinite(args.shutdown_grace_s) or args.shutdown_grace_s <= 0:
        return _fail(f"--shutdown-grace-s must be > 0 (got {args.shutdown_grace_s})", 2)
    if args.max_concurrent_rpcs < 1:
        return _fail(f"--max-concurrent-rpcs must be >= 1 (got {args.max_concurrent_rpcs})", 2)
    if args.max_watch_streams is None:
        args.max_watch_streams = min(MAX_WATCH_STREAMS, max(1, args.max_concurrent_rpcs // 2))
    if not 1 <= args.max_watch_streams < max(2, args.max_concurrent_rpcs):
        return _fail(
            f"--max-watch-streams must be >= 1 and below --max-concurrent-rpcs "
            f"({args.max_concurrent_rpcs}), so streams cannot take every slot "
            f"(got {args.max_watch_streams})",
            2,
        )
    if args.max_models < 1:
        return _fail(f"--max-models must be >= 1 (got {args.max_models})", 2)
    try:
        admin_token, tls = _security_args(args)
    except (SecurityConfigError, ValueError) as exc:
        return _fail(str(exc), 2)
    for flag, value in (("--sim-rate-scale", args.sim_rate_scale), ("--sim-speed", args.sim_speed)):
        if not math.isfinite(value) or value <= 0:
            return _fail(f"{flag} must be > 0 (got {value})", 2)
    if args.config is None and args.simulated_fleet is None:
        return _fail("give --config FILE (or --simulated-fleet TRACE)", 2)
    try:
        config = load_config(args.config) if args.config else demo_config()
    except ConfigError as exc:
        return _fail(str(exc), 2)

    actuators: list[Actuator] = []
    if args.simulated_fleet is not None:
        try:
            source, fleet = simulated_fleet_factory(
                args.simulated_fleet, config, rate_scale=args.sim_rate_scale, speed=args.sim_speed
            )
        except SimulatorUnavailableError as exc:
            return _fail(str(exc), 2)
        actuators.append(fleet)
    else:
        from estimators.prometheus import PrometheusSource

        # Prometheus evaluates at Unix time; the loop's clock is monotonic.
        source = WallClockSource(
            PrometheusSource(
                config.prometheus,
                window_s=config.policy.window_s,
                short_window_s=config.short_window_s,
            ),
            SystemClock(),
        )

    configure_logging(args.log_level)  # after validation: a refused command changes nothing
    kind = args.store
    if kind == "auto":
        kind = "memory" if args.simulated_fleet else ("configmap" if _in_cluster() else "file")
    namespace = args.namespace or _pod_namespace()
    kube = None
    if kind == "configmap" or args.scale_via == "kubernetes" or args.leader_election == "on":
        from actuators.kubernetes import api_client

        try:
            kube = api_client()
        except Exception as exc:
            return _fail(f"cannot configure the Kubernetes client: {exc}", 1)
    store: Store
    if kind == "configmap":
        from kubernetes import client as k8s

        from controller.store import ConfigMapStore

        store = ConfigMapStore(k8s.CoreV1Api(kube), namespace, args.configmap)
    elif kind == "file":
        store = FileStore(args.state_file)
    else:
        store = MemoryStore()
    elector: Elector = AlwaysLeader(args.identity)
    if args.leader_election == "on" or (args.leader_election == "auto" and kind == "configmap"):
        from controller.leader import LeaseElector

        elector = LeaseElector(kube, namespace, args.lease, args.identity)

    core_ref: list[ServiceCore] = []
    if args.scale_via == "kubernetes":
        from actuators.kubernetes import KubernetesScaleActuator

        # its failures are counted by ServiceCore (set_error_hook)
        actuators.append(KubernetesScaleActuator(kube, lambda: core_ref[0].deployments()))
    try:
        core = ServiceCore(
            config,
            source,
            store,
            actuators=actuators,
            elector=elector,
            max_models=args.max_models,
        )
    except StoreError as exc:
        return _fail(f"cannot restore state: {exc}", 1)
    core_ref.append(core)
    try:
        server = GovernorServer(
            core,
            grpc_listen=args.grpc_listen,
            metrics_listen=args.metrics_listen,
            max_concurrent_rpcs=args.max_concurrent_rpcs,
            max_watch_streams=args.max_watch_streams,
            admin_token=admin_token,
            allow_unauthenticated_admin=args.insecure_admin,
            tls=tls,
            admin_listen=args.admin_listen,
        )
        return serve(server, args.shutdown_grace_s)
    except OSError as exc:
        return _fail(str(exc), 1)


_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _security_args(args: argparse.Namespace) -> tuple[AdminToken | None, TlsFiles | None]:
    """The admin token and TLS files of `governor run`; SecurityConfigError or
    ValueError naming the flag (never a file's content)."""
    token = AdminToken(args.admin_token_file) if args.admin_token_file else None
    if args.insecure_admin:
        if token is not None:
            raise ValueError("--insecure-admin and --admin-token-file exclude each other")
        flag, listen = (
            ("--admin-listen", args.admin_listen)
            if args.admin_listen is not None
            else ("--grpc-listen", args.grpc_listen)
        )
        host, _ = parse_listen(listen, flag)
        if host not in _LOOPBACK:
            raise ValueError(
                f"--insecure-admin needs a loopback {flag} (127.0.0.1:PORT): an "
                f"unauthenticated admin API must not be reachable from other hosts (got {host})"
            )
    tls = None
    if args.tls_cert_file or args.tls_key_file:
        if not (args.tls_cert_file and args.tls_key_file):
            raise ValueError("give both --tls-cert-file and --tls-key-file")
        tls = TlsFiles(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
        server_credentials(tls)  # read and check the files now: exit 2 naming a bad one
    elif args.tls_client_ca_file:
        raise ValueError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    return token, tls


def serve(server: GovernorServer, grace_s: float = SHUTDOWN_GRACE_S) -> int:
    """Run `server` until SIGTERM or SIGINT, then shut down gracefully within `grace_s`
    seconds; returns 0 (the process exit status)."""
    return asyncio.run(_serve(server, grace_s))


async def _serve(server: GovernorServer, grace_s: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # A line for humans and for tests: where we listen (one write: not split by logs).
    admin = f", admin on port {server.admin_port}" if server.admin_port is not None else ""
    sys.stderr.write(
        f"governor: serving gRPC on port {server.port}, metrics on port {server.metrics_port}"
        f"{admin}\n"
    )
    sys.stderr.flush()
    await stop.wait()
    await server.stop(grace_s)
    return 0
