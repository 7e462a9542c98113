"""A tick's new generation is served only once the state holding it is saved: a process
killed between the tick and its save restarts at a generation no client saw go back.
Fake clock and source, the real FileStore and ServiceCore; no sleeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from actuators.publisher import Published
from service.core import ServiceCore
from service.store import FileStore, StateDoc
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger

POLICY = {"knob_sustain_s": 0, "cooldown_after_scale_up_s": 0}


class _Killed(BaseException):
    """The process died here (nothing after it runs, nothing catches it)."""


class _DyingStore(FileStore):
    """A FileStore whose process is killed during the first save that would store a new
    generation of `model`, before that save reaches the file; `served` records what the
    board served engines at that instant (what GetBatchingConfig answers, and what the
    serving process's feed reads)."""

    def __init__(self, path: Path, model: str) -> None:
        super().__init__(path)
        self.model = model
        self.core: ServiceCore | None = None
        self.served: Published | None = None

    def save_state(self, doc: StateDoc) -> None:
        stored = self.load_state()
        before = stored.published[self.model].generation if stored else 0
        if self.core is not None and doc.published[self.model].generation > before:
            self.served = self.core.board.get(self.model)
            raise _Killed
        super().save_state(doc)


def test_a_generation_served_before_a_kill_is_not_taken_back_by_the_restart(
    tmp_path: Path,
) -> None:
    """Found in review: the tick put its new knobs (a new generation) on the board, the
    serving side answered with them, and the process was killed before the state holding
    them was saved; the restart served the stored, older generation."""
    path = tmp_path / "state.json"
    config = make_config(model_entry("demo"), **POLICY)
    source, clock = FakeSource({"demo": 20.0}), FakeClock()
    store = _DyingStore(path, "demo")
    core = ServiceCore(config, source, store, clock=clock, logger=quiet_logger())
    core.tick(clock.advance(5))  # new knobs (generation 1), saved
    stored = store.load_state()
    assert stored is not None and stored.published["demo"].generation == 1
    core.set_target(model_entry("demo", sla={"ttft_p95_ms": 1000, "itl_p95_ms": 10}))
    store.core = core  # the next save storing a new generation never happens
    with pytest.raises(_Killed):
        core.tick(clock.advance(5))
    seen = store.served
    assert seen is not None

    restarted = ServiceCore(
        config, source, FileStore(path), clock=FakeClock(mono=10.0), logger=quiet_logger()
    )
    after = restarted.board.get("demo")
    # Engines read a generation as "these knobs are newer than the last one": once
    # served, a generation must never be served again with other knobs, nor a lower one.
    assert after.generation >= seen.generation, (
        f"served generation {seen.generation} {seen.knobs} before the kill; the restart "
        f"serves generation {after.generation} {after.knobs}"
    )
    assert after.generation > seen.generation or after.knobs == seen.knobs
