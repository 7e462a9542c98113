"""Engines seen (GetStatus engines_seen, service.engines_seen): an engine not seen for
`ENGINE_EXPIRY_S` is forgotten, a removed model's engines are dropped, in the governor
and in the serving process; an engine that keeps asking, or holds a watch stream, stays
counted. Fake clocks throughout: nothing here waits for time to pass."""

from __future__ import annotations

import asyncio
import threading
from multiprocessing import Pipe
from typing import Any

from actuators.engines import SEEN_REFRESH_S, BatchingServicer
from actuators.publisher import DecisionBoard
from governor_api import governor_v1_pb2 as pb
from service.core import ServiceCore
from service.engines_seen import ENGINE_EXPIRY_S, REPORT_REFRESH_S, EngineTracker
from service.publications import slots
from service.serving import board_messages
from service.serving_child import _read_feed, _Reporter
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger


def _core() -> ServiceCore:
    cfg = make_config(model_entry("a"), model_entry("b"))
    return ServiceCore(
        cfg, FakeSource({"a": 5.0, "b": 5.0}), MemoryStore(), clock=FakeClock(),
        logger=quiet_logger(),
    )  # fmt: skip


def _seen(core: ServiceCore) -> dict[str, int]:
    return {m.model: m.engines_seen for m in core.status().models}


def test_engines_not_seen_for_the_expiry_are_no_longer_counted() -> None:
    core = _core()
    clock: FakeClock = core.clock  # type: ignore[assignment]
    for i in range(3):
        core.record_engine("a", f"old-{i}")
    clock.advance(ENGINE_EXPIRY_S / 2)
    core.record_engine("a", "new")
    core.record_engine("a", "old-0")  # asked again: counted from now
    core.record_engine("b", "b-1")
    assert _seen(core) == {"a": 4, "b": 1}
    clock.advance(ENGINE_EXPIRY_S / 2 + 1)
    assert _seen(core) == {"a": 2, "b": 1}  # old-1, old-2 expired
    clock.advance(ENGINE_EXPIRY_S)
    assert _seen(core) == {"a": 0, "b": 0}
    assert core._engines.tracked() == 0  # forgotten, not only left out of the count


def test_a_removed_models_engines_are_dropped() -> None:
    core = _core()
    for i in range(5):
        core.record_engine("b", f"b-{i}")
    core.record_engine("a", "a-1")
    assert _seen(core) == {"a": 1, "b": 5}
    core.delete_target("b")
    assert _seen(core) == {"a": 1}
    core.set_target(model_entry("b"))  # added again: none of the old engines counted
    assert _seen(core) == {"a": 1, "b": 0}
    assert core._engines.tracked() == 1  # b's 5 gone at once, not after the expiry


def test_a_full_model_takes_new_engines_again_once_old_ones_expire() -> None:
    clock = FakeClock()
    tracker = EngineTracker(clock.monotonic, max_per_model=2)
    assert tracker.record("a", "e1") and tracker.record("a", "e2")
    assert not tracker.record("a", "e3")  # full
    assert tracker.record("a", "e1")  # one already held is refreshed
    clock.advance(ENGINE_EXPIRY_S + 1)
    assert tracker.record("a", "e3")
    assert tracker.count("a") == 1
    assert not tracker.record("a", "")


def test_the_serving_process_reports_an_engine_again_and_forgets_expired_ones() -> None:
    """The serving process reports an engine when it first asks and again after
    `REPORT_REFRESH_S` (so the governor keeps counting it), not on every call; an
    engine that stopped asking is forgotten there too."""
    clock = FakeClock()
    ours, _theirs = Pipe()
    reporter = _Reporter(ours, threading.Lock(), clock=clock.monotonic)
    reporter.engine("a", "e1")
    reporter.engine("a", "e1")
    clock.advance(REPORT_REFRESH_S - 1)
    reporter.engine("a", "e1")
    assert reporter._new == [("a", "e1")]
    clock.advance(1)
    reporter.engine("a", "e1")
    reporter.engine("a", "gone")
    assert reporter._new == [("a", "e1"), ("a", "e1"), ("a", "gone")]
    clock.advance(ENGINE_EXPIRY_S / 2)
    reporter.engine("a", "e1")
    clock.advance(ENGINE_EXPIRY_S / 2 + 1)
    assert reporter.engines.count("a") == 1  # "gone" expired, e1 asked meanwhile


def test_the_serving_process_forgets_a_removed_models_engines() -> None:
    cfg = make_config(model_entry("a"), model_entry("b"))
    board = DecisionBoard()
    board.configure(slots(cfg))
    reporter = _Reporter(Pipe()[0], threading.Lock(), clock=FakeClock().monotonic)
    reporter.engine("a", "a-1")
    reporter.engine("b", "b-1")
    feed, parent = Pipe()
    kept = {m: p for m, p in board.snapshot().items() if m == "a"}
    for message in board_messages(kept, {s.name: s for s in slots(cfg)[:1]}, ["b"]):
        parent.send(message)
    parent.close()  # the feed ends after the change

    class _Loop:
        def call_soon_threadsafe(self, *args: Any) -> None:
            pass

    _read_feed(feed, board, _Loop(), lambda grace_s: None, reporter)  # type: ignore[arg-type]
    assert board.models() == ["a"]
    assert reporter.engines.tracked() == 1 and reporter.engines.count("b") == 0


def test_an_engine_holding_a_watch_stream_is_told_again_while_it_is_open() -> None:
    """A watch stream asks once; its engine is told again every `SEEN_REFRESH_S` (the
    waits injected: released by the test) until the stream ends."""
    seen: list[tuple[str, str]] = []

    async def run() -> tuple[list[float], int]:
        board = DecisionBoard()
        board.configure(slots(make_config(model_entry("a"))))
        gate: asyncio.Queue[None] = asyncio.Queue()
        waits: list[float] = []

        async def sleep(s: float) -> None:
            waits.append(s)
            await gate.get()

        async def settle() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        servicer = BatchingServicer(board, on_engine=lambda m, e: seen.append((m, e)), sleep=sleep)
        request = pb.GetBatchingConfigRequest(model="a", engine_id="e1")
        stream = servicer.WatchBatchingConfig(request, None)  # type: ignore[arg-type]
        first = await stream.__anext__()
        assert first.model == "a"
        await settle()
        assert seen == [("a", "e1")]
        for n in (2, 3):
            gate.put_nowait(None)
            await settle()
            assert len(seen) == n
        await stream.aclose()  # the stream ends: no more
        gate.put_nowait(None)
        await settle()
        return waits, len(seen)

    waits, told = asyncio.run(run())
    assert told == 3 and seen == [("a", "e1")] * 3
    assert waits == [SEEN_REFRESH_S] * 3
