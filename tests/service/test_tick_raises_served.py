"""A leader's tick that raises after the board was held (`DecisionBoard.hold`, so the
tick's values are served after its save) still serves what it decided: found in review,
a save raising something other than a StoreError left the board held, and engines and
KEDA kept the old values for as long as it kept raising."""

from __future__ import annotations

import pytest

from service.core import ServiceCore
from service.store import MemoryStore, StateDoc
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger


class _RaisingStore(MemoryStore):
    """A store whose save raises an unexpected error (not a StoreError) once armed."""

    armed = False

    def save_state(self, doc: StateDoc) -> None:
        if self.armed:
            raise RuntimeError("unexpected (not a StoreError)")
        super().save_state(doc)


def test_a_tick_that_raises_is_served_not_left_held() -> None:
    config = make_config(model_entry("demo"), knob_sustain_s=0, cooldown_after_scale_up_s=0)
    source, clock, store = FakeSource({"demo": 20.0}), FakeClock(), _RaisingStore()
    core = ServiceCore(config, source, store, clock=clock, logger=quiet_logger())
    core.tick(clock.advance(5))
    before = core.board.get("demo").replicas
    store.armed = True
    source.set("demo", 200.0)
    for _ in range(3):
        with pytest.raises(RuntimeError):
            core.tick(clock.advance(5))
    assert not core.board.holding
    served = core.board.get("demo")
    assert served.replicas > before
    assert served == core.board.pending()["demo"]
