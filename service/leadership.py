"""What this instance's leadership means for its actuators and its memory (the Lease
itself: service.leader). Used by `service.core.ServiceCore`.

- `wire_write_checks`: every actuator that takes one (`set_write_check`: the queued
  Kubernetes actuators, the KEDA-mode drain) asks the elector's `is_leader` before each
  API call. `is_leader` is deadline-based (it turns False `renew_deadline_s` after the
  last renewal even if the elector thread hangs), so a demoted leader's workers stop
  writing as the lease lapses, not only when the next tick calls `stand_down`.
- `stand_down`: the tick that finds the leadership lost makes every actuator forget
  what it still meant to write.
- `takeover_states`: a new leader continues from the last leader's saved state.
- `saved_states`: the saved model states a decider continues from, at start-up (strict:
  an invalid one refuses the start) and at a takeover (an invalid one is left out).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from controller.config import GovernorConfig
from controller.loop import Clock
from controller.types import ModelState
from service.store import StateDoc, Store, StoreError, from_wall, restore_offset


def wire_write_checks(actuators: Iterable[Any], may_write: Callable[[], bool]) -> None:
    """Give each actuator (or store) that has `set_write_check` the check `may_write()`."""
    for act in actuators:
        set_check = getattr(act, "set_write_check", None)
        if callable(set_check):
            set_check(may_write)


def stand_down(actuators: Iterable[Any], log: Any) -> int:
    """We just lost the leadership: the actuators forget what they still meant to write
    (QueuedActuatorBase.stand_down); the new leader decides from here. Returns how many
    intents were dropped (also logged)."""
    dropped = 0
    for act in actuators:
        fn = getattr(act, "stand_down", None)
        if callable(fn):
            dropped += fn()
    log.warning("leadership_lost", dropped_intents=dropped)
    return dropped


def saved_states(
    doc: StateDoc | None,
    clock: Clock,
    config: GovernorConfig,
    log: Any,
    *,
    strict: bool,
    where: str = "",
) -> dict[str, ModelState]:
    """The model states saved in `doc` (times in Unix seconds) of the models `config`
    holds, on this process's monotonic clock (seconds; `restore_offset`): what the
    deciders continue from, at start-up (`strict`, ServiceCore._restore) and when this
    instance becomes the leader (`takeover_states`). States of models `config` does not
    hold are left out.

    An invalid model's state (named `where: model`, or `model` without `where`): with
    `strict` a StoreError, as the service must not start with garbage; without, logged
    (`takeover_state_invalid`) and left out, so the new leader starts that model fresh.
    """
    if doc is None:
        return {}
    offset = restore_offset(clock.wall(), clock.monotonic(), doc.saved_at_unix_s)
    names = {m.name for m in config.models}
    states: dict[str, ModelState] = {}
    for name, raw in doc.models.items():
        if name not in names:
            continue
        try:
            label = f"{where}: {name}" if where else name
            states[name] = from_wall(raw, offset, label, doc.saved_at_unix_s)
        except StoreError as exc:
            if strict:
                raise
            log.error("takeover_state_invalid", model=name, error=str(exc))
    return states


def takeover_states(
    store: Store, clock: Clock, config: GovernorConfig, log: Any
) -> dict[str, ModelState]:
    """The saved model states of the configured models, on this process's monotonic
    clock: what a new leader continues from. An unreadable document (logged:
    `takeover_state_unreadable`) or an invalid model's state is left out (the new leader
    starts fresh): the service runs on (`saved_states` without `strict`)."""
    try:
        doc = store.load_state()
    except StoreError as exc:
        log.error("takeover_state_unreadable", error=str(exc))
        return {}
    return saved_states(doc, clock, config, log, strict=False)
