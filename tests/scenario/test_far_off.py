"""Engines far slower than the profile the decider believes, on the simulated plant:
the robustness matrix's conditions stay within 0.7-1.3x the profile, and this pins
what the governor does well outside them (docs/decider-history.md, "Far off the
profile")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.matrix import CONDITIONS, TRACES, MatrixSpec, scenario_for
from simulator.scenario import Scenario, run_policy


def _default_cell(trace_key: str, speed: float) -> Scenario:
    """The matrix's default cell of `trace_key` at seed 0 on engines `speed` x slower
    than the profile the decider believes."""
    trace = next(t for t in TRACES if t.key == trace_key)
    default = next(c for c in CONDITIONS if c.name == "default")
    sc = scenario_for(MatrixSpec(seed=0), trace, default)
    return replace(sc, plant=replace(sc.plant, speed=speed))


def test_a_fleet_that_never_drains_its_queue_learns_engines_4x_slower() -> None:
    """Long-context (seed 0, the matrix's default cell: one replica, 15 s scrape) on
    engines 4x slower than the profile. The fleet holds a queue from its first minute
    and no unqueued window comes for 14 minutes: before the windows queued at the
    engines' limit taught the speed (Decider._standing_queue) it believed 1.00 all that
    time, and 51.27 % of the requests met the SLA; with them it jumps to ~4 in the
    sixth minute, and 84.25 % do (hpa-queue 94.61 %: docs/decider-history.md)."""
    sc = _default_cell("long-context", 4.0)
    speeds: list[tuple[float, float]] = []

    def on_sync(t: float, fleet: object, policy: object) -> None:
        d = policy.capture.latest  # type: ignore[attr-defined]
        if d is not None:
            speeds.append((t, d.plant_speed))

    result = run_policy("governor", sc, on_sync=on_sync)
    assert result.slo_attainment >= 0.80, result.slo_attainment
    by_minute_6 = [s for t, s in speeds if t <= 360.0]
    assert by_minute_6 and 3.0 <= max(by_minute_6) <= 6.0, by_minute_6[-1:]


def test_an_sla_no_replica_meets_is_sized_to_meet_most_requests() -> None:
    """Diurnal (seed 0, default cell) on engines 4x slower than the profile: from the
    second minute no replica meets the SLA unloaded at the learned speed, and the fleet
    is sized for each target relaxed to RELAX_FACTOR x an unloaded replica's
    (SLA_INFEASIBLE). At 2x that sizing met 84.54 % (hpa-queue 90.35 %, 64 warm
    replicas 95.32 %); at 1.5x 92.35 % (92.20 % since the arrival rate is read off the
    fleet's summed queue, estimators/promql.py; 92.11 % since the speed is the
    per-sequence fit's own, controller.plant.next_seq_ratio)."""
    result = run_policy("governor", _default_cell("diurnal", 4.0))
    assert result.slo_attainment >= 0.90, result.slo_attainment


@pytest.mark.parametrize(
    ("trace_key", "speed", "policy", "attainment_pct", "gpu_hours"),
    [
        ("code x4", 2.5, "governor", 83.63, 58.12),
        ("code x4", 2.5, "hpa-queue", 81.43, 31.15),
        ("long-context", 4.0, "governor", 84.25, 32.58),
        ("long-context", 4.0, "hpa-queue", 94.61, 24.53),
        ("diurnal", 4.0, "governor", 92.11, 16.17),
        ("diurnal", 4.0, "hpa-queue", 90.35, 13.17),
        ("conv x16", 4.0, "governor", 81.33, 58.91),
        ("conv x16", 4.0, "hpa-queue", 52.17, 49.00),
    ],
)
def test_the_readmes_far_off_cells(
    trace_key: str, speed: float, policy: str, attainment_pct: float, gpu_hours: float
) -> None:
    """The cells on engines `speed` x slower that the README quotes ("For an operator
    with a different GPU"), misses included (long-context at 4x, where hpa-queue meets
    more on fewer GPU-hours; code x4 at 2.5x, where it did until the windows of fewer
    sequences than replicas taught the speed: docs/decider-history.md), seeded:
    attainment within 0.01 points, GPU-hours within 0.01."""
    result = run_policy(policy, _default_cell(trace_key, speed))
    assert 100.0 * result.slo_attainment == pytest.approx(attainment_pct, abs=0.01)
    assert result.gpu_hours == pytest.approx(gpu_hours, abs=0.01)
