"""The control loop: observe -> decide -> actuate, once per tick, for every model.

`ControlLoop.tick(now_s)` is the whole loop body and takes the time as an argument, so
simulated time (the simulator, tests) and real time run the same code. In real time
the service calls it once per tick from an APScheduler job (service/ticker.py, through
`ServiceCore.tick`); `RealTimeRunner` here does the same for a bare loop. Only
`RealTimeRunner` and `SystemClock` read the clock. Windows are measured on the
monotonic clock, so a wall-clock jump cannot fire a burst of actions.

Thread safety: `tick` runs on one thread at a time (the scheduler job has
max_instances=1, and `ServiceCore.tick` holds a lock); readers (gRPC handlers) get
immutable snapshots swapped in whole under a lock. A caller may read the metrics first
(`observe`, outside its lock) and hand them to `tick`: the tick decides under the models
it holds by then, and observes again only when a model's query changed meanwhile.

Cost (benchmarks/bench_tick.py; 2-core machine, 1,000 models): a tick decodes ~12 MB of
Prometheus answers into ~500,000 short-lived containers. With the cyclic garbage
collector running, each of them that lives through a young collection is promoted and
soon triggers a full collection of the whole heap, again and again within one tick:
measured ~40 % of the tick's CPU. Everything a tick allocates is acyclic and freed by
reference counting, so `tick` pauses the collector while it runs (`pause_gc`, default
on) and restores it after; garbage from other threads meanwhile waits at most one tick.
The structlog logger is resolved once per tick (a lazy proxy from `get_logger` rebuilds
its logger on every call when not cached: ~45 of the ~65 us per log line).
Logging: one `tick` line per tick (info: models, valid, held, changed, panic, paused,
duration_ms), and a model's `decision` line (its inputs, outputs and every stage's
reason) at info only when the decision is news: the model's first, or validity,
replicas, knobs or panic mode changed; unchanged decisions log at debug (`--log-level
debug` shows every model every tick). At 1,000 models a JSON line per model per tick
cost ~80 ms of CPU, more than observing them; `governor explain MODEL` still shows
every recent decision with its full trace. While a tick
runs, other threads (the gRPC server) may take the GIL every 0.5 ms instead of every
5 ms (`switch_interval_s`): measured with a thread that sleeps 1 ms in a loop, its
median wake-up lag during a 1,000-model tick fell from 5.2 to 0.7 ms (long C calls, the
JSON decoding of one answer, still hold the GIL for tens of ms).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from controller.actuation import Actuator, RolloutGate
from controller.config import GovernorConfig, ModelConfig
from controller.decider import Decider
from controller.metrics import GovernorMetrics
from controller.types import Decision, ModelState
from estimators.types import (
    MetricSource,
    ModelQuery,
    NoDataError,
    Observation,
    ObservationResult,
    SourceError,
    sees_demand_at_zero,
)

# The class of structlog's lazy logger proxy (not exported by structlog under a name).
_LAZY_LOGGER = type(structlog.get_logger())


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive into the cyclic collector's permanent
    generation (`gc.freeze`); returns how many are frozen. For a process that has
    finished starting up (`governor run` once it serves): modules, config, restored
    state (~130,000 objects with 1,000 models) are never garbage, yet every full
    collection walked them again. Measured at 1,000 models (benchmarks/bench_tick.py):
    the collector's runs after ten ticks took 398 ms (a young one per tick, ~15 ms, plus
    a middle one of 90 ms and a full one of 165 ms), frozen 100 ms (young ones only).
    Frozen objects are still freed by reference counting; only a reference cycle among
    them would never be collected (start-up makes none that it later drops)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def gc_paused(enabled: bool = True) -> Iterator[None]:
    """Pause the cyclic garbage collector within the block (see the module doc), when
    `enabled` and it is running; restore it after, also when the block raises."""
    if not enabled or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def gil_switch_interval(seconds: float | None) -> Iterator[None]:
    """Within the block, let other threads take the GIL every `seconds` (if shorter than
    the interpreter's current interval, 5 ms by default); restore it after."""
    old = sys.getswitchinterval()
    if seconds is None or seconds >= old:
        yield
        return
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def seen_size(obs: Observation) -> int | None:
    """The fleet's size as an observation shows it (None: not shown): its ready
    replicas, but at least its engine targets up and down. A target down is an engine
    of the fleet (a pod still starting or failing), not one fewer: a controller that
    starts while 2 of 6 engines are down must not take the fleet for 4 and scale it to
    4; a dead fleet (every target down) is its down targets, held as no data."""
    ready, up, down = obs.ready_replicas, obs.targets_up, obs.targets_down
    if ready is None and up is None and down is None:
        return None
    return max(ready or 0, (up or 0) + (down or 0))


class Clock(Protocol):
    """Time source: `monotonic()` for windows, `wall()` (Unix seconds) for reports."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The production clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


TickObservation = ObservationResult | SourceError
"""What a tick has for one model: its observation, why there is none, or the source's
failure (every model of that tick gets it)."""


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """What the loop last saw and decided for one model."""

    config: ModelConfig
    observation: TickObservation | None
    decision: Decision | None
    state: ModelState | None
    paused: bool
    history: tuple[Decision, ...] = ()


@dataclass(frozen=True, slots=True)
class LoopSnapshot:
    """Immutable view of every model after the last tick."""

    at_s: float | None
    wall_s: float | None
    models: Mapping[str, ModelSnapshot] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Observed:
    """Every model's observation, read before the tick that decides on it
    (`ControlLoop.observe`). `at_s`: the tick's time (monotonic seconds); `queries`:
    what was asked, per model; `started`: `time.perf_counter()` when reading began (the
    tick's duration counts from it)."""

    at_s: float
    queries: Mapping[str, ModelQuery]
    results: Mapping[str, TickObservation]
    started: float


def model_query(model: ModelConfig) -> ModelQuery:
    """What a tick asks the source about `model`: its name, SLA thresholds (seconds)
    and namespace."""
    ttft_s, itl_s = model.sla.ttft_p95_ms / 1000.0, model.sla.itl_p95_ms / 1000.0
    return ModelQuery(model.name, ttft_s, itl_s, model.namespace)


def _obs_fields(obs: TickObservation) -> dict[str, Any]:
    if not isinstance(obs, Observation):
        return {"no_data": str(obs)}
    return {
        "arrival_rps": obs.arrival_rate_rps,
        "ingress_rps": obs.ingress_rate_rps,
        "prompt_p95": obs.prompt_tokens_p95,
        "output_p95": obs.output_tokens_p95,
        "itl_p95_ms": obs.itl_p95_ms,
        "ttft_p95_ms": obs.ttft_p95_ms,
        "running": obs.running,
        "waiting": obs.waiting,
        "kv_usage": obs.kv_usage_frac,
        "ready": obs.ready_replicas,
        "staleness_s": obs.staleness_s,
    }


class ControlLoop:
    """Runs ticks over every configured model. Inject source, actuators, clock, metrics."""

    HISTORY = 20  # decisions kept per model for `explain`

    def __init__(
        self,
        config: GovernorConfig,
        source: MetricSource,
        actuators: Sequence[Actuator] = (),
        *,
        clock: Clock | None = None,
        metrics: GovernorMetrics | None = None,
        logger: Any = None,
        initial_replicas: Callable[[ModelConfig], int | None] | None = None,
        states: Mapping[str, ModelState] | None = None,
        pause_gc: bool = True,
        switch_interval_s: float | None = 0.0005,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.source = source
        self.actuators = tuple(actuators)
        # isinstance against a runtime-checkable Protocol walks its attributes: once
        # here, not per model per tick (~8 ms a tick at 1,000 models, benchmarks/bench_tick)
        self._gates = tuple(a for a in self.actuators if isinstance(a, RolloutGate))
        self.metrics = metrics or GovernorMetrics()
        self.log = logger or structlog.get_logger("governor.loop")
        self._initial_replicas = initial_replicas
        self.pause_gc = pause_gc
        self.switch_interval_s = switch_interval_s
        self._lock = threading.Lock()
        self._listeners: list[Callable[[LoopSnapshot], None]] = []
        self._states: dict[str, ModelState] = dict(states or {})
        self._resumed: set[str] = set(self._states)
        """Models whose state was restored and has not been ticked yet (`resumed_state`)."""
        self._paused: set[str] = set()
        self._deciders: dict[str, Decider] = {}
        self._queries: dict[str, ModelQuery] = {}
        self._config = config
        self._snapshot = LoopSnapshot(at_s=None, wall_s=None)
        self._history: dict[str, tuple[Decision, ...]] = {}
        self._apply_config(config)

    # ------------------------------------------------------------------ config
    @property
    def config(self) -> GovernorConfig:
        return self._config

    def _apply_config(self, config: GovernorConfig) -> None:
        deciders = {}
        for m in map(self._as_decided, config.models):
            old = self._deciders.get(m.name)
            policy = config.policy_for(m)
            if old is not None and old.model == m and old.policy == policy:
                deciders[m.name] = old
            else:
                deciders[m.name] = Decider(m, policy)
        for gone in set(self._deciders) - set(deciders):
            self._states.pop(gone, None)
            self._history.pop(gone, None)
            self._paused.discard(gone)
            self.metrics.forget(gone)
        self._deciders = deciders
        # Built once per config, not per tick: a ModelQuery per model per tick was ~1 ms
        # at 1,000 models.
        self._queries = {name: model_query(d.model) for name, d in deciders.items()}
        self._config = config

    def _as_decided(self, m: ModelConfig) -> ModelConfig:
        """`m` as its decider runs it: `min_replicas` 0 is held at 1 where the source
        cannot see demand at zero replicas (`sees_demand_at_zero`: PrometheusSource
        without `prometheus.ingress_rate_query`). Scaled to zero, such a model would
        read as no data for good (no engine left to report a request) and stay at zero;
        a state restored at zero is scaled back up to 1."""
        if m.replicas.min_replicas > 0 or sees_demand_at_zero(self.source):
            return m
        self.log.warning(
            "scale_to_zero_unavailable",
            model=m.name,
            detail="min_replicas 0 held at 1: the metric source sees no demand at zero "
            "replicas; set prometheus.ingress_rate_query (the gateway's request rate)",
        )
        bounds = m.replicas.model_copy(update={"min_replicas": 1})
        return m.model_copy(update={"replicas": bounds})

    def set_config(self, config: GovernorConfig) -> None:
        """Swap in a validated config; applies from the next tick. Models that stay
        keep their state (hysteresis memory); removed models are forgotten."""
        with self._lock:
            self._apply_config(config)

    def pause(self, model: str) -> None:
        """Shadow mode for `model`: decide and log, do not actuate. KeyError if unknown.

        Actuators that queue writes (an optional `forget(model)`, e.g. a scale write
        waiting for its retry, a knob roll-out waiting for the last one) drop what they
        still meant to write for it: nothing reaches a paused model's Deployment."""
        with self._lock:
            if model not in self._deciders:
                raise KeyError(model)
            self._paused.add(model)
        for act in self.actuators:
            forget = getattr(act, "forget", None)
            if callable(forget):
                forget(model)

    def resume(self, model: str) -> None:
        """Leave shadow mode. KeyError if unknown."""
        with self._lock:
            if model not in self._deciders:
                raise KeyError(model)
            self._paused.discard(model)

    def paused(self) -> frozenset[str]:
        return frozenset(self._paused)

    def states(self) -> dict[str, ModelState]:
        """A copy of every model's decider state (for persistence)."""
        with self._lock:
            return dict(self._states)

    def snapshot(self) -> LoopSnapshot:
        """The latest immutable snapshot (safe from any thread)."""
        return self._snapshot

    def add_listener(self, fn: Callable[[LoopSnapshot], None]) -> None:
        """Call `fn(snapshot)` after every tick (e.g. to persist state)."""
        self._listeners.append(fn)

    # ------------------------------------------------------------------ tick
    def observe(self, now_s: float | None = None) -> Observed:
        """Read every model's metrics for a tick at `now_s` (monotonic seconds; default:
        the clock's) without deciding: `tick(observed=...)` decides on them. A caller
        that serialises config edits with its ticks (ServiceCore) reads the metrics
        first, outside its lock, so an edit waits for the decision, not for the queries."""
        started = time.perf_counter()
        now = self.clock.monotonic() if now_s is None else now_s
        with self._lock:
            queries = self._queries
        with gc_paused(self.pause_gc), gil_switch_interval(self.switch_interval_s):
            results = self._observe(list(queries.values()), now)
        return Observed(now, queries, results, started)

    def tick(self, now_s: float | None = None, observed: Observed | None = None) -> list[Decision]:
        """One control tick at `now_s` (monotonic seconds; default: the clock's), or at
        `observed.at_s` on the metrics `observe` read for it. A model whose query changed
        since (an SLA or namespace edit, a model added) has every model observed again."""
        with gc_paused(self.pause_gc), gil_switch_interval(self.switch_interval_s):
            return self._tick(now_s, observed)

    def _tick(self, now_s: float | None, observed: Observed | None) -> list[Decision]:
        started = time.perf_counter() if observed is None else observed.started
        log = self.log.bind() if isinstance(self.log, _LAZY_LOGGER) else self.log
        if observed is not None:
            now = observed.at_s
        elif now_s is None:
            now = self.clock.monotonic()
        else:
            now = now_s
        with self._lock:
            deciders = dict(self._deciders)
            queries = self._queries
            paused = set(self._paused)
        if observed is not None and (
            observed.queries is queries  # the config did not change meanwhile
            or all(observed.queries.get(name) == q for name, q in queries.items())
        ):
            observations = observed.results
        else:
            observations = self._observe([queries[name] for name in deciders], now)

        decisions: list[Decision] = []
        new_states: dict[str, ModelState] = {}
        every_line = _debug_enabled(log)
        changed = 0
        for name, decider in deciders.items():
            obs = observations.get(name) or NoDataError(
                name, "arrival_rate", "model absent from source"
            )
            decision, new_state = self._decide_model(decider, obs, now)
            if new_state is not None:
                new_states[name] = new_state
            decisions.append(decision)
            staleness = obs.staleness_s if isinstance(obs, Observation) else None
            self.metrics.record(decision, staleness, paused=name in paused)
            last = self._history.get(name)
            if _changed(decision, last[-1] if last else None):
                changed += 1
                _log_decision(log.info, decision, obs, paused=name in paused)
            elif every_line:
                _log_decision(log.debug, decision, obs, paused=name in paused)

        self._actuate([d for d in decisions if d.model not in paused])
        _log_tick(log, decisions, changed, len(paused), started)
        self._commit(now, observations, decisions, new_states)
        self.metrics.ticks.inc()
        self.metrics.last_tick.set(self.clock.wall())
        self.metrics.tick_duration.observe(time.perf_counter() - started)
        return decisions

    def _observe(self, queries: list[ModelQuery], now: float) -> dict[str, TickObservation]:
        """Every model's observation; a source that fails gives each model its error."""
        try:
            return dict(self.source.observe(queries, now))
        except SourceError as exc:
            self.metrics.source_errors.labels("source").inc()
            self.log.warning("source_error", error=str(exc))
            return {q.name: exc for q in queries}
        except Exception as exc:  # a bug in a source must not stop the loop
            self.metrics.source_errors.labels("unexpected").inc()
            self.log.error("source_crashed", error=repr(exc))
            err = SourceError(f"source raised {type(exc).__name__}: {exc}")
            return {q.name: err for q in queries}

    def _decide_model(
        self, decider: Decider, obs: TickObservation, now: float
    ) -> tuple[Decision, ModelState | None]:
        """One model's decision and the state to keep (None: keep none, see below)."""
        name = decider.model.name
        if isinstance(obs, NoDataError):
            self.metrics.source_errors.labels("no_data").inc()
        state = self._states.get(name)
        size_unknown = False
        if state is not None and name in self._resumed:
            state = decider.resumed_state(state, now)
        if state is not None and self._rollout_waiting(name):
            state = decider.rollout_waiting(state, now)
        if state is None:
            start = seen_size(obs) if isinstance(obs, Observation) else None
            if start is None and self._initial_replicas is not None:
                start = self._initial_replicas(decider.model)
            size_unknown = start is None
            state = decider.initial_state(start, now)
        try:
            decision, new_state = decider.decide(obs, state, now)
        except Exception as exc:  # one model's bad input must not stop the others
            self.metrics.source_errors.labels("decide").inc()
            self.log.error("decide_failed", model=name, error=repr(exc))
            err = SourceError(f"decide raised {type(exc).__name__}: {exc}")
            decision, new_state = decider.decide(err, state, now)
        if size_unknown and not decision.valid:
            # A state begun without knowing the fleet's size (min replicas assumed)
            # is not kept through a tick without data: the first good observation
            # starts it from the fleet it sees, so a controller that starts before
            # the first scrape cannot shrink a bigger fleet toward min replicas.
            return decision, None
        return decision, new_state

    def _rollout_waiting(self, model: str) -> bool:
        """Whether an actuator holds a roll-out asked for `model` (RolloutGate)."""
        return any(gate.rollout_waiting(model) for gate in self._gates)

    def _actuate(self, decisions: list[Decision]) -> None:
        for act in self.actuators:
            try:
                act.apply(decisions)
            except Exception as exc:  # one actuator's failure must not stop the others
                self.metrics.actuation_errors.labels(type(act).__name__, "exception").inc()
                self.log.error("actuator_failed", actuator=type(act).__name__, error=repr(exc))

    def _commit(
        self,
        now: float,
        observations: Mapping[str, TickObservation],
        decisions: list[Decision],
        new_states: dict[str, ModelState],
    ) -> None:
        """Keep the tick's states and history, publish the snapshot, tell the listeners."""
        with self._lock:
            for name, st in new_states.items():
                if name in self._deciders:
                    self._states[name] = st
                    self._resumed.discard(name)
            for d in decisions:
                if d.model in self._deciders:
                    self._history[d.model] = (
                        *self._history.get(d.model, ())[-(self.HISTORY - 1) :],
                        d,
                    )
            models = {
                name: ModelSnapshot(
                    config=dec.model,
                    observation=observations.get(name),
                    decision=self._history.get(name, (None,))[-1],
                    state=self._states.get(name),
                    paused=name in self._paused,
                    history=self._history.get(name, ()),
                )
                for name, dec in self._deciders.items()
            }
            self._snapshot = LoopSnapshot(at_s=now, wall_s=self.clock.wall(), models=models)
        for fn in self._listeners:
            try:
                fn(self._snapshot)
            except Exception as exc:
                self.log.error("listener_failed", error=repr(exc))


def _debug_enabled(log: Any) -> bool:
    """Whether `log` emits debug lines (structlog's filtering loggers say so; a logger
    that cannot say is taken to emit them)."""
    is_enabled_for = getattr(log, "is_enabled_for", None)
    return True if is_enabled_for is None else bool(is_enabled_for(logging.DEBUG))


def _changed(decision: Decision, last: Decision | None) -> bool:
    """True when `decision` is news for an operator against the model's previous one:
    the first decision, or a change of validity (data lost or back), replicas, knobs or
    panic mode."""
    return last is None or (
        decision.valid != last.valid
        or decision.replicas != last.replicas
        or decision.knobs != last.knobs
        or decision.panic != last.panic
    )


def _log_tick(
    log: Any, decisions: Sequence[Decision], changed: int, paused: int, started: float
) -> None:
    """The tick's one summary line (info): how many models were decided, held (no valid
    decision: no data, or no length statistics yet), changed (each of those also has its
    own `decision` line), in panic mode, paused; the tick's wall time so far (ms)."""
    valid = sum(1 for d in decisions if d.valid)
    log.info(
        "tick",
        models=len(decisions),
        valid=valid,
        held=len(decisions) - valid,
        changed=changed,
        panic=sum(1 for d in decisions if d.panic),
        paused=paused,
        duration_ms=round((time.perf_counter() - started) * 1000.0, 1),
    )


def _log_decision(emit: Any, decision: Decision, obs: TickObservation, *, paused: bool) -> None:
    """One model's structured line: inputs, outputs, every stage's reason. `emit`: the
    logger's `info` (the decision changed, `_changed`) or `debug` (it did not)."""
    emit(
        "decision",
        model=decision.model,
        valid=decision.valid,
        replicas=decision.replicas,
        raw=decision.raw_replicas,
        demand_rps=decision.demand_rps,
        capacity_rps=decision.capacity_rps_per_replica,
        max_num_seqs=decision.knobs.max_num_seqs,
        max_num_batched_tokens=decision.knobs.max_num_batched_tokens,
        knob_reason=decision.knob_reason.value,
        stages=[f"{s.name}:{s.reason.value}" for s in decision.stages],
        paused=paused,
        **_obs_fields(obs),
    )


class RealTimeRunner:
    """Runs `loop.tick()` every `interval_s` on an APScheduler background scheduler:
    one instance at a time, missed runs coalesced into one, misfires logged."""

    def __init__(self, loop: ControlLoop, interval_s: float | None = None) -> None:
        from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
        from apscheduler.schedulers.background import BackgroundScheduler

        self.loop = loop
        self.interval_s = interval_s or loop.config.policy.tick_interval_s
        self.scheduler = BackgroundScheduler(daemon=True)
        self._log = structlog.get_logger("governor.scheduler")

        def _on_event(event: Any) -> None:
            kind = {
                EVENT_JOB_MISSED: "tick_missed",
                EVENT_JOB_MAX_INSTANCES: "tick_overlap_skipped",
                EVENT_JOB_ERROR: "tick_failed",
            }.get(event.code, "tick_event")
            self._log.warning(
                kind,
                scheduled=str(getattr(event, "scheduled_run_time", "")),
                error=repr(getattr(event, "exception", None)),
            )

        self.scheduler.add_listener(
            _on_event, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_ERROR
        )

    def start(self) -> None:
        self.scheduler.add_job(
            self.loop.tick,
            "interval",
            seconds=self.interval_s,
            id="control-tick",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(self.interval_s)),
            replace_existing=True,
        )
        self.scheduler.start()

    def stop(self, wait: bool = True) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=wait)
