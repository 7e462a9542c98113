"""Prefix-cache hits on the simulated plant: engines that find a share of every prompt
in their prefix cache (`governor simulate --plant-prefix-hit F`, simulator.engine) do
less prefill work, which the decider reads from `vllm:prefix_cache_hits_total` /
`_queries_total` and prices (controller.capacity.priced_hit_frac). Long-context
prompts (mean 12k, p95 40k tokens, TTFT target 15 s), 10 minutes, seed 0, start at one
replica, 15 s scrape; the oracle is not run (tests/unit/test_prefix_hits.py has the
model; the README's request-lengths paragraph has the half-hour runs against it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from controller.config import SLA
from estimators.types import ModelQuery, Observation, ObservationResult
from simulator.metrics import SimulatedSource
from simulator.plant import Plant
from simulator.scenario import PolicyResult, Scenario, run_policy
from simulator.traces import load_trace


def _run(hit: float, monkeypatch: pytest.MonkeyPatch, priced: bool) -> PolicyResult:
    """The governor on engines that hit `hit` of each prompt; with `priced` False its
    observations carry no hit share, so it prices every prompt token (as before it read
    the counters)."""
    scenario = Scenario(
        trace=load_trace("synthetic:long-context:duration=600", seed=0),
        sla=SLA(ttft_p95_ms=15_000.0, itl_p95_ms=50.0),
        plant=Plant(prefix_hit_frac=hit),
    )
    with monkeypatch.context() as m:
        if not priced:
            observe = SimulatedSource.observe

            def without_hits(
                self: SimulatedSource, models: Sequence[ModelQuery], now_s: float
            ) -> dict[str, ObservationResult]:
                return {
                    k: replace(v, prefix_cache_hit_frac=None) if isinstance(v, Observation) else v
                    for k, v in observe(self, models, now_s).items()
                }

            m.setattr(SimulatedSource, "observe", without_hits)
        return run_policy("governor", scenario)


def test_a_fleet_whose_prompts_hit_the_cache_is_sized_for_the_prefill_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """80 % of each prompt hit: priced (capacity and knobs), 99.70 % within the SLA on
    0.46 GPU-hours (at most 3 replicas), the speed learned at 1.02 of the plant's;
    unpriced, 100.00 % on 1.02 (5 replicas at most), the hits read as a plant 14 % faster
    (0.86) and the capacity still priced for whole prefills (the SLA met with margin
    grows the capacity correction a little past 1 between scale-ups: 1.04 GPU-hours
    before it could)."""
    priced = _run(0.8, monkeypatch, priced=True)
    unpriced = _run(0.8, monkeypatch, priced=False)
    assert 100.0 * priced.slo_attainment == pytest.approx(99.70, abs=0.01)
    assert 100.0 * unpriced.slo_attainment == pytest.approx(100.00, abs=0.01)
    assert priced.gpu_hours == pytest.approx(0.46, abs=0.005)
    assert unpriced.gpu_hours == pytest.approx(1.02, abs=0.005)
    assert (priced.flaps, unpriced.flaps) == (0, 0)
    assert priced.learned_speed == pytest.approx(1.02, abs=0.01)
    assert unpriced.learned_speed == pytest.approx(0.86, abs=0.01)
