"""A tick runs under one target set: an SLA/knob edit that arrives while a tick is in
flight is applied after that tick, so the board never goes back to the old knobs once it
has shown the new ones.

Seen on a real vLLM engine (tests/engine): a tick that began under `max_num_seqs` 32 and
ended after SetTarget lowered it to 4 published 32 once more (4 -> 32 -> 4 within 3 s).
Here the tick is held inside `observe` by the test (events, no timing), the edit is made
from another thread, and the board's publications are recorded in order.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from estimators.types import ModelQuery
from service.core import ServiceCore
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger


class HeldSource(FakeSource):
    """A FakeSource whose next `observe` waits until the test releases it."""

    def __init__(self, rates: dict[str, float | None]) -> None:
        super().__init__(rates)
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, Any]:
        if self.hold:
            self.hold = False
            self.entered.set()
            assert self.release.wait(30), "test never released the held tick"
        return super().observe(models, now_s)


def _static(seqs: int) -> dict[str, Any]:
    return model_entry(
        "demo",
        batching_policy="static",
        knobs={
            "default_max_num_seqs": seqs,
            "max_num_seqs_min": 1,
            "default_max_num_batched_tokens": 2048,
        },
    )


def test_edit_during_a_tick_never_republishes_the_old_knobs() -> None:
    clock = FakeClock()
    source = HeldSource({"demo": 5.0})
    core = ServiceCore(
        make_config(_static(32)), source, MemoryStore(), clock=clock, logger=quiet_logger()
    )
    seen: list[int] = []
    core.board.subscribe(lambda: seen.append(core.board.get("demo").knobs.max_num_seqs))
    core.tick()
    clock.advance(5.0)
    assert core.board.get("demo").knobs.max_num_seqs == 32

    source.hold = True
    ticker = threading.Thread(target=core.tick)
    ticker.start()
    assert source.entered.wait(30), "the tick never reached observe"
    editor = threading.Thread(target=core.set_target, args=(_static(4),))
    editor.start()
    source.release.set()
    ticker.join(30)
    editor.join(30)
    assert not ticker.is_alive() and not editor.is_alive()
    clock.advance(5.0)
    core.tick()

    assert core.board.get("demo").knobs.max_num_seqs == 4
    first_new = seen.index(4)
    assert 32 not in seen[first_new:], f"old knobs published after the new ones: {seen}"
