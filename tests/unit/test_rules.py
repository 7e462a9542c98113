"""Composite scale-out rules (controller.rules): config validation, timers at their
boundaries, floors that never lower replicas, and the source design's example rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from controller.config import ModelConfig, load_config
from controller.decider import Decider
from controller.rules import SIGNALS, ScaleOutRule, evaluate, rules_stage, signal_value
from controller.types import Reason
from estimators.types import LatencyQuantiles, NoDataError, Observation
from tests.conftest import make_policy
from tests.unit import helpers

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rules.yaml"
T0 = 1000.0

SOURCE_RULE: dict[str, Any] = {
    "name": "slow-decode-cold-cache",
    "join": "all",
    "conditions": [
        {"signal": "decode_time_p95_ms", "op": ">", "threshold": 900, "for_s": 120},
        {"signal": "kv_cache_miss_frac", "op": ">", "threshold": 0.35, "for_s": 120},
    ],
    "action": {"add_replicas": 1},
}


def _obs(decode_ms: float | None = 950.0, hit: float | None = 0.5, **kw: Any) -> Observation:
    return Observation(
        model="m",
        observed_at_s=0.0,
        arrival_rate_rps=5.0,
        decode_time_p95_ms=decode_ms,
        prefix_cache_hit_frac=hit,
        **kw,
    )


def _rule(**over: Any) -> ScaleOutRule:
    return ScaleOutRule.model_validate(SOURCE_RULE | over)


def _model(rules: list[dict[str, Any]]) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "m",
            "deployment": "m",
            "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50},
            "scale_out_rules": rules,
        }
    )


def _run(rule: ScaleOutRule, samples: list[tuple[float, Observation | None]], current: int = 4):
    """Evaluate at each (seconds after T0, observation); returns every outcome."""
    states: tuple[Any, ...] = ()
    outs = []
    for dt, o in samples:
        out = evaluate([rule], states, o, current, T0 + dt)
        states = out.states
        outs.append(out)
    return outs


def test_fires_at_120_s_not_at_119_s() -> None:
    rule = _rule()
    ticks = [(float(t), _obs()) for t in (0, 60, 119)]
    assert [o.fired for o in _run(rule, ticks)] == [(), (), ()]
    ticks.append((120.0, _obs()))
    last = _run(rule, ticks)[-1]
    assert last.fired == ("slow-decode-cold-cache",) and last.floor == 5  # 4 current + 1


def test_kv_miss_threshold_35_1_fires_34_9_does_not() -> None:
    # miss = 1 - hit: 35.1 % misses is a hit rate of 64.9 %
    fires = _run(_rule(), [(0.0, _obs(hit=0.649)), (120.0, _obs(hit=0.649))])[-1]
    quiet = _run(_rule(), [(0.0, _obs(hit=0.651)), (120.0, _obs(hit=0.651))])[-1]
    assert fires.fired and fires.floor == 5
    assert not quiet.fired and quiet.floor is None
    assert "kv_cache_miss_frac=0.349 > 0.35 not held" in quiet.detail


def test_both_conditions_must_hold_the_whole_period() -> None:
    # the cache condition drops out for one tick at 60 s: its timer restarts there
    ticks = [(0.0, _obs()), (60.0, _obs(hit=0.9)), (65.0, _obs()), (120.0, _obs())]
    assert not _run(_rule(), ticks)[-1].fired
    ticks.append((185.0, _obs()))
    assert _run(_rule(), ticks)[-1].fired  # 65 + 120


def test_missing_data_restarts_the_timer_never_fires() -> None:
    ticks = [(0.0, _obs()), (60.0, _obs(decode_ms=None)), (120.0, _obs())]
    out = _run(_rule(), ticks)
    assert not out[-1].fired
    assert "decode_time_p95_ms=no data" in out[1].detail
    assert not _run(_rule(), [(0.0, _obs()), (60.0, None), (120.0, _obs())])[-1].fired


def test_any_join_and_min_replicas_action() -> None:
    rule = _rule(join="any", action={"min_replicas": 8})
    out = _run(rule, [(0.0, _obs(hit=0.9)), (120.0, _obs(hit=0.9))])[-1]
    assert out.fired and out.floor == 8


def test_floor_holds_while_conditions_hold_then_releases_and_refires_per_period() -> None:
    ticks = [(0.0, _obs()), (120.0, _obs()), (125.0, _obs())]
    out = _run(_rule(), ticks, current=4)
    assert out[1].floor == 5 and out[2].floor == 5 and not out[2].fired  # no compounding
    out = _run(_rule(), [*ticks, (240.0, _obs())], current=5)
    assert out[-1].fired and out[-1].floor == 6  # still slow a period later: one more
    released = _run(_rule(), [*ticks, (130.0, _obs(decode_ms=800.0))])[-1]
    assert released.floor is None


def test_stage_never_lowers_and_respects_max_replicas() -> None:
    rule = _rule()
    _, states = rules_stage([rule], (), _obs(), 3, 4, 10, T0)
    stage, _ = rules_stage([rule], states, _obs(), 3, 4, 10, T0 + 120)
    assert (stage.before, stage.after, stage.reason) == (3, 5, Reason.RULE_SCALE_OUT)
    assert "FIRED floor 5" in stage.detail and "held 120s/120s" in stage.detail
    stage, _ = rules_stage([rule], states, _obs(), 9, 4, 10, T0 + 120)
    assert (stage.after, stage.reason) == (9, Reason.RULES_NOT_BINDING)  # higher already
    stage, _ = rules_stage([rule], states, _obs(), 3, 10, 10, T0 + 120)
    assert stage.after == 10  # 10 + 1 capped at max_replicas


def test_signals_are_the_observation_names() -> None:
    o = _obs(hit=0.6, waiting=7.0, ttft_dist=LatencyQuantiles(p99_ms=800.0), ttft_p95_ms=300.0)
    assert signal_value(o, "kv_cache_miss_frac") == pytest.approx(0.4)
    assert signal_value(o, "waiting") == 7.0
    assert signal_value(o, "ttft_p99_ms") == 800.0
    assert signal_value(o, "ttft_p95_ms") == 300.0
    assert signal_value(replace(o, waiting=float("nan")), "waiting") is None
    assert {"decode_time_p95_ms", "kv_cache_miss_frac", "waiting", "ttft_p95_ms"} <= SIGNALS


@pytest.mark.parametrize(
    ("rules", "problem"),
    [
        ([SOURCE_RULE | {"conditions": [{"signal": "decode_p95", "op": ">", "threshold": 1}]}],
         "unknown signal 'decode_p95'"),
        ([SOURCE_RULE | {"conditions": []}], "at least one condition"),
        ([SOURCE_RULE | {"action": {"add_replicas": 1, "min_replicas": 2}}], "exactly one"),
        ([SOURCE_RULE | {"action": {}}], "exactly one"),
        ([SOURCE_RULE, SOURCE_RULE], "appears more than once"),
        ([SOURCE_RULE | {"join": "most"}], "join"),
    ],
)  # fmt: skip
def test_bad_rules_are_refused_at_config_time(rules: list[dict[str, Any]], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        _model(rules)


def test_the_documented_example_is_the_source_rule() -> None:
    cfg = load_config(EXAMPLE, environ={})
    rules = cfg.models[0].scale_out_rules
    assert rules[0] == _rule()
    assert yaml.safe_load(EXAMPLE.read_text())["models"][0]["scale_out_rules"][0] == SOURCE_RULE


def test_decider_adds_a_replica_at_120_s_and_explains_the_timers() -> None:
    """Through `Decider.decide` at 5 s ticks: the source's rule on a steady fleet."""
    model = _model([SOURCE_RULE])
    d = Decider(model, make_policy(scale_down_stabilization_s=300.0))
    state = d.initial_state(4, now_s=T0)
    slow = helpers.obs(rate=40.0, decode_time_p95_ms=950.0, prefix_cache_hit_frac=0.5)
    seen = []
    for t in range(0, 125, 5):
        dec, state = d.decide(slow, state, T0 + t)
        seen.append((t, dec.replicas, dec.stages[-1].reason))
    base = seen[0][1]
    assert all(r == base for t, r, _ in seen if t < 120)
    assert seen[-1] == (120, base + 1, Reason.RULE_SCALE_OUT)
    assert "held 120s/120s" in dec.explain() and "rules" in dec.explain()
    assert state.rules.states[0].floor == base + 1
    # conditions gone: the floor is released, yet the stabilization window keeps it
    fast = replace(slow, decode_time_p95_ms=400.0)
    dec, state = d.decide(fast, state, T0 + 125)
    assert dec.replicas == base + 1 and dec.stages[-1].reason == Reason.RULES_NOT_BINDING
    assert state.rules.states[0].floor is None
    # missing data: hold, and the timers restart (nothing carried over the gap)
    _, state = d.decide(NoDataError("m", "arrival_rate"), state, T0 + 130)
    assert state.rules.states == ()


def test_check_config_prints_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli import main

    assert main(["check-config", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert (
        "rule slow-decode-cold-cache: decode_time_p95_ms > 900 for 120s AND "
        "kv_cache_miss_frac > 0.35 for 120s -> +1 replica(s)"
    ) in out
