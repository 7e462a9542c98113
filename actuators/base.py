"""The log-only actuator (the `Actuator` protocol itself is `controller.actuation`)."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from controller.types import Decision


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
