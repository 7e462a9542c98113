"""The `Actuator` protocol and the log-only actuator.

An actuator applies decisions. It must not block the control loop for long: slow
backends (Kubernetes API) retry in their own threads. It never acts on an invalid
decision (`Decision.valid` False means "leave the fleet as it is").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import structlog

from controller.types import Decision


@runtime_checkable
class Actuator(Protocol):
    """Applies a tick's decisions (one per model)."""

    def apply(self, decisions: Sequence[Decision]) -> None:
        """Apply `decisions`; invalid ones are skipped. Must not raise for one model's
        failure: report it (log, metrics) and go on with the others."""
        ...


class LogActuator:
    """Writes each valid decision as a structured log line; changes nothing."""

    def __init__(self, logger: structlog.typing.FilteringBoundLogger | None = None) -> None:
        self._log = logger or structlog.get_logger("actuator.log")
        self.applied: list[Decision] = []

    def apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if not d.valid:
                continue
            self.applied.append(d)
            self._log.info(
                "actuate",
                model=d.model,
                replicas=d.replicas,
                max_num_seqs=d.knobs.max_num_seqs,
                max_num_batched_tokens=d.knobs.max_num_batched_tokens,
            )
