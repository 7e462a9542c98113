"""Only the leader saves the state, checked right before each save: a tick or a flush
that lost the leadership while it ran (the lease lapsed, or shutdown's `close()`
released it) skips its save instead of writing over the new leader's state. The held
tick waits on events, not on time."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from estimators.types import ModelQuery
from service.core import ServiceCore
from service.leader import AlwaysLeader
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger


class _Elector(AlwaysLeader):
    """Leads until `stop()` releases the lease, or once `answers` yeses are used up
    (None: no limit)."""

    def __init__(self, identity: str, answers: int | None = None) -> None:
        super().__init__(identity)
        self.leader = True
        self.answers = answers

    def is_leader(self) -> bool:
        if self.answers is not None:
            self.answers -= 1
            return self.leader and self.answers >= 0
        return self.leader

    def stop(self, release: bool = True) -> None:
        self.leader = False


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


def _core(store: MemoryStore, source: FakeSource, elector: _Elector, clock: FakeClock) -> Any:
    return ServiceCore(
        make_config(model_entry("demo")),
        source,
        store,
        clock=clock,
        elector=elector,
        logger=quiet_logger(),
    )


def test_a_tick_in_flight_at_shutdown_does_not_save_over_the_new_leader() -> None:
    """A's tick is held (a slow Prometheus); shutdown closes A (the lease released); B
    leads and saves; A's tick then ends: the stored state stays B's."""
    clock, store = FakeClock(), MemoryStore()
    source = HeldSource({"demo": 40.0})
    a = _core(store, source, _Elector("a"), clock)
    a.tick(clock.monotonic())
    source.hold = True
    ticking = threading.Thread(target=a.tick, args=(clock.advance(5),))
    ticking.start()
    try:
        assert source.entered.wait(30)
        a.close()  # graceful shutdown: stand down, release the lease
        b = _core(store, FakeSource({"demo": 80.0}), _Elector("b"), clock)
        b.tick(clock.monotonic())
        saved = store.load_state()
        assert saved is not None and saved.leader == "b"
    finally:
        source.release.set()
        ticking.join(30)
    assert not ticking.is_alive()
    after = store.load_state()
    assert after is not None and after.leader == "b"
    assert after.saved_at_unix_s == saved.saved_at_unix_s


def test_a_flush_that_lost_the_leadership_does_not_save() -> None:
    """The lease lapses right after flush's first check (one yes left)."""
    clock, store = FakeClock(), MemoryStore()
    elector = _Elector("a")
    a = _core(store, FakeSource({"demo": 40.0}), elector, clock)
    a.tick(clock.monotonic())
    first = store.load_state()
    assert first is not None
    clock.advance(5)
    elector.answers = 1
    a.flush()
    last = store.load_state()
    assert last is not None and last.saved_at_unix_s == first.saved_at_unix_s


def test_a_demoted_leader_whose_last_save_failed_never_serves_an_older_generation() -> None:
    """Found in review (real gRPC there; the board here): A published a tick with new
    knobs (an SLA edit), the state write failed (API trouble) and A lost the lease. As a
    follower A mirrors the store's older value: it must not serve a lower generation or
    reuse its number for other knobs (engines apply whatever arrives last)."""
    from service.store import StoreError

    class FlakyStore(MemoryStore):
        fail_next = False

        def save_state(self, doc: Any) -> None:
            if self.fail_next:
                self.fail_next = False
                raise StoreError("state write: 503")
            super().save_state(doc)

    policy = {"knob_sustain_s": 0, "cooldown_after_scale_up_s": 0}
    clock, store, elector = FakeClock(), FlakyStore(), _Elector("a")
    a = ServiceCore(
        make_config(model_entry("demo"), **policy), FakeSource({"demo": 20.0}), store,
        clock=clock, elector=elector, logger=quiet_logger(),
    )  # fmt: skip
    a.tick(clock.advance(5))
    doc = store.load_state()
    assert doc is not None
    saved = doc.published["demo"]
    saved_knobs = (saved.max_num_seqs, saved.max_num_batched_tokens)
    a.set_target({**model_entry("demo"), "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 10}})
    store.fail_next = True
    a.tick(clock.advance(5))
    served = a.board.get("demo")
    assert (served.knobs.max_num_seqs, served.knobs.max_num_batched_tokens) != saved_knobs
    elector.leader = False
    a.tick(clock.advance(5))  # a follower now: mirrors the store's older value
    after = a.board.get("demo")
    assert after.generation > served.generation
    assert (after.knobs.max_num_seqs, after.knobs.max_num_batched_tokens) == saved_knobs
