"""The service core: targets, control loop, decision board, persistence, leadership.

`ServiceCore` (threads, no asyncio) owns the target set (validated, persisted through a
`service.store.Store`), the `ControlLoop`, the `DecisionBoard` that engines and KEDA
read, the leader `Elector`, and one `tick()` per interval: poll stored targets (apply
valid changes, refuse invalid ones, keeping the last valid set) -> if leader: loop tick
(actuate) and save state; else: mirror the leader's published state into the board.
Admin operations (`set_target`, ...) validate first and change nothing when anything is
wrong (`AdminError` with a gRPC status code).

Restart safety: state is saved after every tick with monotonic times converted to wall
time (service.store.to_wall) and restored at start; the tick's values are served only
after that save (`DecisionBoard.hold`), so a restart does not serve an older generation
than engines saw (unless the save failed: served anyway, a store outage must not freeze
scaling), and the stabilization windows continue across a restart and a restart never
causes a scale-down burst. Only the leader saves, asked again right before each write:
a tick that lost the leadership while it ran does not write over the new leader's state.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from actuators.publisher import ORIGIN_LEADER, DecisionBoard, LatencyDistribution
from controller.actuation import Actuator
from controller.config import ConfigError, GovernorConfig, ModelConfig
from controller.loop import Clock, ControlLoop, SystemClock
from controller.metrics import GovernorMetrics
from controller.targets import (
    TargetError,
    TargetsDoc,
    build_config,
    config_to_targets,
    profile_problem,
    validate_target,
)
from controller.types import Decision
from estimators.types import MetricSource, Observation
from service.engines_seen import EngineTracker
from service.errors import AdminError
from service.leader import AlwaysLeader, Elector
from service.leadership import saved_states, stand_down, takeover_states, wire_write_checks
from service.promclock import install_skew_gauge
from service.publications import (
    BoundsProblem,
    latency_doc,
    published_entries,
    slots,
    within_bounds,
)
from service.store import (
    ConflictError,
    FileStore,
    MemoryStore,
    Store,
    StoreError,
    TargetsInvalidError,
    published_doc,
    to_wall,
)
from service.views import ModelStatusView, StatusView, actuation_texts

MAX_MODELS = 2000  # models a target set may hold after an admin addition


@dataclass
class _Counters:
    ticks: int = 0
    targets_refused: int = 0
    state_save_failures: int = 0


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
        # A tick decides under one target set: an admin edit waits for the decision in
        # flight (lock order: tick, then targets), else a tick that decided under the old
        # target could publish after the edit (seen on a real engine as 4 -> 32 -> 4).
        self._tick_lock = threading.RLock()
        self._engines = EngineTracker(self.clock.monotonic)  # for status (engines_seen)
        self.counters = _Counters()
        self._install_metrics()
        for act in self.extra_actuators:
            self._wire_error_hook(act)
        # each API call of an actuator asks the elector first, not only the next tick
        wire_write_checks((*self.extra_actuators, self.store), self.elector.is_leader)
        self.config: GovernorConfig = base_config
        self.targets: TargetsDoc = config_to_targets(base_config)
        self.targets_revision = ""
        self.targets_problem = ""
        self._refused_revision: str | None = None
        self._refused_leader_values: dict[str, BoundsProblem] = {}  # _follow: logged once each
        self._was_leader = True
        self._seed_pending = False  # nothing stored: `seed_targets` writes the config's
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
            "Watch streams (engines + KEDA) refused at the --max-watch-streams limit or "
            "a client's --max-watch-streams-per-client",
            registry=r,
        )
        self.m_watch_streams = Gauge(
            "governor_watch_streams", "Open watch streams (engines + KEDA)", registry=r
        )
        self.m_serving_restarts = Counter(
            "governor_serving_restarts",
            "Serving processes (the engines', KEDA's and admin listeners) restarted, by "
            "reason: exited, or unresponsive (heartbeats unanswered: killed)",
            ["reason"],
            registry=r,
        )
        for reason in ("exited", "unresponsive"):
            self.m_serving_restarts.labels(reason)
        self.m_serving_up = Gauge(
            "governor_serving_up",
            "1 while the engines' and KEDA's listeners serve (the serving process listens "
            "and answers its heartbeats; inline: always), else 0",
            registry=r,
        )
        self.m_tick_lateness = Histogram(
            "governor_tick_lateness_seconds",
            "How long after its scheduled time each tick started (the ticker's monotonic "
            "schedule; 0 = on time)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.m_clock_skew = install_skew_gauge(r, self.source)  # service.promclock

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
        """wall - monotonic, seconds (see service.store.to_wall)."""
        return self.clock.wall() - self.clock.monotonic()

    def _restore(self) -> ControlLoop:
        """Load targets and state from the store and build the loop."""
        state_doc = self.store.load_state()  # StoreError propagates: refuse to start
        cfg, doc, revision = self.base, config_to_targets(self.base), ""
        try:
            stored = self.store.load_targets()
        except TargetsInvalidError as exc:
            if isinstance(self.store, FileStore):
                raise  # a local file: refuse to start (nothing else could fix it)
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
            self._seed_pending = True  # nothing stored yet: seeded once the service runs
        self.config, self.targets, self.targets_revision = cfg, doc, revision
        self.board.configure(slots(cfg))
        states = saved_states(
            state_doc, self.clock, cfg, self.log, strict=True, where=self.store.description
        )
        if state_doc is not None:
            saved = within_bounds(state_doc.published, cfg, self.log)
            self.board.restore(published_entries(saved))
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

    def seed_targets(self) -> None:
        """Seed an empty store with the config file's models, once. Called when the
        service runs (GovernorServer.start, right after its listeners bound) and by the
        first tick, not at construction: a start that fails (a port taken, a listen
        address not on this host) leaves the store as it was, so the corrected config of
        the next start is the one seeded."""
        with self._targets_lock:
            if not self._seed_pending:
                return
            self._seed_pending = False
            try:
                self.targets_revision = self.store.save_targets(self.targets, "")
            except ConflictError:
                pass  # someone else seeded it (or an admin wrote first): the poll reads it
            except StoreError as exc:
                self.m_store_errors.labels("save_targets").inc()
                self.log.error("targets_seed_failed", error=str(exc))

    # ------------------------------------------------------------------ tick
    def tick(self, now_s: float | None = None) -> list[Decision]:
        """One service tick at `now_s` (monotonic seconds; default the clock's). The
        metrics are read before the tick lock is taken (a leader's): an admin edit waits
        for the decision, not for a slow Prometheus (a CI run's SetTarget once waited
        past its 10 s deadline); the loop decides under the targets it holds by then."""
        observed = self.loop.observe(now_s) if self.elector.is_leader() else None
        with self._tick_lock:
            self.seed_targets()
            self.poll_targets()
            leader = self.elector.is_leader()
            self.m_leader.set(1 if leader else 0)
            if leader and not self._was_leader:
                self._take_over()
            if self._was_leader and not leader:
                stand_down(self.extra_actuators, self.log)
                self.board.commit(discard=True)  # never saved: the leader's values follow
            self._was_leader = leader
            self.counters.ticks += 1
            if not leader:
                self._follow()
                return []
            # Served once saved (a restart never serves an older generation); a failed
            # save or a raising tick is served anyway (no freeze on a store outage); a
            # tick that lost the leadership stays held, discarded by the next tick.
            self.board.hold()
            saved = False
            try:
                with self.board.batch():  # one change for the serving process's feed
                    decisions = self.loop.tick(now_s, observed)
                    self._publish_latency()
                saved = self._save_state()
            finally:
                if saved or self.elector.is_leader():
                    self.board.commit()
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
        states = takeover_states(self.store, self.clock, self.config, self.log)
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
        decisions whichever instance they reach), each within this instance's model
        bounds: a value outside them (an edited state document, a leader on other
        targets) is refused with a warning and the model keeps what it served."""
        try:
            doc = self.store.load_state()
        except StoreError as exc:
            self.m_store_errors.labels("load_state").inc()
            self.log.warning("follow_failed", error=str(exc))
            return
        if doc is None:
            return
        kept = within_bounds(
            doc.published,
            self.config,
            self.log,
            event="leader_publication_refused",
            refused=self._refused_leader_values,
        )
        self.board.restore(published_entries(kept), origin=ORIGIN_LEADER)

    def _state_doc(self) -> Any:
        from service.store import StateDoc

        offset = self._offset()
        published = {
            name: published_doc(
                p.knobs,
                generation=p.generation,
                replicas=p.replicas,
                reason=p.reason[:64],
                decided_at_unix_s=p.decided_at_unix_s,
                latency=latency_doc(p.latency),
            )
            for name, p in self.board.pending().items()
        }
        return StateDoc(
            saved_at_unix_s=self.clock.wall(),
            leader=self.elector.identity,
            models={name: to_wall(st, offset) for name, st in self.loop.states().items()},
            published=published,
            targets=self.targets,
            targets_revision=self.targets_revision,
        )

    def _save_state(self) -> bool:
        """Save the state, if this instance still leads: asked right before the write, as
        a tick or flush may lose the leadership while it runs (the lease lapsed, or
        `close()` released it) and must not write over the new leader's state. True
        when the state was saved."""
        doc = self._state_doc()
        if not self.elector.is_leader():
            self.log.warning("state_save_skipped", why="not the leader any more")
            return False
        try:
            self.store.save_state(doc)
        except StoreError as exc:
            self.counters.state_save_failures += 1
            self.m_store_errors.labels("save_state").inc()
            self.log.error("state_save_failed", error=str(exc))
            return False
        return True

    def flush(self) -> None:
        """Save the state now (graceful shutdown), if this instance is the leader (asked
        again right before the write, `_save_state`)."""
        with self._tick_lock:
            if self.elector.is_leader() and self.counters.ticks > 0:
                self._save_state()
                self.board.commit()

    def close(self) -> None:
        """Stop the actuators first: each stands down and is closed (its worker waited
        for, bounded by its own close), so no write of ours starts once another instance
        can lead; then release leadership and stop the store's watch."""
        for act in self.extra_actuators:
            self._quietly(act, "stand_down")
            self._quietly(act, "close")
        self.elector.stop(release=True)
        self._quietly(self.store, "close")

    def _quietly(self, obj: Any, method: str) -> None:
        """Call `obj.method()` if it has one; a failure is logged, never raised."""
        fn = getattr(obj, method, None)
        if callable(fn):
            try:
                fn()
            except Exception as exc:
                self.log.error("close_failed", step=method, error=repr(exc))

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
        """Apply the stored targets if they changed and are valid (see module doc). Read
        through `Store.watched_targets`: the ConfigMap store answers from its watch, so
        a tick makes no API call for the targets."""
        with self._targets_lock:
            try:
                stored = self.store.watched_targets()
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
        self.board.configure(slots(cfg))
        self._engines.retain(m.name for m in cfg.models)
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
        with self._tick_lock, self._targets_lock:
            for _ in range(5):
                try:
                    stored = self.store.load_targets()
                except TargetsInvalidError as exc:
                    # Stored set is broken: build on the last valid one, replacing it.
                    stored, stored_doc, stored_rev = None, self.targets, exc.revision
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
                if stored is not None and doc == stored.doc:
                    # Nothing changed (a pause of a paused model, a target set as it is):
                    # no write, so the revision another operator read still holds.
                    self._apply(cfg, doc, stored_rev)
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
        try:
            model = validate_target(data)
        except TargetError as exc:
            raise AdminError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        configured = [m.profile for m in (*self.base.models, *self.config.models)]
        problem = profile_problem(model, allow_paths=False, configured=configured)
        if problem is not None:
            raise AdminError(grpc.StatusCode.INVALID_ARGUMENT, problem)

        def change(doc: TargetsDoc) -> TargetsDoc:
            models = list(doc.models)
            for i, m in enumerate(models):
                if m.name == model.name:
                    models[i] = model
                    break
            else:
                if len(models) >= self.max_models:
                    raise AdminError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"the target set holds {len(models)} models, the limit "
                        f"(--max-models {self.max_models}); delete one first",
                    )
                models.append(model)
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
        with self._tick_lock, self._targets_lock:
            self._require(name)
            if len(self.config.models) == 1:
                raise AdminError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"model {name!r} is the last one; a config holds at least one model",
                )

            def change(doc: TargetsDoc) -> TargetsDoc:
                models = tuple(m for m in doc.models if m.name != name)
                if not models:  # the stored set changed since this instance applied it
                    raise AdminError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"model {name!r} is the last one in the stored targets (they "
                        "changed since this instance applied them); a config holds at "
                        "least one model",
                    )
                return TargetsDoc(models=models, paused=tuple(p for p in doc.paused if p != name))

            return self._update_targets(change, expected_revision)[1]

    def set_paused(self, name: str, paused: bool) -> bool:
        """Shadow mode on (`paused`) or off for `name`; persisted with the targets."""
        with self._tick_lock, self._targets_lock:
            self._require(name)

            def change(doc: TargetsDoc) -> TargetsDoc:
                if (name in doc.paused) == paused:
                    return doc  # already so: nothing to write (`_update_targets`)
                rest = tuple(p for p in doc.paused if p != name)
                return TargetsDoc(models=doc.models, paused=(*rest, name) if paused else rest)

            self._update_targets(change, None)
            return paused

    # ------------------------------------------------------------------ reads
    def deployments(self) -> dict[str, tuple[str, str]]:
        """model -> (namespace, deployment), for the Kubernetes actuator."""
        return {m.name: (m.namespace, m.deployment) for m in self.config.models}

    def record_engine(self, model: str, engine_id: str) -> None:
        """An engine asked for `model`'s knobs (service.engines_seen)."""
        self._engines.record(model, engine_id)

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
        actuation = actuation_texts(self.extra_actuators)
        models = []
        for m in self.config.models:
            if wanted and m.name not in wanted:
                continue
            ms = snap.models.get(m.name)
            try:
                published = self.board.get(m.name)
            except KeyError:
                continue
            engines = self._engines.count(m.name)
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
