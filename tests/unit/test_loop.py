"""The control loop: observe -> decide -> actuate on an injected clock, source, actuators."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import pytest
import structlog
from prometheus_client import CollectorRegistry

from controller.config import GovernorConfig
from controller.decider import Decider
from controller.loop import ControlLoop, RealTimeRunner
from controller.metrics import GovernorMetrics
from controller.types import Decision, KnobMemory, Knobs, Reason
from estimators.types import ModelQuery, NoDataError, Observation, SourceError
from tests.conftest import FakeClock, make_model
from tests.unit.helpers import obs


class FakeSource:
    """Answers from a dict of rates; counts calls. `fail` raises SourceError."""

    def __init__(self, rates: dict[str, float]) -> None:
        self.rates = dict(rates)
        self.calls = 0
        self.fail = False
        self.seen: list[list[str]] = []

    def observe(
        self, models: Sequence[ModelQuery], now_s: float
    ) -> dict[str, Observation | NoDataError]:
        self.calls += 1
        self.seen.append([m.name for m in models])
        if self.fail:
            raise SourceError("connection refused")
        out: dict[str, Observation | NoDataError] = {}
        for m in models:
            if m.name in self.rates:
                out[m.name] = obs(model=m.name, t=now_s, rate=self.rates[m.name])
            else:
                out[m.name] = NoDataError(m.name, "arrival_rate")
        return out


class RecordingActuator:
    def __init__(self) -> None:
        self.batches: list[list[Decision]] = []

    def apply(self, decisions: Sequence[Decision]) -> None:
        self.batches.append(list(decisions))


class BrokenActuator:
    def apply(self, decisions: Sequence[Decision]) -> None:
        raise RuntimeError("kaboom")


class GatingActuator(RecordingActuator):
    """Holds the knob roll-outs of `waiting` models (controller.actuation.RolloutGate)."""

    def __init__(self, waiting: set[str]) -> None:
        super().__init__()
        self.waiting = waiting

    def rollout_waiting(self, model: str) -> bool:
        return model in self.waiting


def _config(*names: str) -> GovernorConfig:
    return GovernorConfig(models=tuple(make_model(n) for n in names))


def _loop(
    source: FakeSource, *names: str, actuators=None, clock=None
) -> tuple[ControlLoop, GovernorMetrics]:
    metrics = GovernorMetrics(CollectorRegistry())
    loop = ControlLoop(
        _config(*names),
        source,
        actuators if actuators is not None else [],
        clock=clock or FakeClock(),
        metrics=metrics,
        initial_replicas=lambda m: 2,
    )
    return loop, metrics


def test_tick_observes_once_decides_every_model_and_actuates(clock: FakeClock) -> None:
    src = FakeSource({"a": 40.0, "b": 100.0})
    act = RecordingActuator()
    loop, metrics = _loop(src, "a", "b", actuators=[act], clock=clock)
    decisions = loop.tick(clock.now)
    assert src.calls == 1 and src.seen[0] == ["a", "b"]
    assert {d.model for d in decisions} == {"a", "b"}
    assert [d.model for d in act.batches[0]] == ["a", "b"]
    b = next(d for d in decisions if d.model == "b")
    assert (
        metrics.registry.get_sample_value("governor_desired_replicas", {"model": "b"}) == b.replicas
    )
    assert metrics.registry.get_sample_value("governor_ticks_total") == 1.0
    snap = loop.snapshot()
    assert snap.at_s == clock.now and snap.models["b"].decision == b


def test_tick_uses_clock_when_no_time_given(clock: FakeClock) -> None:
    loop, _ = _loop(FakeSource({"a": 40.0}), "a", clock=clock)
    clock.advance(42.0)
    (d,) = loop.tick()
    assert d.at_s == clock.now


def test_source_error_holds_every_model_and_counts(clock: FakeClock) -> None:
    src = FakeSource({"a": 40.0})
    act = RecordingActuator()
    loop, metrics = _loop(src, "a", actuators=[act], clock=clock)
    first = loop.tick(clock.now)[0]
    src.fail = True
    held = loop.tick(clock.advance(5))[0]
    assert not held.valid and held.reasons == (Reason.NO_DATA_HOLD,)
    assert held.replicas == first.replicas
    assert (
        metrics.registry.get_sample_value("governor_source_errors_total", {"kind": "source"}) == 1.0
    )
    assert metrics.registry.get_sample_value("governor_model_stale", {"model": "a"}) == 1.0


def test_model_missing_from_source_is_no_data_not_zero(clock: FakeClock) -> None:
    src = FakeSource({"a": 40.0})
    loop, _ = _loop(src, "a", "ghost", clock=clock)
    ds = {d.model: d for d in loop.tick(clock.now)}
    assert not ds["ghost"].valid and ds["ghost"].replicas == 2
    assert ds["a"].valid


def test_paused_model_is_decided_but_not_actuated(clock: FakeClock) -> None:
    act = RecordingActuator()
    loop, metrics = _loop(
        FakeSource({"a": 40.0, "b": 40.0}), "a", "b", actuators=[act], clock=clock
    )
    paused = metrics.registry.get_sample_value
    loop.pause("a")
    ds = loop.tick(clock.now)
    assert {d.model for d in ds} == {"a", "b"}
    assert [d.model for d in act.batches[0]] == ["b"]
    assert loop.snapshot().models["a"].paused
    # Exported, so the chart's actuation-gap alert leaves a paused model out.
    assert paused("governor_model_paused", {"model": "a"}) == 1.0
    assert paused("governor_model_paused", {"model": "b"}) == 0.0
    loop.resume("a")
    loop.tick(clock.advance(5))
    assert [d.model for d in act.batches[1]] == ["a", "b"]
    assert paused("governor_model_paused", {"model": "a"}) == 0.0
    with pytest.raises(KeyError):
        loop.pause("nope")


def test_broken_actuator_does_not_stop_others(clock: FakeClock) -> None:
    good = RecordingActuator()
    loop, metrics = _loop(
        FakeSource({"a": 40.0}), "a", actuators=[BrokenActuator(), good], clock=clock
    )
    loop.tick(clock.now)
    assert len(good.batches) == 1
    assert (
        metrics.registry.get_sample_value(
            "governor_actuation_errors_total", {"actuator": "BrokenActuator", "reason": "exception"}
        )
        == 1.0
    )


def test_set_config_keeps_state_of_remaining_models(clock: FakeClock) -> None:
    loop, metrics = _loop(FakeSource({"a": 100.0, "b": 40.0}), "a", "b", clock=clock)
    loop.tick(clock.now)
    st_a = loop.states()["a"]
    loop.set_config(_config("a", "c"))
    assert set(loop.states()) == {"a"}
    assert loop.states()["a"] == st_a
    ds = {d.model for d in loop.tick(clock.advance(5))}
    assert ds == {"a", "c"}
    assert metrics.registry.get_sample_value("governor_desired_replicas", {"model": "b"}) is None


def test_a_tick_decides_on_metrics_read_before_it_and_reads_again_when_a_query_changed(
    clock: FakeClock,
) -> None:
    """`observe` then `tick(observed=...)`: the tick reuses the reading when every
    model's query is the same (a model removed meanwhile is dropped), and reads every
    model again when a model was added or its SLA changed while it was being read."""
    src = FakeSource({"a": 100.0, "b": 40.0, "c": 10.0})
    loop, _ = _loop(src, "a", "b", clock=clock)
    observed = loop.observe(clock.now)
    loop.set_config(_config("a"))
    (d,) = loop.tick(observed=observed)
    assert src.calls == 1 and d.model == "a" and d.at_s == clock.now

    observed = loop.observe(clock.advance(5))
    loop.set_config(_config("a", "c"))
    assert {d.model for d in loop.tick(observed=observed)} == {"a", "c"}
    assert src.calls == 3 and src.seen[-1] == ["a", "c"]

    observed = loop.observe(clock.advance(5))
    sla = make_model("a").sla.model_copy(update={"itl_p95_ms": 80.0})
    loop.set_config(GovernorConfig(models=(make_model("a").model_copy(update={"sla": sla}),)))
    loop.tick(observed=observed)
    assert src.calls == 5


def test_first_decision_of_each_model_is_logged_in_full(clock: FakeClock) -> None:
    loop, _ = _loop(FakeSource({"a": 40.0, "b": 80.0}), "a", "b", clock=clock)
    loop.log = structlog.get_logger("test")
    with structlog.testing.capture_logs() as logs:
        loop.tick(clock.now)
    lines = [entry for entry in logs if entry["event"] == "decision"]
    assert [entry["model"] for entry in lines] == ["a", "b"]
    for entry in lines:
        assert entry["log_level"] == "info"
        assert entry["stages"][0].startswith("raw:") and "clamp:" in entry["stages"][-1]
        for key in (
            "arrival_rps",
            "itl_p95_ms",
            "replicas",
            "max_num_seqs",
            "max_num_batched_tokens",
        ):
            assert key in entry
    (tick,) = [entry for entry in logs if entry["event"] == "tick"]
    assert (tick["models"], tick["valid"], tick["held"], tick["changed"]) == (2, 2, 0, 2)


def _info_logger() -> tuple[object, list[tuple[str, dict]]]:
    """A structlog logger filtering at info (as `governor run --log-level info`) whose
    lines are kept as (event, fields)."""
    lines: list[tuple[str, dict]] = []

    def keep(_logger: object, _method: str, event: dict) -> str:
        lines.append((event.pop("event"), event))
        return ""

    log = structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=[keep],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )
    return log, lines


def test_decision_lines_only_when_the_decision_changes(clock: FakeClock) -> None:
    src = FakeSource({"a": 40.0, "b": 40.0, "c": 40.0})
    loop, _ = _loop(src, "a", "b", "c", clock=clock)
    loop.log, lines = _info_logger()
    loop.tick(clock.now)
    assert [f["model"] for e, f in lines if e == "decision"] == ["a", "b", "c"]
    for _ in range(3):  # same input: the decisions settle, nothing is news
        loop.tick(clock.advance(5))
    lines.clear()
    before = {m: s.decision for m, s in loop.snapshot().models.items()}
    src.rates["b"] = 400.0  # b's demand jumps: b scales, a and c stay
    loop.tick(clock.advance(5))
    after = {m: s.decision for m, s in loop.snapshot().models.items()}
    assert after["b"].replicas != before["b"].replicas  # type: ignore[union-attr]
    assert [f["model"] for e, f in lines if e == "decision"] == ["b"]
    assert [e for e, _ in lines].count("tick") == 1
    tick = next(f for e, f in lines if e == "tick")
    assert (tick["models"], tick["changed"], tick["held"]) == (3, 1, 0)
    src.fail = True  # data lost: every model's hold is news once, then only the tick line
    lines.clear()
    loop.tick(clock.advance(5))
    assert sorted(f["model"] for e, f in lines if e == "decision") == ["a", "b", "c"]
    lines.clear()
    loop.tick(clock.advance(5))
    assert [e for e, _ in lines if e != "source_error"] == ["tick"]
    assert next(f for e, f in lines if e == "tick")["held"] == 3


def test_debug_level_logs_every_model_every_tick(clock: FakeClock) -> None:
    loop, _ = _loop(FakeSource({"a": 40.0, "b": 40.0}), "a", "b", clock=clock)
    loop.log = structlog.get_logger("test")  # not filtered: debug lines are emitted
    loop.tick(clock.now)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            loop.tick(clock.advance(5))
    lines = [entry for entry in logs if entry["event"] == "decision"]
    assert len(lines) == 6
    assert any(entry["log_level"] == "debug" for entry in lines)


def test_listener_gets_snapshot_and_failures_are_contained(clock: FakeClock) -> None:
    loop, _ = _loop(FakeSource({"a": 40.0}), "a", clock=clock)
    seen = []
    loop.add_listener(lambda s: seen.append(s.at_s))
    loop.add_listener(lambda s: 1 / 0)
    loop.tick(clock.now)
    assert seen == [clock.now]


def test_history_is_bounded(clock: FakeClock) -> None:
    loop, _ = _loop(FakeSource({"a": 40.0}), "a", clock=clock)
    for _ in range(ControlLoop.HISTORY + 7):
        loop.tick(clock.advance(5))
    assert len(loop.snapshot().models["a"].history) == ControlLoop.HISTORY


def test_realtime_runner_schedules_one_coalesced_instance(clock: FakeClock) -> None:
    loop, _ = _loop(FakeSource({"a": 40.0}), "a", clock=clock)
    runner = RealTimeRunner(loop, interval_s=3600)
    runner.start()
    try:
        (job,) = runner.scheduler.get_jobs()
        assert job.max_instances == 1 and job.coalesce is True
        assert job.trigger.interval.total_seconds() == 3600
    finally:
        runner.stop()
    assert not runner.scheduler.running


def test_freeze_startup_heap_keeps_what_lives_out_of_collections() -> None:
    """What lives at the freeze is out of the collector's walks (`gc.get_objects`); what
    is made after is in them, and frozen objects are still freed by reference counting."""
    import gc
    import weakref

    from controller.loop import freeze_startup_heap

    class Box:
        pass

    before = Box()
    ref = weakref.ref(before)
    try:
        assert freeze_startup_heap() >= 1
        after = Box()
        tracked = {id(o) for o in gc.get_objects()}
        assert id(before) not in tracked and id(after) in tracked
        del before
        assert ref() is None  # freed without a collection
    finally:
        gc.unfreeze()


class _FixedSource:
    """Answers every model with `make(name, now_s)`."""

    def __init__(self, make: object) -> None:
        self.make = make

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, object]:
        return {m.name: self.make(m.name, now_s) for m in models}  # type: ignore[operator]


def _first_decisions(make: object, ticks: int = 3, **model_kw: object) -> list[Decision]:
    """The decisions of a loop started without saved state on `make`'s observations."""
    act, clock = RecordingActuator(), FakeClock()
    loop = ControlLoop(
        GovernorConfig(models=(make_model("m", **model_kw),)),
        _FixedSource(make),  # type: ignore[arg-type]
        [act],
        clock=clock,
        metrics=GovernorMetrics(CollectorRegistry()),
    )
    for _ in range(ticks):
        loop.tick()
        clock.advance(5.0)
    return [d for batch in act.batches for d in batch]


