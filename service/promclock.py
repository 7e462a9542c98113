"""Prometheus's clock, as the governor host sees it, and the source adapter that uses it.

The control loop runs on the monotonic clock; Prometheus evaluates a query at a Unix
time, and the source measures the data's staleness against that same time. Asking at
the host's wall time trusts the host's clock: a host clock behind Prometheus's (skewed,
or stepped back by NTP) evaluates queries in Prometheus's past, where old data looks
fresh; a host clock ahead evaluates them in its future, where there is no data.

`PrometheusClock` follows Prometheus's clock instead: it asks Prometheus its own now
(`PrometheusSource.server_time_s`: `time()` with no `time` parameter) and keeps the
offset `Prometheus's now - host wall` from it. The evaluation time of a tick is `host
wall + offset`. The offset is measured again

- before the first tick and after a failed measurement (no offset: the tick fails
  with SourceError, as when Prometheus is down; data is never read at a guessed time);
- every `refresh_s` (30 s) of monotonic time, so a step of Prometheus's own clock is
  followed within that;
- on the next tick after the host's wall clock steps (wall - monotonic moved by more
  than `step_tolerance_s`, 1 s; logged as `wall_clock_step` with its size, s).

Bound: the offset is taken against the host wall time read just BEFORE the probe, so
`wall + offset` is never behind Prometheus's clock (data never reads fresher than it
is); it is ahead by at most the probe's round trip (at most the query timeout), plus
the 1 s step tolerance and the clocks' drift over `refresh_s`, which reads data as that
much older (a longer staleness), never younger. A measured skew over `warn_skew_s`
(5 s) is logged as `prometheus_clock_skew` with `skew_s`, and is on /metrics as
`governor_prometheus_clock_skew_seconds`.

Units: seconds throughout; times are Unix seconds, except monotonic ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import structlog
from prometheus_client import CollectorRegistry, Gauge

from controller.loop import Clock
from estimators.types import MetricSource, SourceError

REFRESH_S: Final = 30.0
"""Monotonic seconds between measurements of the offset."""
STEP_TOLERANCE_S: Final = 1.0
"""A change of the host's wall - monotonic above this (s) is a wall clock step."""
WARN_SKEW_S: Final = 5.0
"""A skew (Prometheus's clock - the host's wall clock) above this (s) is logged."""


class PrometheusClock:
    """Prometheus's current time, Unix seconds: the host's wall time plus a measured
    offset (module doc).

    `probe()`: Prometheus's own now (Unix s); raises when it cannot be read.
    `wall()`: the host's wall clock (Unix s); `monotonic()`: its monotonic clock (s).
    """

    def __init__(
        self,
        probe: Callable[[], float],
        wall: Callable[[], float],
        monotonic: Callable[[], float],
        *,
        refresh_s: float = REFRESH_S,
        step_tolerance_s: float = STEP_TOLERANCE_S,
        warn_skew_s: float = WARN_SKEW_S,
        logger: Any = None,
    ) -> None:
        self._probe = probe
        self._wall = wall
        self._monotonic = monotonic
        self.refresh_s = refresh_s
        self.step_tolerance_s = step_tolerance_s
        self.warn_skew_s = warn_skew_s
        self.log = logger or structlog.get_logger("governor.promclock")
        self.offset_s: float | None = None
        """Prometheus's clock - the host's wall clock, s (the skew); None when the last
        measurement failed or none was made yet."""
        self.round_trip_s: float | None = None
        """The last successful probe's round trip, monotonic s (the bound's slack)."""
        self.measurements = 0
        """Probes sent (successful or not)."""
        self._measured_at = 0.0  # monotonic s of the last successful probe
        self._wall_minus_mono = 0.0  # the host's wall - monotonic then, s
        self._warned_skew: float | None = None  # the skew last logged as a warning, s

    def now_s(self) -> float:
        """Prometheus's current time, Unix s (the evaluation time of a tick); measures
        the offset first when it is due. Raises SourceError when it cannot be measured."""
        wall, mono = self._wall(), self._monotonic()
        if self.offset_s is None or mono - self._measured_at >= self.refresh_s:
            self._measure()
        else:
            step_s = (wall - mono) - self._wall_minus_mono
            if abs(step_s) > self.step_tolerance_s:
                self.log.info("wall_clock_step", step_s=round(step_s, 3), note="re-measuring")
                self._measure()
        offset = self.offset_s
        assert offset is not None  # _measure raised otherwise
        return self._wall() + offset

    def _measure(self) -> None:
        """Probe Prometheus's now and keep the offset (module doc: against the wall time
        read before the probe). On failure the offset is dropped and SourceError raised."""
        self.measurements += 1
        mono0, wall0 = self._monotonic(), self._wall()
        try:
            prom_s = float(self._probe())
        except Exception as exc:
            self.offset_s = None
            if isinstance(exc, SourceError):
                raise
            raise SourceError(f"Prometheus's time: {type(exc).__name__}: {exc}") from exc
        if not math.isfinite(prom_s):
            self.offset_s = None
            raise SourceError(f"Prometheus's time is not finite: {prom_s}")
        self.round_trip_s = max(0.0, self._monotonic() - mono0)
        self.offset_s = prom_s - wall0
        self._measured_at = mono0
        self._wall_minus_mono = wall0 - mono0
        self._report(self.offset_s, prom_s, wall0)

    def _report(self, skew_s: float, prom_s: float, wall_s: float) -> None:
        """Warn of a skew over `warn_skew_s` when it first appears or moves by more than
        the step tolerance; note when it is back within the tolerance."""
        if abs(skew_s) > self.warn_skew_s:
            last = self._warned_skew
            if last is None or abs(skew_s - last) > self.step_tolerance_s:
                self._warned_skew = skew_s
                self.log.warning(
                    "prometheus_clock_skew",
                    skew_s=round(skew_s, 3),
                    prometheus_unix_s=round(prom_s, 3),
                    host_unix_s=round(wall_s, 3),
                    tolerance_s=self.warn_skew_s,
                    note="Prometheus is queried at its own clock; fix this host's clock",
                )
        elif self._warned_skew is not None:
            self._warned_skew = None
            self.log.info("prometheus_clock_skew_resolved", skew_s=round(skew_s, 3))


