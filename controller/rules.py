"""Composite scale-out rules: conditions on observed signals that add replicas.

A rule is a set of conditions (signal, comparison, threshold, for how long) joined by
`all` or `any`, and an action: at least N more replicas than the current count
(`add_replicas`) or at least a number (`min_replicas`). The source design's rule, as
config (examples/rules.yaml):

    scale_out_rules:
      - name: slow-decode-cold-cache
        join: all
        conditions:
          - {signal: decode_time_p95_ms, op: ">", threshold: 900, for_s: 120}
          - {signal: kv_cache_miss_frac, op: ">", threshold: 0.35, for_s: 120}
        action: {add_replicas: 1}

Signals are named as the Observation names them (`decode_time_p95_ms`, `waiting`,
`ttft_p95_ms`, ...), plus the distribution quantiles `<ttft|itl|e2e>_<p50|p90|p95|p99>_ms`
and `kv_cache_miss_frac` = 1 - `prefix_cache_hit_frac` (the prefix-cache misses per
query). A rule naming any other signal is refused at config time.

Semantics, evaluated once per tick at `now_s` (the loop's monotonic seconds):
- a condition's timer starts on the first tick it holds and restarts whenever it does not
  hold or its signal has no data (missing data is never evidence); it is satisfied once
  `now - since >= for_s`, so with for_s 120 a condition true since t fires at t + 120,
  not at t + 119;
- a rule fires when its conditions are satisfied (all, or any); it then sets a floor of
  current replicas + N (or N), and its timers restart, so a condition that persists
  another full period adds N more again (the added replicas had their chance);
- the floor is kept while the rule's conditions still hold (instantly, timers aside) and
  released as soon as they do not: the ordinary stages take over from there (their
  scale-down stabilization, rate limits), so a rule never lowers replicas itself;
- the result is max(decided replicas, floor), never above `max_replicas`.
Rule timers and floors live in the decider's frozen state (`RuleState`, persisted with it).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Literal, Self

from pydantic import (
    Field,
    PositiveInt,
    field_validator,
    model_validator,
)

from controller.strictmodel import StrictModel as _Strict
from controller.types import Reason, RuleState, Stage
from estimators.types import Observation, latency_quantiles

_NUMERIC_TYPES = {"float", "float | None", "int | None", "int"}
_NOT_SIGNALS = {"model", "observed_at_s"}
DIST_SIGNALS = tuple(
    f"{sig}_{q}_ms" for sig in ("ttft", "itl", "e2e") for q in ("p50", "p90", "p95", "p99")
)
DERIVED_SIGNALS = ("kv_cache_miss_frac",)
SIGNALS: frozenset[str] = frozenset(
    [
        f.name
        for f in fields(Observation)
        if str(f.type) in _NUMERIC_TYPES and f.name not in _NOT_SIGNALS
    ]
    + list(DIST_SIGNALS)
    + list(DERIVED_SIGNALS)
)
"""Every signal a rule may name."""

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


def signal_value(obs: Observation, signal: str) -> float | None:
    """The value of `signal` in `obs`, None when the source had no data for it."""
    if signal == "kv_cache_miss_frac":
        hit = obs.prefix_cache_hit_frac
        return None if hit is None or not math.isfinite(hit) else 1.0 - hit
    if signal in DIST_SIGNALS:
        sig, q, _ = signal.split("_")
        return getattr(latency_quantiles(obs, sig), f"{q}_ms")
    value = getattr(obs, signal, None)
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


class Condition(_Strict):
    """`signal op threshold` held for at least `for_s` seconds (0: on one tick)."""

    signal: str
    op: Literal[">", ">=", "<", "<="]
    threshold: float = Field(allow_inf_nan=False)
    for_s: float = Field(default=0.0, ge=0, le=86_400)

    @field_validator("signal")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in SIGNALS:
            raise ValueError(f"unknown signal {v!r}; known: {', '.join(sorted(SIGNALS))}")
        return v

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)


class RuleAction(_Strict):
    """Exactly one of: at least `add_replicas` more than the current count, or at least
    `min_replicas` replicas."""

    add_replicas: PositiveInt | None = Field(default=None, le=1000)
    min_replicas: PositiveInt | None = Field(default=None, le=100_000)

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.add_replicas is None) == (self.min_replicas is None):
            raise ValueError("set exactly one of add_replicas and min_replicas")
        return self

    def floor(self, current: int) -> int:
        return (
            current + self.add_replicas if self.add_replicas is not None else self.min_replicas or 0
        )


class ScaleOutRule(_Strict):
    """A named composite scale-out rule (see the module doc)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    join: Literal["all", "any"] = "all"
    conditions: tuple[Condition, ...] = Field(max_length=16)
    action: RuleAction

    @model_validator(mode="after")
    def _some(self) -> Self:
        if not self.conditions:
            raise ValueError(f"rule {self.name!r}: conditions must hold at least one condition")
        return self


