"""What `governor status` reports, as plain data (no protobuf): ServiceCore.status
builds it, the admin API turns it into GetStatusResponse (service.convert)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from actuators.publisher import Published
from controller.types import Decision
from estimators.types import NoDataError, Observation, SourceError


@dataclass(frozen=True, slots=True)
class ModelStatusView:
    """Everything GetStatus reports about one model (plain data, no protobuf)."""

    model: str
    paused: bool
    observation: Observation | NoDataError | SourceError | None
    decision: Decision | None
    published: Published
    engines_seen: int
    actuation: str


@dataclass(frozen=True, slots=True)
class StatusView:
    models: tuple[ModelStatusView, ...]
    instance: str
    leader: bool
    leader_identity: str
    last_tick_unix_s: float | None
    store: str
    targets_revision: str
    targets_problem: str


def actuation_texts(actuators: Iterable[object]) -> dict[str, str]:
    """model -> what the actuators with a `status()` (model -> outcome, with or without
    a `describe()`) say of its last actuation; several (scale, roll-out, drain) joined
    by "; "."""
    out: dict[str, str] = {}
    for act in actuators:
        status_fn = getattr(act, "status", None)
        if callable(status_fn):
            for model, st in status_fn().items():
                describe = getattr(st, "describe", None)
                text = describe() if callable(describe) else str(st)
                out[model] = "; ".join(filter(None, (out.get(model), text)))
    return out
