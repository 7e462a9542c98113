"""Prometheus's clock (service.promclock) with fake clocks and a fake Prometheus client:
the offset follows Prometheus's clock through host clock skew and steps, is re-measured
when due, is never behind Prometheus's clock, fails the tick when it cannot be measured,
warns of a skew over 5 s once, and is on the metrics. No sleeps: every clock is faked."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from estimators.prometheus import SERVER_TIME_QUERY, PrometheusSource
from estimators.types import ModelQuery, SourceError
from service.promclock import (
    REFRESH_S,
    PrometheusClock,
    WallClockSource,
    install_skew_gauge,
)
from tests.service.fakes import FakeSource, quiet_logger

TRUE_ORIGIN_S = 1_800_000_000.0  # Unix time at monotonic 0, by Prometheus's clock
SKEW_S = 600.0


@dataclass
class World:
    """True time is the monotonic clock; Prometheus's clock reads it plus `prom_error_s`,
    the host's wall clock plus `host_error_s`. A probe takes `rtt_s` (Prometheus reads its
    clock half-way) and can be made to fail."""

    mono: float = 1000.0
    host_error_s: float = -SKEW_S  # the host 10 minutes behind
    prom_error_s: float = 0.0
    rtt_s: float = 0.2
    fail: Exception | None = None
    probes: int = 0

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return TRUE_ORIGIN_S + self.mono + self.host_error_s

    def prom_now(self) -> float:
        return TRUE_ORIGIN_S + self.mono + self.prom_error_s

    def probe(self) -> float:
        self.probes += 1
        self.mono += self.rtt_s / 2
        if self.fail is not None:
            raise self.fail
        at = self.prom_now()
        self.mono += self.rtt_s / 2
        return at


@dataclass
class Log:
    """A logger that keeps (level, event, fields)."""

    lines: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append(("warning", event, kw))

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append(("info", event, kw))

    def events(self, level: str) -> list[tuple[str, dict[str, Any]]]:
        return [(e, kw) for lv, e, kw in self.lines if lv == level]


def _clock(w: World, log: Log | None = None) -> PrometheusClock:
    return PrometheusClock(w.probe, w.wall, w.monotonic, logger=log or Log())


@pytest.mark.parametrize("host_error_s", [-SKEW_S, 0.0, SKEW_S, -3.0])
def test_evaluates_at_prometheus_time_never_behind_it(host_error_s: float) -> None:
    w = World(host_error_s=host_error_s)
    pc = _clock(w)
    for _ in range(5):
        at = pc.now_s()
        assert w.prom_now() <= at <= w.prom_now() + w.rtt_s  # never behind; ahead <= rtt
        w.mono += 5.0
    assert pc.offset_s == pytest.approx(-host_error_s, abs=w.rtt_s)
    assert pc.round_trip_s == pytest.approx(w.rtt_s)


def test_a_wall_clock_step_is_logged_and_re_measured() -> None:
    w, log = World(host_error_s=0.0), Log()
    pc = _clock(w, log)
    pc.now_s()
    w.mono += 5.0
    w.host_error_s = -SKEW_S  # NTP steps the host's clock back 10 minutes
    at = pc.now_s()
    assert w.probes == 2  # re-measured before this tick's queries
    assert w.prom_now() <= at <= w.prom_now() + w.rtt_s  # not 10 minutes in the past
    (event, kw), *_ = log.events("info")
    assert event == "wall_clock_step" and kw["step_s"] == pytest.approx(-SKEW_S)


def test_a_small_wall_clock_change_is_no_step() -> None:
    w = World()
    pc = _clock(w)
    pc.now_s()
    w.mono += 5.0
    w.host_error_s += 0.5  # within the 1 s tolerance
    pc.now_s()
    assert w.probes == 1


def test_measured_again_every_refresh_s_so_a_prometheus_clock_step_is_followed() -> None:
    w = World()
    pc = _clock(w)
    pc.now_s()
    w.prom_error_s = 120.0  # Prometheus's own clock stepped
    w.mono += REFRESH_S - 1.0
    pc.now_s()
    assert w.probes == 1  # not yet due
    w.mono += 1.0
    at = pc.now_s()
    assert w.probes == 2
    assert w.prom_now() <= at <= w.prom_now() + w.rtt_s


@pytest.mark.parametrize(
    "failure",
    [SourceError("connection refused", query=SERVER_TIME_QUERY), OSError("unreachable")],
    ids=["source-error", "other-error"],
)
def test_an_unmeasurable_offset_is_no_data_never_the_old_offset(failure: Exception) -> None:
    w = World()
    pc = _clock(w)
    pc.now_s()
    w.mono += REFRESH_S
    w.fail = failure
    with pytest.raises(SourceError):
        pc.now_s()
    assert pc.offset_s is None
    w.mono += 1.0
    with pytest.raises(SourceError):  # asked again on the next tick, not REFRESH_S later
        pc.now_s()
    assert w.probes == 3
    w.fail = None
    w.mono += 1.0
    at = pc.now_s()
    assert w.probes == 4 and w.prom_now() <= at <= w.prom_now() + w.rtt_s


def test_a_non_finite_time_is_no_data() -> None:
    pc = PrometheusClock(lambda: math.nan, lambda: 1.0, lambda: 1.0, logger=Log())
    with pytest.raises(SourceError):
        pc.now_s()
    assert pc.offset_s is None


def test_a_skew_over_5_s_is_warned_once_with_its_size() -> None:
    w, log = World(host_error_s=-SKEW_S), Log()
    pc = _clock(w, log)
    for _ in range(3):
        pc.now_s()
        w.mono += REFRESH_S
    warnings = log.events("warning")
    assert [e for e, _ in warnings] == ["prometheus_clock_skew"]
    assert warnings[0][1]["skew_s"] == pytest.approx(SKEW_S, abs=w.rtt_s)
    w.host_error_s = -2 * SKEW_S  # worse: warned again
    pc.now_s()
    w.mono += REFRESH_S
    assert len(log.events("warning")) == 2
    w.host_error_s = 0.0  # fixed
    pc.now_s()
    assert [e for e, _ in log.events("info")][-1] == "prometheus_clock_skew_resolved"


def test_a_skew_within_5_s_is_not_warned() -> None:
    w, log = World(host_error_s=-4.0), Log()
    _clock(w, log).now_s()
    assert log.events("warning") == []


# --- WallClockSource over PrometheusSource, with a fake Prometheus client -------------


class FakePrometheus:
    """Answers `time()` without a `time` parameter at `world.prom_now()` (Prometheus's
    now), every other query with an empty vector; records each query's `time`."""

    def __init__(self, world: World, bodies: bool = True) -> None:
        self.world = world
        self.times: list[str | None] = []
        self.answer: Any = None  # overrides the scalar answer of `time()` when set
        if bodies:
            self.query_body = self._query_body

    def _result(self, query: str, params: dict[str, Any] | None) -> tuple[str, Any]:
        at = (params or {}).get("time")
        if query == SERVER_TIME_QUERY:
            assert at is None  # Prometheus evaluates at its own now
            t = self.world.prom_now()
            return "scalar", [t, f"{t:.3f}"] if self.answer is None else self.answer
        self.times.append(at)
        return "vector", []

    def _query_body(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bytes:
        kind, result = self._result(query, params)
        return orjson.dumps({"status": "success", "data": {"resultType": kind, "result": result}})

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        return self._result(query, params)[1]


@pytest.mark.parametrize("bodies", [True, False], ids=["body-client", "decoded-client"])
def test_the_source_queries_at_prometheus_time_not_the_host_wall(bodies: bool) -> None:
    w = World(host_error_s=-SKEW_S, rtt_s=0.0)
    client = FakePrometheus(w, bodies)
    inner = PrometheusSource("http://p", client=client)
    source = WallClockSource(inner, w, logger=quiet_logger())
    source.observe([ModelQuery("m")], w.monotonic())
    assert len(client.times) == 8  # the tick's queries, all at one time
    assert len(set(client.times)) == 1  # at one evaluation time: Prometheus's now
    assert float(client.times[0] or 0) == pytest.approx(w.prom_now(), abs=1e-3)
    assert source.clock_skew_s == pytest.approx(SKEW_S)
    assert inner.queries_last_tick == 8 and inner.queries_total == 9  # + the probe


@pytest.mark.parametrize(
    "answer",
    [[], ["x", "NaN"], [1.0, "NaN"], [1.0, "-5"], None],
    ids=["empty", "bad-time", "nan", "negative", "vector"],
)
def test_a_malformed_time_answer_is_no_data(answer: Any) -> None:
    w = World()
    client = FakePrometheus(w)
    if answer is None:  # a vector where a scalar belongs
        client.query_body = lambda q, params=None, timeout=None: orjson.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": []}}
        )
    else:
        client.answer = answer
    source = WallClockSource(PrometheusSource("http://p", client=client), w)
    with pytest.raises(SourceError, match=r"time\(\)"):
        source.observe([ModelQuery("m")], w.monotonic())
    assert client.times == [] and source.clock_skew_s is None  # no query at a guess


def test_a_source_without_a_clock_of_its_own_is_asked_at_the_wall_time() -> None:
    w = World()
    inner = FakeSource({"m": 1.0})
    source = WallClockSource(inner, w)
    got = source.observe([ModelQuery("m")], w.monotonic())
    assert got["m"].observed_at_s == w.wall()
    assert source.clock_skew_s is None


def test_the_skew_gauge_reads_the_last_measurement() -> None:
    w = World(host_error_s=-SKEW_S, rtt_s=0.0)
    source = WallClockSource(PrometheusSource("http://p", client=FakePrometheus(w)), w)
    registry = CollectorRegistry()
    install_skew_gauge(registry, source)
    name = "governor_prometheus_clock_skew_seconds"
    assert math.isnan(registry.get_sample_value(name) or 0.0)  # not measured yet
    source.observe([ModelQuery("m")], w.monotonic())
    assert registry.get_sample_value(name) == pytest.approx(SKEW_S)
    other = CollectorRegistry()
    install_skew_gauge(other, FakeSource())
    assert math.isnan(other.get_sample_value(name) or 0.0)
