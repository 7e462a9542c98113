"""The per-request overhead before the engine core, learned online (controller.plant:
overhead_sample, next_overhead, model_overhead): one window's mean end-to-end latency
less its mean queue, prefill and decode times, learned bounded and smoothed, never from
a thin window or one without those histograms; the decider prices it in the TTFT bound
before the SLA is violated, and shows it in `explain`, the status record, the store and
/metrics."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.decider import Decider
from controller.metrics import GovernorMetrics
from controller.plant import (
    OVERHEAD_MAX_MS,
    OVERHEAD_QUANTUM_MS,
    model_overhead,
    next_overhead,
    overhead_sample,
)
from controller.types import ModelState, SavedState
from estimators.stepmodel import load_profile
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import obs

PROFILE_MS = load_profile("llama-3.1-8b-h100").request_overhead_ms
# next_overhead's example window: 12 req/s, the four means of a finished request.
WINDOW: dict[str, Any] = {
    "rate": 12.0,
    "e2e_mean_ms": 3412.0,
    "queue_time_mean_ms": 38.0,
    "prefill_time_mean_ms": 146.0,
    "decode_time_mean_ms": 3000.0,
}


def test_the_worked_example() -> None:
    """controller.plant.next_overhead's example: a sample of 228 ms, 5 s of it from the
    profile's 29 ms at a 60 s half-life -> 40.2 ms, which the models price as 40."""
    assert PROFILE_MS == 29.0
    sample = overhead_sample(obs(**WINDOW), 60.0)
    assert sample == pytest.approx(228.0)
    learned = next_overhead(None, sample, 5.0, PROFILE_MS)
    assert learned == pytest.approx(29 + 199 * (1 - 0.5 ** (5 / 60)))
    assert learned == pytest.approx(40.17, abs=0.01)
    assert model_overhead(learned, PROFILE_MS) == 40.0


@pytest.mark.parametrize(
    "change",
    [
        {"rate": 0.45},  # 27 requests in 60 s: too few to say
        {"queue_time_mean_ms": None},  # engines without the queue-time histogram
        {"prefill_time_mean_ms": None},
        {"decode_time_mean_ms": None},
        {"e2e_mean_ms": None},
        {"e2e_mean_ms": math.nan},
        {"decode_time_mean_ms": math.inf},
    ],
)
def test_no_sample_from_a_window_that_cannot_say(change: dict[str, Any]) -> None:
    assert overhead_sample(obs(**WINDOW), 60.0) is not None
    assert overhead_sample(obs(**{**WINDOW, **change}), 60.0) is None


def test_a_sample_is_bounded_and_no_sample_changes_nothing() -> None:
    """Histograms read a request set apart: a negative difference reads 0, a frontend
    slower than OVERHEAD_MAX_MS reads the bound; no sample leaves the belief alone."""
    assert overhead_sample(obs(**{**WINDOW, "e2e_mean_ms": 3150.0}), 60.0) == 0.0
    assert overhead_sample(obs(**{**WINDOW, "e2e_mean_ms": 1e6}), 60.0) == OVERHEAD_MAX_MS
    assert next_overhead(55.0, None, 5.0, PROFILE_MS) == 55.0
    assert next_overhead(None, None, 5.0, PROFILE_MS) is None
    assert next_overhead(55.0, 200.0, 0.0, PROFILE_MS) == 55.0


@pytest.mark.parametrize(
    ("learned", "priced"),
    [
        (None, 29.0),
        (29.4, 29.0),
        (38.9, 29.0),
        (20.0, 29.0),
        (39.1, 40.0),
        (18.9, 20.0),
        (204.0, 200.0),
    ],
)
def test_the_models_price_the_profile_s_overhead_within_one_quantum(
    learned: float | None, priced: float
) -> None:
    """A profile that is right stays exactly itself (the simulated plant at its
    calibrated 29 ms moves no matrix cell); past one quantum, the learned value rounded."""
    assert OVERHEAD_QUANTUM_MS == 10.0
    assert model_overhead(learned, PROFILE_MS) == priced


def _run(ticks: int, **window: Any) -> tuple[list[Any], ModelState]:
    """`ticks` ticks 5 s apart of a steady 40 req/s on 4 replicas with the SLA met."""
    d = Decider(make_model(max_replicas=64), make_policy())
    s = d.initial_state(4, now_s=ORIGIN_S - 1000)
    decisions = []
    t = ORIGIN_S
    for _ in range(ticks):
        o = obs(
            t=t,
            rate=40.0,
            arrival_rate_short_rps=40.0,
            running=80.0,
            waiting=0.0,
            ready_replicas=4,
            ttft_attainment_frac=1.0,
            itl_attainment_frac=1.0,
            **window,
        )
        dec, s = d.decide(o, replace(s, replicas=4), t)
        decisions.append(dec)
        t += 5.0
    return decisions, s


def test_a_slow_frontend_is_learned_and_priced_before_the_sla_is_violated() -> None:
    """A frontend taking 229 ms where the profile says 29: the decider learns it while
    the SLA still reads healthy, the TTFT bound prices it (less capacity per replica
    than the same windows without the histograms that show it), the feedback
    correction is not what did it, and explain, the saved state and /metrics show it."""
    phases = {"queue_time_mean_ms": 10.0, "prefill_time_mean_ms": 90.0, "decode_time_mean_ms": 3e3}
    decisions, s = _run(120, e2e_mean_ms=3329.0, **phases)  # 10 minutes: ten half-lives
    blind, _ = _run(120, e2e_mean_ms=3329.0)  # no phase histograms: nothing learned
    assert s.plant.overhead_ms == pytest.approx(229.0, rel=0.01)
    # Not the correction: it never shrank (the healthy, loaded fleet grew it past 1).
    assert s.plant.capacity_correction >= 1.0
    last = decisions[-1]
    assert last.plant_overhead_ms == 230.0
    assert blind[-1].plant_overhead_ms == PROFILE_MS
    assert last.capacity_rps_per_replica < 0.9 * blind[-1].capacity_rps_per_replica  # type: ignore[operator]
    assert "overhead 230 ms" in last.explain()
    assert SavedState.of(s).state().plant.overhead_ms == s.plant.overhead_ms
    m = GovernorMetrics(CollectorRegistry())
    m.record(last, 0.0)
    got = m.registry.get_sample_value("governor_plant_overhead_milliseconds", {"model": last.model})
    assert got == 230.0
