"""The `Actuator` protocol: what the control loop hands each tick's decisions to.

It lives in the controller (not in `actuators/`) so that the loop depends only on this
contract, and the actuators, one layer up, implement it.

An actuator applies decisions. It must not block the control loop for long: slow
backends (Kubernetes API) retry in their own threads. It never acts on an invalid
decision (`Decision.valid` False means "leave the fleet as it is").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from controller.types import Decision


@runtime_checkable
class Actuator(Protocol):
    """Applies a tick's decisions (one per model)."""

    def apply(self, decisions: Sequence[Decision]) -> None:
        """Apply `decisions`; invalid ones are skipped. Must not raise for one model's
        failure: report it (log, metrics) and go on with the others."""
        ...


@runtime_checkable
class RolloutGate(Protocol):
    """An actuator that may hold a knob roll-out the decider asked for (the roll-out
    actuator: in progress, panic, too few replicas to spare, rate limit). The loop asks
    it before each decision, so the decider knows the replicas still run the knobs from
    before the change (`Decider.rollout_waiting`)."""

    def rollout_waiting(self, model: str) -> bool:
        """True while a roll-out asked for `model` has not started."""
        ...
