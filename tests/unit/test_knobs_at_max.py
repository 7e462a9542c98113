"""Knobs for throughput where the fleet is at its max replicas and short
(controller.batching.throughput_knobs, KNOBS_THROUGHPUT).

At the maximum no scale-up can serve the load, a queue stands whatever the knobs, and
every request waits past the TTFT target until it drains; the `slo` knobs, sized for the
ITL target, then only slow the drain. Measured on the simulated plant (conversation x16,
`governor simulate --max-replicas 5`): 28.36 % of the requests within the SLA on the
`slo` knobs, 39.48 % on these (docs/decider-history.md, "A fleet at its max replicas").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from controller.batching import slo_knobs, throughput_knobs
from controller.config import KnobBounds
from controller.decider import Decider
from controller.types import KnobMemory, Knobs, Lengths, ModelState, Reason
from estimators.stepmodel import load_profile
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import long_history, obs

CONV = Lengths(prompt_mean=1155.0, prompt_p95=4083.0, output_mean=211.0, output_p95=451.0)
SLO = Knobs(max_num_seqs=152, max_num_batched_tokens=2560)
"""The slo knobs of the conversation lengths at ITL 50 ms (controller.batching)."""
MAX = 4


def test_throughput_knobs_fill_the_kv_cache_and_keep_the_chunk_room() -> None:
    """The docstring's example: KV for 306 sequences of 1,366 tokens -> 304, the budget
    grown by the 152 sequences added, rounded up to a 256-token quantum; never fewer
    sequences than the slo knobs', and within the bounds."""
    profile = load_profile("llama-3.1-8b-h100")
    bounds = KnobBounds()
    assert slo_knobs(CONV, make_model().sla, profile, bounds, 0.85) == SLO
    assert throughput_knobs(SLO, CONV, profile, bounds) == Knobs(304, 2816)
    assert throughput_knobs(Knobs(136, 2304), CONV, profile, bounds) == Knobs(304, 2560)
    assert throughput_knobs(Knobs(400, 4096), CONV, profile, bounds) == Knobs(400, 4096)
    narrow = KnobBounds(max_num_seqs_max=200, default_max_num_seqs=200)
    assert throughput_knobs(SLO, CONV, profile, narrow).max_num_seqs == 200


def _state(d: Decider, replicas: int) -> ModelState:
    """`replicas` on the slo knobs, published 1,000 s ago, a long healthy history."""
    s = d.initial_state(replicas, now_s=ORIGIN_S - 1000)
    return replace(
        s,
        knobs=SLO,
        knob_memory=KnobMemory(changes=1, changed_at_s=ORIGIN_S - 1000),
        health=long_history(),
    )


def _run(max_replicas: int, ticks: int, **kw: Any) -> list[Any]:
    """Decisions 5 s apart on 4 replicas of a model with `max_replicas`, under a load
    that needs ~10 (200 req/s, 400 waiting; `kw` over those)."""
    d = Decider(make_model(max_replicas=max_replicas), make_policy())
    s = _state(d, MAX)
    fields: dict[str, Any] = dict(rate=200.0, running=4 * 140.0, waiting=400.0, ready_replicas=MAX)
    fields.update(kw)
    out = []
    for i in range(ticks):
        t = ORIGIN_S + 5.0 * i
        dec, s = d.decide(obs(t=t, **fields), s, t)
        out.append(dec)
    return out


def test_a_fleet_short_at_its_max_replicas_moves_to_throughput_knobs() -> None:
    """At max 4, the first tick asks for more than 4 (clamped); from the next, the
    throughput knobs are the candidate, adopted after the sustain (120 s) and then held
    as KNOBS_THROUGHPUT. The same load with room to scale (max 20) keeps the slo knobs."""
    sustain_ticks = int(make_policy().knob_sustain_s / 5.0)
    decisions = _run(MAX, sustain_ticks + 4)
    assert all(dec.replicas == MAX for dec in decisions)
    assert decisions[0].stages[-1].reason == Reason.CLAMPED_MAX
    reasons = [dec.knob_reason for dec in decisions]
    assert reasons[1 : sustain_ticks + 1] == [Reason.KNOBS_PENDING] * sustain_ticks, reasons
    changed = decisions[sustain_ticks + 1]
    assert changed.knob_reason == Reason.KNOBS_CHANGED, reasons
    assert changed.knobs.max_num_seqs > SLO.max_num_seqs
    assert reasons[sustain_ticks + 2 :] == [Reason.KNOBS_THROUGHPUT] * 2, reasons
    assert "KNOBS_THROUGHPUT" in decisions[-1].explain()

    roomy = _run(20, sustain_ticks + 4)
    assert roomy[-1].replicas > MAX
    assert {dec.knobs for dec in roomy} == {SLO}


def test_a_fleet_at_its_max_that_serves_the_load_keeps_the_slo_knobs() -> None:
    """At the maximum but not short (a load 4 replicas serve): no throughput knobs."""
    decisions = _run(MAX, 30, rate=30.0, running=4 * 20.0, waiting=0.0)
    assert {dec.knobs for dec in decisions} == {SLO}
    assert Reason.KNOBS_THROUGHPUT not in {dec.knob_reason for dec in decisions}
