"""Errors of the service layer."""

from __future__ import annotations

import grpc

from service.security import clip


class AdminError(Exception):
    """An admin request that cannot be done; nothing was changed."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = clip(message)
        super().__init__(f"{code.name}: {self.message}")


class SimulatorUnavailableError(Exception):
    """`--simulated-fleet` was asked for but the simulator cannot provide a fleet."""