def test_a_start_with_engines_down_counts_them_in_the_fleet() -> None:
    """Started (no saved state) while 2 of 6 engines are down: the fleet is 6, not the
    4 ready ones; the targets down hold it (never a scale-down to 4)."""
    decisions = _first_decisions(
        lambda n, t: obs(model=n, t=t, rate=40.0, ready_replicas=4, targets_up=4, targets_down=2)
    )
    assert decisions and all(d.replicas >= 6 for d in decisions), [
        (d.replicas, d.stages[-1].reason) for d in decisions
    ]


def test_a_start_on_a_dead_fleet_is_held_not_scaled_from_zero() -> None:
    """Started while every engine of a 6-replica fleet is down, with an ingress rate
    (min replicas 0): a dead fleet of 6, held as no data; not a fleet at zero that an
    ingress of 20 req/s scales to 1 (nor one an ingress of 0 leaves at 0)."""
    from estimators.answers import ingress_observation

    for ingress in (20.0, 0.0):
        decisions = _first_decisions(
            lambda n, t, i=ingress: ingress_observation(n, t, i, 6), min_replicas=0
        )
        assert decisions and all(not d.valid and d.replicas == 6 for d in decisions), [
            (d.valid, d.replicas, d.stages[-1].reason) for d in decisions
        ]


