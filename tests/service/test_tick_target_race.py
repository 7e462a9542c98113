"""A tick decides under one target set, and an edit never waits for the tick's queries.

An SLA/knob edit that arrives while a tick decides is applied after that tick, so the
board never goes back to the old knobs once it has shown the new ones. Seen on a real
vLLM engine (tests/engine): a tick that began under `max_num_seqs` 32 and ended after
SetTarget lowered it to 4 published 32 once more (4 -> 32 -> 4 within 3 s).

An edit that arrives while the tick still reads the metrics goes through at once, and
that tick decides under it: a CI run's SetTarget waited past its 10 s deadline behind a
tick that held the lock through slow Prometheus queries.

The tick is held inside `observe` (the source) or inside its decision by the test
(events, no timing), the edit is made from another thread, and the board's
publications are recorded in order.
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


def _core(source: HeldSource) -> tuple[ServiceCore, FakeClock, list[int]]:
    """A core at static knobs 32, ticked once; `seen`: every max_num_seqs published."""
    clock = FakeClock()
    core = ServiceCore(
        make_config(_static(32)),
        source,
        MemoryStore(),
        clock=clock,
        logger=quiet_logger(),
    )
    seen: list[int] = []
    core.board.subscribe(lambda: seen.append(core.board.get("demo").knobs.max_num_seqs))
    core.tick()
    clock.advance(5.0)
    assert core.board.get("demo").knobs.max_num_seqs == 32
    return core, clock, seen


def test_edit_while_a_tick_decides_waits_for_it_and_is_never_undone() -> None:
    """The tick is held inside its decision (after it read the targets, before the board
    took the decision): the edit waits for the tick, then applies over its decision."""
    core, clock, seen = _core(HeldSource({"demo": 5.0}))
    entered, release = threading.Event(), threading.Event()
    decide = core.loop._decide_model

    def held_decide(*args: Any) -> Any:
        entered.set()
        assert release.wait(30), "test never released the held tick"
        return decide(*args)

    core.loop._decide_model = held_decide  # type: ignore[method-assign]
    ticker = threading.Thread(target=core.tick)
    ticker.start()
    assert entered.wait(30), "the tick never reached its decision"
    editor = threading.Thread(target=core.set_target, args=(_static(4),))
    editor.start()
    release.set()
    ticker.join(30)
    editor.join(30)
    assert not ticker.is_alive() and not editor.is_alive()
    core.loop._decide_model = decide  # type: ignore[method-assign]
    # the edit returned: the board serves it, not the held tick's decision under 32
    assert core.board.get("demo").knobs.max_num_seqs == 4, seen
    clock.advance(5.0)
    core.tick()

    assert core.board.get("demo").knobs.max_num_seqs == 4
    first_new = seen.index(4)
    assert 32 not in seen[first_new:], f"old knobs published after the new ones: {seen}"


def test_edit_while_a_tick_reads_metrics_goes_through_and_that_tick_decides_under_it() -> None:
    source = HeldSource({"demo": 5.0})
    core, _clock, seen = _core(source)

    source.hold = True
    ticker = threading.Thread(target=core.tick)
    ticker.start()
    assert source.entered.wait(30), "the tick never reached observe"
    editor = threading.Thread(target=core.set_target, args=(_static(4),))
    editor.start()
    editor.join(30)
    held = not editor.is_alive()  # decided before the tick is released
    source.release.set()
    ticker.join(30)
    assert held, "the edit waited for the tick's queries"
    assert not ticker.is_alive()

    assert core.board.get("demo").knobs.max_num_seqs == 4  # the held tick's own decision
    first_new = seen.index(4)
    assert 32 not in seen[first_new:], f"old knobs published after the new ones: {seen}"