def check_unique_names(rules: Sequence[ScaleOutRule]) -> None:
    """ValueError when two rules share a name (explain and state are keyed by it)."""
    seen: set[str] = set()
    for r in rules:
        if r.name in seen:
            raise ValueError(f"scale_out_rules: rule name {r.name!r} appears more than once")
        seen.add(r.name)


@dataclass(frozen=True, slots=True)
class RulesOutcome:
    """The rules' verdict for one tick: the replica floor (None: no rule holds one), the
    rules that fired on this tick, the new states and a one-line trace per rule."""

    floor: int | None
    fired: tuple[str, ...]
    states: tuple[RuleState, ...]
    detail: str


def _state_for(rule: ScaleOutRule, states: Sequence[RuleState]) -> RuleState:
    for st in states:
        if st.name == rule.name and len(st.since_s) == len(rule.conditions):
            return st
    return RuleState(name=rule.name, since_s=(None,) * len(rule.conditions))


def _fmt(v: float) -> str:
    return re.sub(r"\.?0+$", "", f"{v:.3f}") if abs(v) < 1e6 else f"{v:.3g}"


def evaluate(
    rules: Sequence[ScaleOutRule],
    states: Sequence[RuleState],
    obs: Observation | None,
    current_replicas: int,
    now_s: float,
) -> RulesOutcome:
    """Evaluate every rule at `now_s` against `obs` (None: no data this tick: every
    timer restarts and every floor is released; the decider holds replicas anyway)."""
    out_states: list[RuleState] = []
    fired: list[str] = []
    floors: list[int] = []
    lines: list[str] = []
    for rule in rules:
        st = _state_for(rule, states)
        since: list[float | None] = []
        parts: list[str] = []
        holding: list[bool] = []
        satisfied: list[bool] = []
        for cond, was in zip(rule.conditions, st.since_s, strict=True):
            value = signal_value(obs, cond.signal) if obs is not None else None
            ok = value is not None and cond.holds(value)
            start = (was if was is not None else now_s) if ok else None
            since.append(start)
            holding.append(ok)
            held_s = now_s - start if start is not None else 0.0
            satisfied.append(ok and held_s >= cond.for_s)
            shown = "no data" if value is None else _fmt(value)
            parts.append(
                f"{cond.signal}={shown} {cond.op} {_fmt(cond.threshold)} "
                f"{'held ' + _fmt(held_s) + 's' if ok else 'not held'}/{_fmt(cond.for_s)}s"
            )
        join = all if rule.join == "all" else any
        floor = st.floor if join(holding) else None
        fired_at = st.fired_at_s
        if join(satisfied):
            floor = max(floor or 0, rule.action.floor(current_replicas))
            fired_at = now_s
            fired.append(rule.name)
            since = [now_s if ok else None for ok in holding]  # the next period starts now
        if floor is not None:
            floors.append(floor)
        state = (
            f"FIRED floor {floor}"
            if rule.name in fired
            else (f"holding floor {floor}" if floor is not None else "quiet")
        )
        lines.append(f"rule {rule.name} ({rule.join}): {state}; " + "; ".join(parts))
        out_states.append(
            RuleState(name=rule.name, since_s=tuple(since), floor=floor, fired_at_s=fired_at)
        )
    return RulesOutcome(
        floor=max(floors) if floors else None,
        fired=tuple(fired),
        states=tuple(out_states),
        detail=" | ".join(lines),
    )


def rules_stage(
    rules: Sequence[ScaleOutRule],
    states: Sequence[RuleState],
    obs: Observation | None,
    decided: int,
    current: int,
    max_replicas: int,
    now_s: float,
) -> tuple[Stage, tuple[RuleState, ...]]:
    """The decider's `rules` stage: `decided` replicas (after every other stage) raised
    to the rules' floor, at most `max_replicas`, never lowered. `current`: the replicas
    the model has now (the base of `add_replicas`). Returns the stage (reason
    RULE_SCALE_OUT when a floor raised the count, else RULES_NOT_BINDING; the detail holds
    every condition's value and timer) and the rules' new states."""
    out = evaluate(rules, states, obs, current, now_s)
    after = decided
    if out.floor is not None and out.floor > decided:
        after = max(decided, min(out.floor, max_replicas))
    reason = Reason.RULE_SCALE_OUT if after > decided else Reason.RULES_NOT_BINDING
    return Stage("rules", decided, after, reason, out.detail), out.states
