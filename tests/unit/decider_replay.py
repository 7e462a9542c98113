"""Recorded decider inputs and outputs over short spans of the conv and code traces.

A recording holds, per trace, the governor config and the profile the decider used, its
initial state, every tick's observation (or missing-data error) with the tick time, and
the decision each tick produced, with the final state in its saved form. Replaying feeds
the same inputs to today's `Decider` open-loop and compares every decision field by field,
so a refactor of the decider must reproduce the recorded decisions bit for bit (floats
round-trip exactly through JSON).

Commands (run from the repository root):

    python -m tests.unit.decider_replay record   # re-run the simulator, new inputs + outputs
    python -m tests.unit.decider_replay rebless  # keep the inputs, store today's outputs

`record` only when the recorded scenarios change; `rebless` when a change to the
decider's behaviour is intended (say so in the commit message).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from controller.config import GovernorConfig
from controller.decider import Decider
from controller.types import Decision, ModelState
from estimators.stepmodel import Profile
from estimators.types import NoDataError, Observation, SourceError

PATH = Path(__file__).parent / "data" / "decider_replay.json"
# (trace spec, rate multiplier, seconds of trace, start replicas): short, seeded spans.
SCENARIOS = (
    ("azure:conv", 16.0, 900.0, 1),
    ("azure:code", 4.0, 900.0, 4),
)
_OBS = TypeAdapter(Observation)


def decision_record(d: Decision) -> dict[str, Any]:
    """Every field of a decision, JSON-able."""
    return {
        "at_s": d.at_s,
        "valid": d.valid,
        "replicas": d.replicas,
        "knobs": [d.knobs.max_num_seqs, d.knobs.max_num_batched_tokens],
        "stages": [[s.name, s.before, s.after, s.reason.value, s.detail] for s in d.stages],
        "knob_reason": d.knob_reason.value,
        "raw_replicas": d.raw_replicas,
        "demand_rps": d.demand_rps,
        "capacity_rps_per_replica": d.capacity_rps_per_replica,
        "panic": d.panic,
        "rollout": d.rollout,
        "detail": d.detail,
    }


def _input_record(obs: Observation | NoDataError | SourceError) -> dict[str, Any]:
    if isinstance(obs, Observation):
        # The latency distributions are for status and engines, not the decider.
        skip = {"ttft_dist", "itl_dist", "e2e_dist"}
        return {"obs": _OBS.dump_python(obs, mode="json", exclude_none=True, exclude=skip)}
    if isinstance(obs, NoDataError):
        return {"no_data": [obs.model, obs.signal, obs.detail]}
    return {"source_error": str(obs)}


def _input(rec: dict[str, Any]) -> Observation | NoDataError | SourceError:
    if "obs" in rec:
        return _OBS.validate_python(rec["obs"])
    if "no_data" in rec:
        return NoDataError(*rec["no_data"])
    return SourceError(rec["source_error"])


def _state_record(state: ModelState) -> dict[str, Any]:
    from service.store import to_wall

    return to_wall(state, 0.0)


@contextmanager
def _recording(into: list[tuple[Any, ModelState, float, Decision]]) -> Iterator[None]:
    original = Decider.decide

    def wrapped(self: Decider, obs: Any, state: ModelState, now_s: float):  # type: ignore[no-untyped-def]
        d, s = original(self, obs, state, now_s)
        into.append((obs, state, now_s, d))
        return d, s

    Decider.decide = wrapped  # type: ignore[method-assign]
    try:
        yield
    finally:
        Decider.decide = original  # type: ignore[method-assign]


def record() -> dict[str, Any]:
    """Run the governor on each scenario in the simulator and record its decider."""
    from controller.config import SLA
    from simulator.scenario import Scenario, run_policy
    from simulator.traces import load_trace

    out: dict[str, Any] = {}
    for spec, rate, span, start in SCENARIOS:
        trace = load_trace(spec, rate_multiplier=rate, duration_s=span, seed=0)
        sc = Scenario(
            trace=trace,
            sla=SLA(ttft_p95_ms=500.0, itl_p95_ms=50.0),
            start_replicas=start,
            seed=0,
            drain_tail_s=120.0,
        )
        calls: list[tuple[Any, ModelState, float, Decision]] = []
        with _recording(calls):
            run_policy("governor", sc)
        out[f"{spec}x{rate:g}"] = {
            "config": sc.governor_config().model_dump(mode="json"),
            "profile": sc.profile.model_dump(mode="json"),
            "initial": _state_record(calls[0][1]),
            "ticks": [{"now_s": now, **_input_record(obs)} for obs, _, now, _ in calls],
        }
    return out


def replay(entry: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Today's decisions (records) and final state (saved form) for a recorded entry."""
    from service.store import from_wall

    cfg = GovernorConfig.model_validate(entry["config"])
    model = cfg.models[0]
    decider = Decider(model, cfg.policy_for(model), Profile.model_validate(entry["profile"]))
    state = from_wall(entry["initial"], 0.0)
    decisions = []
    for tick in entry["ticks"]:
        d, state = decider.decide(_input(tick), state, tick["now_s"])
        decisions.append(decision_record(d))
    return decisions, _state_record(state)


def _bless(data: dict[str, Any]) -> dict[str, Any]:
    for entry in data.values():
        entry["decisions"], entry["final_state"] = replay(entry)
    return data


def main(argv: list[str]) -> int:
    if argv[1:] == ["record"]:
        data = _bless(record())
    elif argv[1:] == ["rebless"]:
        data = _bless(json.loads(PATH.read_text()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n")
    n = sum(len(e["ticks"]) for e in data.values())
    print(f"{PATH}: {len(data)} scenarios, {n} ticks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
