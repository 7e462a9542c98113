"""A plant whose per-request overhead is not the profile's: the governor learns it from
the engines' TTFT, queue-time and prefill-time histograms (controller.plant.next_overhead)
and prices it before the SLA teaches it (docs/decider-history.md, "An overhead the
profile does not know")."""

from __future__ import annotations

from dataclasses import replace

from simulator.matrix import CONDITIONS, TRACES, MatrixSpec, scenario_for
from simulator.scenario import run_policy


def test_a_200_ms_frontend_is_learned_and_diurnal_keeps_its_attainment() -> None:
    """Diurnal (seed 0, the matrix's default cell) on engines whose frontend takes 200
    ms where the profile says 29. Before the overhead was learned only the TTFT
    violations taught it (the capacity correction) and 98.97 % of the requests met the
    SLA; learned at the speed's 60 s half-life, the models price 190-210 ms from the
    fifth minute, and 99.14 % do."""
    trace = next(t for t in TRACES if t.key == "diurnal")
    default = next(c for c in CONDITIONS if c.name == "default")
    sc = scenario_for(MatrixSpec(seed=0), trace, default)
    sc = replace(sc, plant=replace(sc.plant, overhead_ms=200.0))
    priced: list[tuple[float, float]] = []

    def on_sync(t: float, fleet: object, policy: object) -> None:
        d = policy.capture.latest  # type: ignore[attr-defined]
        if d is not None and d.plant_overhead_ms is not None:
            priced.append((t, d.plant_overhead_ms))

    result = run_policy("governor", sc, on_sync=on_sync)
    assert result.slo_attainment >= 0.99, result.slo_attainment
    assert priced[0][1] == 29.0  # the profile's, before a window says otherwise
    assert all(190.0 <= v <= 210.0 for t, v in priced if t >= 240.0), priced[-1]