def test_a_start_never_seeds_past_max_replicas() -> None:
    """A ready count from a bad gauge (10**6) seeds the state at max replicas: the first
    decision is within bounds and the capacity model never sees the absurd size (at
    10**6 one decide took 2.7 s; at round(1e308) the queueing model never returned)."""
    from controller.decider import Decider
    from tests.conftest import make_policy

    decider = Decider(make_model("m", max_replicas=20), make_policy())
    assert decider.initial_state(10**6, 0.0).replicas == 20
    assert decider.initial_state(7, 0.0).replicas == 7
    decisions = _first_decisions(
        lambda n, t: obs(model=n, t=t, rate=40.0, ready_replicas=10**6), ticks=1, max_replicas=20
    )
    assert [d.replicas for d in decisions] == [20]


def test_a_restored_state_keeps_its_fleet_through_the_stabilization_window() -> None:
    """A state saved at 6 replicas and restored after the process was down longer than
    the 300 s scale-down window (its remembered recommendations all expired): the first
    ticks at no load hold 6, as a fresh start seeded with 6 does, and the fleet steps
    down only once the window has passed (before: IDLE to min replicas at the first
    tick, the rate limit allowing 100 % per 15 s)."""
    from controller.decider import Decider

    config = GovernorConfig(models=(make_model("m", max_replicas=20),))
    decider = Decider(config.models[0], config.policy_for(config.models[0]))
    saved = decider.initial_state(6, now_s=-10_000.0)  # its window long expired
    act, clock = RecordingActuator(), FakeClock()
    loop = ControlLoop(
        config,
        _FixedSource(lambda n, t: obs(model=n, t=t, rate=0.0, running=0.0, ready_replicas=6)),  # type: ignore[arg-type]
        [act],
        clock=clock,
        metrics=GovernorMetrics(CollectorRegistry()),
        states={"m": saved},
    )
    window_s = config.policy.scale_down_stabilization_s
    for _ in range(int(window_s // 5.0) + 8):
        loop.tick()
        clock.advance(5.0)
    replicas = [(d.at_s - act.batches[0][0].at_s, d.replicas) for b in act.batches for d in b]
    assert all(r == 6 for t, r in replicas if t < window_s), replicas
    assert replicas[-1][1] < 6, replicas  # the window passed: the idle fleet steps down


def test_a_held_fleet_still_obeys_a_lowered_max_replicas() -> None:
    """Part of the fleet unseen (an engine target down) holds the current size against a
    scale-down, but never above max_replicas: an operator who lowered it from 10 to 5
    gets 5 (the hold lifted it back to 8 before), as the no-data fallback clamps."""
    from controller.decider import Decider
    from tests.conftest import make_policy

    decider = Decider(make_model("m", max_replicas=5), make_policy())
    state = replace(decider.initial_state(5, now_s=0.0), replicas=8)  # decided under max 10
    down = obs(model="m", t=5.0, rate=20.0, ready_replicas=7, targets_up=7, targets_down=1)
    decision, _ = decider.decide(down, state, 5.0)
    assert decision.replicas == 5, [(s.name, s.reason, s.value) for s in decision.stages]


def test_the_decider_hears_of_a_rollout_an_actuator_holds(clock: FakeClock) -> None:
    """Both models asked for a roll-out long ago (the clock of their old knobs ran out);
    the actuator still holds a's, so a's replicas keep counting the old knobs, b's not."""
    config = _config("a", "b")
    old = KnobMemory(running=Knobs(16, 512), running_replicas=2, running_until_s=clock.now - 1)
    states = {
        m.name: replace(
            Decider(m, config.policy).initial_state(2), knobs=Knobs(160, 2560), knob_memory=old
        )
        for m in config.models
    }
    loop = ControlLoop(
        config,
        FakeSource({"a": 40.0, "b": 40.0}),
        [GatingActuator({"a"})],
        clock=clock,
        metrics=GovernorMetrics(CollectorRegistry()),
        states=states,
    )
    loop.tick(clock.now)
    after = loop.states()
    assert after["a"].knob_memory.running == Knobs(16, 512)
    assert after["b"].knob_memory.running is None
