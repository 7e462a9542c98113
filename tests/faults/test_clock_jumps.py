"""Wall-clock jumps (NTP steps, an operator setting the date, a VM resumed): the loop's
windows run on the monotonic clock, so a jump of the wall clock must change nothing the
governor does. Fake clocks whose wall time jumps independently of monotonic time; no
sleeps except the ticker case, which runs the real APScheduler ticker for 20 ticks (about
a second) while the wall clock it reads jumps."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest

from service.core import ServiceCore
from service.leader import LeaseElector
from service.store import FileStore
from service.ticker import TickScheduler
from tests.faults.helpers import JumpClock
from tests.service.fake_kube import FakeKubeAPI
from tests.service.fakes import FakeSource, make_config, model_entry, quiet_logger

POLICY: dict[str, Any] = {
    "scale_down_stabilization_s": 120,
    "cooldown_after_scale_up_s": 30,
    "burst_memory_half_life_s": 0,
    "knob_sustain_s": 0,
}
HOUR = 3600.0
# (tick index, wall jump in seconds): forward an hour, back two, forward a day, back a day
JUMPS = {10: HOUR, 25: -2 * HOUR, 40: 86_400.0, 55: -86_400.0, 70: 37.5}
TICKS = 20  # real ticks of the ticker case, 0.05 s apart


def _rate(i: int) -> float:
    return 120.0 if i < 20 else (8.0 if i < 60 else 90.0)


def _run(tmp: Path, jumps: dict[int, float]) -> list[tuple[int, tuple[str, ...]]]:
    clock = JumpClock()
    source = FakeSource({"demo": _rate(0)})
    core = ServiceCore(
        make_config(model_entry("demo"), **POLICY),
        source,
        FileStore(tmp / "state.json"),
        clock=clock,
        logger=quiet_logger(),
    )
    out = []
    for i in range(90):
        if i in jumps:
            clock.jump(jumps[i])
        source.set("demo", _rate(i))
        d = core.tick(clock.advance(5))[0]
        out.append((d.replicas, tuple(f"{s.name}:{s.reason}" for s in d.stages)))
    return out


def _actions(replicas: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(replicas) if a != b)


@pytest.mark.fault_case(
    "Clock",
    "wall clock jumps +1 h, -2 h, +1 day, -1 day while running (90 ticks, load up/down/up)",
    "every decision (replicas and each stage's reason code) identical to the same run "
    "without jumps: no burst of actions, no window cut short or stretched",
)
def test_wall_jumps_change_no_decision(tmp_path: Path, fault_note: Any) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    steady = _run(tmp_path / "a", {})
    jumped = _run(tmp_path / "b", JUMPS)
    assert jumped == steady
    replicas = [r for r, _ in steady]
    assert max(replicas) > min(replicas)  # the run did scale both ways
    fault_note(f"{len(JUMPS)} jumps, 90 ticks, {_actions(replicas)} actions in both runs")


@pytest.mark.fault_case(
    "Clock",
    "wall clock set back 2 h while the governor was down, then restarted",
    "restored state is not put 2 h into the future: no scale-down inside the "
    "stabilization window (120 s), and the scale-down comes after it, not 2 h later",
)
def test_restart_after_the_clock_went_back(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    clock = JumpClock(mono=5_000.0)
    source = FakeSource({"demo": 120.0})
    cfg = make_config(model_entry("demo"), **POLICY)
    core = ServiceCore(cfg, source, FileStore(path), clock=clock, logger=quiet_logger())
    for _ in range(12):
        core.tick(clock.advance(5))
    high = core.board.get("demo").replicas
    assert high is not None and high >= 5
    saved_wall = clock.wall()
    del core  # killed
    # 20 s later, but the wall clock was set back 2 h meanwhile; new process: mono 30
    clock2 = JumpClock(mono=30.0, wall_origin=saved_wall + 20.0 - 30.0 - 2 * HOUR)
    source.set("demo", 2.0)
    core2 = ServiceCore(cfg, source, FileStore(path), clock=clock2, logger=quiet_logger())
    assert core2.board.get("demo").replicas == high
    held_s = 0.0
    while core2.board.get("demo").replicas == high and held_s < 2 * HOUR:
        core2.tick(clock2.advance(5))
        held_s += 5
    assert held_s >= 120 - 20, f"scaled down {held_s:.0f}s after the restart"
    assert held_s <= 300, f"held {held_s:.0f}s: the restored windows were stretched"


class _JumpingDatetime(datetime):
    """`datetime` whose `now()` is off by `offset[0]` seconds: the wall clock as
    APScheduler (and the ticker's lateness) read it, jumping."""

    offset: ClassVar[list[float]] = [0.0]

    @classmethod
    def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
        return datetime.now(tz) + timedelta(seconds=cls.offset[0])


@pytest.mark.fault_case(
    "Clock",
    "the wall clock jumping +-1 h every 0.1 s under the real APScheduler ticker",
    "ticks keep their interval (a stalled schedule is restarted on the monotonic clock): "
    "no burst of ticks, none missed for long, lateness never the size of a jump",
)
def test_ticker_ignores_wall_jumps(monkeypatch: pytest.MonkeyPatch) -> None:
    import apscheduler.executors.base
    import apscheduler.schedulers.base
    import apscheduler.triggers.interval

    import service.ticker

    for module in (
        apscheduler.schedulers.base,
        apscheduler.executors.base,
        apscheduler.triggers.interval,
        service.ticker,
    ):
        monkeypatch.setattr(module, "datetime", _JumpingDatetime)
    _JumpingDatetime.offset[0] = 0.0
    ticks: list[float] = []
    lateness: list[float] = []
    jumps: list[float] = []
    stop = threading.Event()

    def jumper() -> None:
        sign = 1.0
        while not stop.wait(0.1):
            _JumpingDatetime.offset[0] += sign * HOUR
            jumps.append(time.monotonic())
            sign = -sign * 2 if abs(sign) < 4 else -1.0

    async def run() -> None:
        ticker = TickScheduler(
            lambda: ticks.append(time.monotonic()), 0.05, quiet_logger(), on_late=lateness.append
        )
        threading.Thread(target=jumper, daemon=True).start()
        ticker.start()
        # Until TICKS ticks ran (polled: a condition, not a duration). A starved process
        # runs fewer ticks per second (missed ones coalesce, by design), so the count is
        # never judged against the elapsed time; a schedule stalled by a jump never
        # gets there (a backward jump of an hour would hold it for the hour).
        deadline = time.monotonic() + 30.0
        while len(ticks) < TICKS and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        ticker.stop()
        assert await asyncio.to_thread(ticker.wait_idle, 30.0)

    try:
        asyncio.run(run())
    finally:
        stop.set()
    assert len(ticks) >= TICKS, f"the schedule stalled: {len(ticks)} ticks in 30 s"
    during = [j for j in jumps if ticks[0] < j < ticks[TICKS - 1]]
    assert len(during) >= 3, f"only {len(during)} jumps while it ticked"
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    # Ticks sit on a 0.05 s grid: a tick started late by the thread pool and the next one
    # on time may be 0.02 s apart on a loaded machine; a burst (coalescing failed) would
    # run ticks back to back, well under 5 ms apart. The upper bounds are far below the
    # jumps (an hour and more) and far above what a loaded machine delays a tick.
    assert min(gaps) > 0.005, "a burst of ticks"
    assert max(gaps) < 10.0, "the schedule stalled"
    assert max(lateness) < 30.0, "a wall jump read as a late tick"


@pytest.mark.fault_case(
    "Clock",
    "wall clock jumps on both candidates of the Lease election",
    "the leader keeps the Lease (renewals are judged on the monotonic clock), the "
    "follower never takes over while it renews, never two leaders",
)
def test_lease_survives_wall_jumps() -> None:
    with FakeKubeAPI() as api:
        from actuators.kubeapi import api_client

        ca, cb = JumpClock(), JumpClock()

        def elector(identity: str, c: JumpClock) -> LeaseElector:
            return LeaseElector(
                api_client(api.url),
                "llm",
                "governor-leader",
                identity,
                monotonic=c.monotonic,
                wall=c.wall,
                # generous: a read slower than a short timeout under load is a renewal
                # the fake clocks believe happened (tests/service/test_kubernetes.py)
                request_timeout_s=30.0,
                logger=quiet_logger(),
            )

        a, b = elector("a", ca), elector("b", cb)
        assert a.step() is True and b.step() is False
        for i in range(20):
            for c in (ca, cb):
                c.advance(2)
            if i % 3 == 0:
                ca.jump(HOUR * (1 if i % 2 else -1))
            if i % 4 == 0:
                cb.jump(-HOUR * 3 if i % 2 else HOUR * 5)
            assert a.step() is True, f"step {i}: the leader lost the Lease"
            assert b.step() is False, f"step {i}: the follower took over"
            assert not (a.is_leader() and b.is_leader())
