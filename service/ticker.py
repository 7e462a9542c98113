"""The production tick schedule: APScheduler's asyncio scheduler, one job per tick.

`TickScheduler(fn, interval_s)` runs the blocking `fn()` (ServiceCore.tick) every
`interval_s` seconds, the first run at once. The job has `max_instances=1` (a tick never
overlaps the previous one), `coalesce=True` (runs missed while a tick overran, or while
the process was starved, collapse into one) and a misfire grace of one interval (a run
later than that is dropped, and counted, instead of being run late). The job awaits
the tick on a thread of its own, so the event loop keeps serving while a tick runs.
`nice` > 0 lowers that thread's CPU priority (Linux nice, per thread): with the
listeners in a serving process (service.serving), a busy machine then gives engine and
KEDA calls the CPU before the tick, which has seconds of slack in its interval.

Lateness (`on_late(seconds)`, the histogram `governor_tick_lateness_seconds`): how long
after its scheduled time each run started, taken from APScheduler's own schedule (the
scheduled run time the executor is handed with the run). A skipped run (the previous
tick still running) and a dropped one (past the grace) count as one interval late.

Wall-clock jumps. APScheduler 3 schedules on the wall clock (its maintainer: "the
scheduler relies on the system clock being correct", agronholm/apscheduler#351): after
the clock is set back it would sleep until the wall clock catches up, and after a jump
forward one run is late by the jump. The governor must not stop ticking because NTP
stepped the clock, so a watchdog on the event loop's monotonic timer checks every
interval: when the wall clock was set back (wall minus monotonic time fell), or no run
started for two intervals, and none is running, it moves the job's next run to one
interval after the last start on the monotonic clock, or now if that has passed (and
logs the stall). A lateness is
capped at the monotonic time since the previous run started, so a jump forward reads
as at most one interval late, not as the size of the jump.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger

JOB_ID = "governor-tick"


class EveryInterval(BaseTrigger):  # type: ignore[misc]
    """Fires every `interval_s` seconds on the grid of the first run, like APScheduler's
    interval trigger, but never builds a backlog: when the next grid time is more than
    one interval behind `now` (a jump of the wall clock forward, a long stall), the next
    fire time is `now`. APScheduler enumerates every missed fire time before coalescing
    them, on the event loop: after a 1 h jump at a 0.05 s interval that was 72,000 of
    them and the loop was blocked for 3 s (measured with its interval trigger)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.interval = timedelta(seconds=interval_s)

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime:
        if previous_fire_time is None:
            return now
        nxt = previous_fire_time + self.interval
        return nxt if nxt > now - self.interval else now

    def __str__(self) -> str:
        return f"every {self.interval_s} s"


