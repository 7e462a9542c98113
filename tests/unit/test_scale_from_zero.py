"""Scale from zero: a model at zero replicas has no engine to report its demand, so only
a gateway's request rate (`prometheus.ingress_rate_query`) can wake it. The decider
scales such a model up from that rate alone; the loop holds `min_replicas` 0 at 1 where
the source cannot see demand at zero (else the model would stay at zero for good)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from controller.config import GovernorConfig
from controller.decider import Decider
from controller.loop import ControlLoop
from controller.types import Reason
from estimators.types import ModelQuery, Observation, ObservationResult
from tests.conftest import ORIGIN_S, make_model, make_policy
from tests.unit.helpers import obs

TICK = 5.0


def gateway_only(rate: float, t: float = ORIGIN_S) -> Observation:
    """What PrometheusSource reports for a model with no engine but a gateway rate."""
    return Observation(
        model="llama", observed_at_s=t, arrival_rate_rps=rate, ingress_rate_rps=rate, targets_up=0
    )


def test_a_request_at_zero_replicas_asks_for_one_before_any_length_is_known() -> None:
    d = Decider(make_model(min_replicas=0), make_policy())
    dec, s = d.decide(gateway_only(0.5), d.initial_state(0), ORIGIN_S)
    assert dec.valid and dec.replicas == 1
    assert dec.stages[0].reason == Reason.SCALE_FROM_ZERO
    # While the engine starts (targets still 0) the fleet asked to run is held, not
    # read as idle or dead-and-zero: missing engine data never lowers replicas.
    held, _ = d.decide(gateway_only(0.5, ORIGIN_S + TICK), s, ORIGIN_S + TICK)
    assert held.replicas == 1 and held.reasons[0] == Reason.NO_DATA_HOLD


def test_no_gateway_traffic_at_zero_stays_at_zero() -> None:
    d = Decider(make_model(min_replicas=0), make_policy())
    dec, _ = d.decide(gateway_only(0.0), d.initial_state(0), ORIGIN_S)
    assert dec.replicas == 0 and dec.stages[0].reason == Reason.IDLE


def test_known_lengths_size_the_wake_up_by_capacity() -> None:
    """With lengths from before the scale to zero, the wake-up is sized like any tick."""
    d = Decider(make_model(min_replicas=0, max_replicas=40), make_policy())
    _, s = d.decide(obs(rate=40.0), d.initial_state(3), ORIGIN_S)  # lengths learned
    dec, _ = d.decide(gateway_only(40.0, ORIGIN_S + TICK), replace(s, replicas=0), ORIGIN_S + TICK)
    assert dec.stages[0].reason == Reason.CAPACITY and dec.replicas >= 2


class _Idle:
    """Idle engines, and `sees_demand_at_zero` as given (PrometheusSource: False without
    an ingress rate)."""

    def __init__(self, sees: bool) -> None:
        self.sees_demand_at_zero = sees

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        return {m.name: obs(model=m.name, t=now_s, rate=0.0, running=0.0) for m in models}


def _loop(sees: bool, start: int) -> ControlLoop:
    policy = make_policy(scale_to_zero_idle_s=60.0, scale_down_stabilization_s=30.0)
    config = GovernorConfig(models=(make_model("llama", min_replicas=0),), policy=policy)
    return ControlLoop(config, _Idle(sees), initial_replicas=lambda m: start)


def _replicas_over(loop: ControlLoop, seconds: float) -> list[int]:
    out = []
    for k in range(int(seconds / TICK)):
        loop.tick(ORIGIN_S + k * TICK)
        decision = loop.snapshot().models["llama"].decision
        assert decision is not None
        out.append(decision.replicas)
    return out


def test_a_source_blind_at_zero_never_scales_to_zero() -> None:
    assert min(_replicas_over(_loop(sees=False, start=2), 300.0)) == 1
    assert _replicas_over(_loop(sees=True, start=2), 300.0)[-1] == 0  # allowed where seen


def test_a_model_restored_at_zero_under_a_blind_source_is_scaled_back_to_one() -> None:
    assert _replicas_over(_loop(sees=False, start=0), TICK) == [1]