class WallClockSource:
    """Feeds a Unix-time metric source from the monotonic control loop.

    The loop's `now_s` is monotonic seconds (windows must not jump with the wall
    clock); Prometheus evaluates queries at a Unix time. `observe(models, now_s)` asks
    `inner` at Prometheus's current time (`PrometheusClock`) when `inner` can tell it
    (`server_time_s`, as `PrometheusSource`), else at `clock.wall()`. Example: a tick at
    monotonic 8123.4 s on a host whose wall clock reads 1,764,400,000.0 while
    Prometheus's reads 600 s later queries Prometheus at time=1764400600.
    `clock`: `wall()` and `monotonic()`, seconds (controller.loop.Clock).
    """

    def __init__(self, inner: MetricSource, clock: Clock, logger: Any = None) -> None:
        self.inner = inner
        self.clock = clock
        probe = getattr(inner, "server_time_s", None)
        self.prometheus_clock: PrometheusClock | None = (
            PrometheusClock(probe, clock.wall, clock.monotonic, logger=logger)
            if callable(probe)
            else None
        )

    @property
    def clock_skew_s(self) -> float | None:
        """Prometheus's clock - the host's wall clock, s, as last measured (None: not
        measured, the last measurement failed, or the source has no clock of its own)."""
        pc = self.prometheus_clock
        return None if pc is None else pc.offset_s

    def observe(self, models: Any, now_s: float) -> Any:
        """`inner.observe` at Prometheus's current time (Unix s); `now_s` (the loop's
        monotonic s) is not used. SourceError when that time cannot be measured."""
        pc = self.prometheus_clock
        return self.inner.observe(models, self.clock.wall() if pc is None else pc.now_s())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def install_skew_gauge(registry: CollectorRegistry, source: Any) -> Gauge:
    """`governor_prometheus_clock_skew_seconds` on `registry`: `source.clock_skew_s`
    when scraped (NaN when unknown: not measured yet, Prometheus unreachable, or a
    source without a clock of its own, e.g. the simulated fleet)."""
    gauge = Gauge(
        "governor_prometheus_clock_skew_seconds",
        "Prometheus's clock minus this host's wall clock, as last measured (s; NaN: "
        "unknown); queries are evaluated at Prometheus's clock",
        registry=registry,
    )

    def skew() -> float:
        value = getattr(source, "clock_skew_s", None)
        return float(value) if isinstance(value, (int, float)) else math.nan

    gauge.set_function(skew)
    return gauge
