"""The knob correction (controller.feedback.next_knob_correction): `slo` knobs whose
engines stream slower than the SLA allows at their sequence cap get fewer sequences.

The profile's step shape is a belief: vLLM's CPU build's step doubles from 1 to 32
sequences where the profile's grows 7 %, so at an ITL target of 10 ms the knobs stayed
at 32 sequences while 35-70 % of requests streamed within it
(`python -m benchmarks.engine_knobs`, docs/real-engine-runs.md). These tests drive the
decider with such windows: at the cap, decode-bound, streaming violated.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.config import KnobBounds
from controller.decider import Decider
from controller.feedback import (
    CORRECTION_DECAY_PER_S,
    CORRECTION_RECOVERY_PER_S,
    KNOB_CORRECTION_MIN,
    knob_target_out_of_reach,
    next_knob_correction,
)
from controller.metrics import GovernorMetrics
from controller.types import KnobMemory, Knobs, ModelState, PlantBelief, Reason, SavedState
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import long_history, obs

REPLICAS = 4
KNOBS = Knobs(max_num_seqs=152, max_num_batched_tokens=2560)
"""The slo knobs of the conversation lengths at ITL 50 ms (controller.batching)."""


def _at_cap(**kw: Any) -> dict[str, Any]:
    """An observation's fields for 4 replicas at 95 % of KNOBS' 152 sequences, decode-bound
    (100 prefill tokens a step), with `kw` over them."""
    b = 0.95 * KNOBS.max_num_seqs
    fields: dict[str, Any] = dict(
        running=b * REPLICAS,
        waiting=40.0,
        ready_replicas=REPLICAS,
        step_tokens_mean=b + 100.0,
        ttft_attainment_frac=1.0,
        tpot_attainment_frac=0.6,  # 40 % of requests stream slower than the target
    )
    fields.update(kw)
    return fields


def _state(d: Decider, correction: float = 1.0, knobs: Knobs = KNOBS) -> ModelState:
    """4 replicas on `knobs`, published 1,000 s ago (one change made), a long healthy
    history, the knob correction at `correction`."""
    s = d.initial_state(REPLICAS, now_s=ORIGIN_S - 1000)
    return replace(
        s,
        knobs=knobs,
        knob_memory=KnobMemory(changes=1, changed_at_s=ORIGIN_S - 1000),
        health=long_history(),
        plant=PlantBelief(knob_correction=correction),
    )


def _run(d: Decider, s: ModelState, ticks: int, **kw: Any) -> tuple[list[Any], ModelState]:
    """`ticks` decisions 5 s apart from ORIGIN_S on observations `_at_cap(**kw)`."""
    out = []
    for i in range(ticks):
        t = ORIGIN_S + 5.0 * i
        dec, s = d.decide(obs(t=t, **_at_cap(**kw)), s, t)
        out.append(dec)
    return out, s


def test_the_correction_shrinks_while_violated_at_the_cap_and_recovers_while_healthy() -> None:
    assert next_knob_correction(1.0, 60.0, True, False, True, True, False) == pytest.approx(
        math.exp(-CORRECTION_DECAY_PER_S * 60.0)
    )
    assert next_knob_correction(0.3, 600.0, True, False, True, True, False) == KNOB_CORRECTION_MIN
    for at_cap, settled in ((False, True), (True, False)):
        assert next_knob_correction(0.8, 60.0, True, False, at_cap, settled, False) == 0.8
    # knobs already at their fewest sequences: a smaller budget changes nothing, held
    assert next_knob_correction(0.55, 600.0, True, False, True, True, True) == 0.55
    assert next_knob_correction(0.5, 100.0, False, True, True, True, False) == pytest.approx(
        0.5 + CORRECTION_RECOVERY_PER_S * 100.0
    )
    assert next_knob_correction(0.5, 100.0, False, True, True, True, True) == pytest.approx(
        0.5 + CORRECTION_RECOVERY_PER_S * 100.0
    )  # healthy at the floor's cap: recovers
    assert next_knob_correction(0.5, 100.0, False, True, False, True, False) == 0.5  # below cap
    assert next_knob_correction(0.99, 1000.0, False, True, True, False, False) == 1.0


def test_the_target_is_out_of_reach_exactly_where_a_violated_correction_holds() -> None:
    """KNOBS_SLA_INFEASIBLE (knob_target_out_of_reach) and the correction's hold are one
    guard: over every combination of its four conditions, a violated stream leaves the
    correction where it is at a floor the report names, and shrinks it wherever the
    stream is judged (at the cap, settled) and the knobs are not floored."""
    for at_cap in (False, True):
        for settled in (False, True):
            for floored in (False, True):
                out = knob_target_out_of_reach(True, at_cap, settled, floored)
                assert out == (at_cap and settled and floored)
                after = next_knob_correction(0.8, 60.0, True, False, at_cap, settled, floored)
                assert (after < 0.8) == (at_cap and settled and not floored)
                assert not knob_target_out_of_reach(False, at_cap, settled, floored)


def test_slow_streaming_at_the_cap_lowers_the_sequences_at_once_when_the_budget_moves() -> None:
    """Streaming violated at the cap of knobs in force for a long time: the correction
    shrinks each tick until the knobs it gives have materially fewer sequences, which
    are published on that tick (no 120 s sustain: the stream already says the knobs in
    force are too many); then it stops (a window to judge the new knobs)."""
    d = Decider(make_model(max_replicas=64), make_policy())
    decisions, _ = _run(d, _state(d), 40)
    changed = [i for i, dec in enumerate(decisions) if dec.knob_reason == Reason.KNOBS_CHANGED]
    assert changed, [dec.knob_reason for dec in decisions]
    first = decisions[changed[0]]
    assert first.knobs.max_num_seqs < KNOBS.max_num_seqs
    before = [dec.knob_reason for dec in decisions[: changed[0]]]
    assert Reason.KNOBS_PENDING not in before, before  # adopted on the tick it appeared
    assert decisions[changed[0] - 1].knob_correction < 1.0  # type: ignore[operator]
    # no further shrinking for a window after the change
    window_ticks = int(make_policy().window_s / 5.0)
    after = [dec.knob_correction for dec in decisions[changed[0] : changed[0] + window_ticks]]
    assert len(set(after)) == 1, after
    assert f"knob correction x{first.knob_correction:.2f}" in first.explain()
    m = GovernorMetrics(CollectorRegistry())
    m.record(first, 0.0)
    got = m.registry.get_sample_value("governor_knob_correction", {"model": first.model})
    assert got == pytest.approx(first.knob_correction)


@pytest.mark.parametrize(
    "why,fields",
    [
        ("prefill-bound steps", {"step_tokens_mean": 0.95 * 152 + 2000.0}),
        ("no step tokens", {"step_tokens_mean": None}),
        ("below the cap", {"running": 50.0 * REPLICAS, "step_tokens_mean": 150.0}),
        ("streaming within the SLA", {"tpot_attainment_frac": 0.999}),
    ],
)
def test_the_correction_holds_where_the_knobs_are_not_what_slows_the_stream(
    why: str, fields: dict[str, Any]
) -> None:
    """Prompts filling the steps' token budget (a queue behind chunked prefill, which
    more replicas drain), a batch below the cap, or no evidence: no correction, no
    knob change."""
    d = Decider(make_model(max_replicas=64), make_policy())
    decisions, s = _run(d, _state(d), 40, **fields)
    assert s.plant.knob_correction == 1.0, why
    assert all(dec.knobs == KNOBS for dec in decisions), why


@pytest.mark.parametrize("fewest", [8, 16])
def test_the_correction_holds_where_the_knobs_run_the_fewest_sequences_they_may(
    fewest: int,
) -> None:
    """A stream still violated at the fewest sequences the knobs may have (one quantum,
    or the bounds' minimum), which are also what the budget gives (ITL 10 ms: no batch
    of the profile's fits x0.55 of it): a smaller budget changes no knob, so the
    correction holds where it is instead of running down to its floor (which a target
    relaxed later would wait up to 25 minutes to recover from), and the decision says
    the target is out of the knobs' reach."""
    bounds = KnobBounds(max_num_seqs_min=fewest)
    d = Decider(make_model(max_replicas=64, itl_p95_ms=10.0, knobs=bounds), make_policy())
    knobs = Knobs(max_num_seqs=fewest, max_num_batched_tokens=256)  # what the budget gives
    b = 0.95 * fewest
    decisions, s = _run(
        d,
        _state(d, correction=0.55, knobs=knobs),
        40,
        running=b * REPLICAS,
        step_tokens_mean=b + 40.0,  # decode-bound: 40 prefill tokens a step, of 256
    )
    assert [dec.knob_reason for dec in decisions] == [Reason.KNOBS_SLA_INFEASIBLE] * 40
    assert decisions[-1].knobs == knobs
    assert s.plant.knob_correction == 0.55
    assert "(KNOBS_SLA_INFEASIBLE)" in decisions[-1].explain()
    # streaming within the target at that floor: nothing out of reach
    healthy, _ = _run(
        d,
        _state(d, correction=0.55, knobs=knobs),
        3,
        running=b * REPLICAS,
        step_tokens_mean=b + 40.0,
        tpot_attainment_frac=0.999,
    )
    assert [dec.knob_reason for dec in healthy] == [Reason.KNOBS_UNCHANGED] * 3


def test_static_knobs_are_never_corrected() -> None:
    d = Decider(make_model(max_replicas=64, batching_policy="static"), make_policy())
    _, s = _run(d, _state(d), 40)
    assert s.plant.knob_correction == 1.0


def test_the_correction_and_the_change_time_survive_a_restart() -> None:
    d = Decider(make_model(max_replicas=64), make_policy())
    _, s = _run(d, _state(d, correction=0.7), 3)
    back = SavedState.of(s).state()
    assert back.plant.knob_correction == s.plant.knob_correction
    assert back.knob_memory.changed_at_s == s.knob_memory.changed_at_s