class TickScheduler:
    """Runs `fn()` every `interval_s` seconds on APScheduler's AsyncIOScheduler (see
    the module doc). `start()` must be called from the running event loop."""

    def __init__(
        self,
        fn: Callable[[], Any],
        interval_s: float,
        logger: Any,
        on_late: Callable[[float], None] | None = None,
        on_stall: Callable[[], None] | None = None,
        nice: int = 0,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"tick interval must be > 0 s (got {interval_s})")
        self.fn = fn
        self.interval_s = interval_s
        self.log = logger
        self.on_late = on_late
        self.on_stall = on_stall
        self.nice = nice
        self._pool: ThreadPoolExecutor | None = None
        self._scheduler: Any = None
        self._watchdog: Any = None
        self._lock = threading.Lock()
        self._scheduled: datetime | None = None  # of the run submitted last
        self._last_start_mono: float | None = None
        self._offset: float | None = None  # wall - monotonic at the last watchdog check
        self._running = False
        self._idle = threading.Event()
        self._idle.set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        ticker = self

        class _Executor(AsyncIOExecutor):  # type: ignore[misc]
            """The asyncio executor, noting each run's scheduled time before it starts."""

            def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
                with ticker._lock:
                    ticker._scheduled = run_times[-1]
                super()._do_submit_job(job, run_times)

        loop = asyncio.get_running_loop()
        self._scheduler = AsyncIOScheduler(
            event_loop=loop, timezone=UTC, executors={"default": _Executor()}
        )
        self._scheduler.add_listener(self._on_skipped, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix="governor-tick", initializer=self._lower_priority
        )
        self._scheduler.add_job(
            self._run_on_thread,
            EveryInterval(self.interval_s),
            id=JOB_ID,
            next_run_time=datetime.now(UTC),
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, round(self.interval_s)),
        )
        self._scheduler.start()
        self._watchdog = loop.call_later(self.interval_s, self._check, loop)

    def stop(self) -> None:
        """No new runs (call on the event loop); a running tick goes on (`wait_idle`)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # a running tick goes on (`wait_idle`)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no tick runs (at most `timeout_s` seconds); whether none does."""
        return self._idle.wait(timeout_s)

    # ------------------------------------------------------------------ the job
    def _on_skipped(self, event: Any) -> None:
        self.log.warning("tick_skipped", scheduled=str(getattr(event, "scheduled_run_time", "")))
        if self.on_late is not None:
            with contextlib.suppress(Exception):
                self.on_late(self.interval_s)

    def _lower_priority(self) -> None:
        """The tick thread's initializer: nice it by `nice` (Linux: per thread)."""
        if self.nice <= 0:
            return
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + self.nice)
        except OSError as exc:
            self.log.warning("tick_priority_unchanged", nice=self.nice, error=str(exc))

    async def _run_on_thread(self) -> None:
        """The job: one tick on the tick thread (the job runs until the tick ends, so
        `max_instances=1` holds)."""
        assert self._pool is not None
        await asyncio.get_running_loop().run_in_executor(self._pool, self._run)

    def _run(self) -> None:
        """The job: one tick (in the loop's thread pool), its lateness reported first."""
        start_mono = time.monotonic()
        with self._lock:
            scheduled, previous = self._scheduled, self._last_start_mono
            self._last_start_mono = start_mono
            self._running = True
            self._idle.clear()
        try:
            if self.on_late is not None and scheduled is not None:
                late = max(0.0, (datetime.now(UTC) - scheduled).total_seconds())
                if previous is not None:  # a wall jump forward is not a late tick
                    late = min(late, max(0.0, start_mono - previous))
                with contextlib.suppress(Exception):
                    self.on_late(late)
            try:
                self.fn()
            except Exception as exc:
                self.log.error("tick_failed", error=repr(exc))
        finally:
            with self._lock:
                self._running = False
                self._idle.set()

    def _check(self, loop: Any) -> None:
        """Watchdog (event loop, monotonic): restart a schedule the wall clock stalled,
        at once when the wall clock was seen set back, else after two idle intervals."""
        with self._lock:
            last, running = self._last_start_mono, self._running
        now_mono = time.monotonic()
        offset = datetime.now(UTC).timestamp() - now_mono  # wall - monotonic, seconds
        set_back = self._offset is not None and offset < self._offset - self.interval_s / 2
        self._offset = offset
        idle_long = last is not None and now_mono - last > 2 * self.interval_s
        stalled = not running and (set_back or idle_long)
        if stalled and self._scheduler is not None and self._scheduler.running:
            self.log.warning(
                "tick_schedule_stalled",
                seconds=round(now_mono - last, 3) if last is not None else None,
                wall_clock_set_back=set_back,
            )
            if self.on_stall is not None:
                with contextlib.suppress(Exception):
                    self.on_stall()
            # the run that was due one interval after the last start (now, if overdue)
            due_in = 0.0 if last is None else max(0.0, last + self.interval_s - now_mono)
            with contextlib.suppress(Exception):
                self._scheduler.modify_job(
                    JOB_ID, next_run_time=datetime.now(UTC) + timedelta(seconds=due_in)
                )
        self._watchdog = loop.call_later(self.interval_s, self._check, loop)
