"""The engine plugin (governor_engine) against a governor that goes silent, answers
garbage or hangs up, and against blank or misspelled settings (a session-55 review):
nothing may leave the engine on stale knobs without a word, flood its log, stop it from
starting, or serve a latency header that never ages out. The governor is the real
service on loopback gRPC (tests.service.harness.ServerThread); a partition is a TCP relay
that stops forwarding on its open connections (no FIN, no RST), as a dead node does."""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
from typing import Any

import pytest

import governor_engine.follower as follower_mod
from governor_engine.follower import Backoff, KnobFollower
from governor_engine.limits import EngineSettings, preempt_over_cap
from governor_engine.middleware import MAX_AHEAD_S, MAX_QUANTILE_MS, LatencyDistCache, format_header
from tests.engine.test_plugin_parts import _core
from tests.service.fakes import quiet_logger
from tests.service.harness import ServerThread, wait_until


class _Relay:
    """A TCP relay to 127.0.0.1:`port`; `partition()` makes its open connections a black
    hole (bytes read and dropped, no close forwarded); new connections still relay."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.partitioned: list[dict[str, bool]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            state = {"dropped": False}
            self.partitioned.append(state)
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pipe, args=(a, b, state), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket, state: dict[str, bool]) -> None:
        while True:
            try:
                data = a.recv(65536)
            except OSError:
                return
            if not data:
                if not state["dropped"]:
                    with contextlib.suppress(OSError):  # the other side already closed
                        b.shutdown(socket.SHUT_WR)
                return
            if not state["dropped"]:
                try:
                    b.sendall(data)
                except OSError:
                    return

    def partition(self) -> None:
        for state in self.partitioned:
            state["dropped"] = True

    def close(self) -> None:
        self.listener.close()


def test_a_partitioned_stream_is_found_out_and_followed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream to the governor goes silent (partition), then the governor lowers the
    knobs: the keepalive pings find the dead connection out, the follower counts a
    failure and reconnects, and the engine gets the lowered knobs. Without pings the
    stream stayed open forever, the engine on 32/2048, `failures` 0, nothing logged.
    (Pings here every 1 s, given up after 1 s; the shipped KEEPALIVE_TIME_MS is 30 s.)"""
    monkeypatch.setattr(follower_mod, "KEEPALIVE_TIME_MS", 1000)
    monkeypatch.setattr(follower_mod, "KEEPALIVE_TIMEOUT_MS", 1000)
    core, clock = _core()
    with ServerThread(core, logger=quiet_logger()) as s:
        relay = _Relay(int(s.address.rsplit(":", 1)[1]))
        core.tick(clock.advance(5))
        address = f"127.0.0.1:{relay.port}"
        follower = KnobFollower(
            address, "demo", "pod-1", backoff=Backoff(0.05, 0.2, random.Random(1))
        ).start()
        try:
            first = wait_until(follower.latest, 10, "the first config")
            assert first.max_num_seqs == 32
            relay.partition()
            target = core.config.model("demo").model_dump(mode="json")
            target["knobs"]["default_max_num_seqs"] = 4
            core.set_target(target)
            core.tick(clock.advance(5))
            wait_until(lambda: follower.failures >= 1, 20, "the silent stream found out")
            wait_until(
                lambda: (u := follower.latest()) is not None and u.max_num_seqs == 4,
                20,
                "the lowered knobs over a new connection",
            )
        finally:
            follower.stop()
            relay.close()


def test_refused_knobs_are_logged_once_per_value(caplog: pytest.LogCaptureFixture) -> None:
    """A peer repeating non-positive knobs had written a warning per message (~0.7 MB of
    engine log a second on a thread sharing the GIL with the scheduler)."""
    follower = KnobFollower("127.0.0.1:1", "demo")
    with caplog.at_level(logging.WARNING, logger="vllm.governor_engine"):
        for _ in range(1000):
            follower._accept(0, -5, 3)
        follower._accept(0, 7, 4)
    assert [r.getMessage().count("non-positive") for r in caplog.records] == [1, 1]
    assert follower.latest() is None


def test_a_stream_that_ends_after_one_answer_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams that end right after their first message are failures: the retries back
    off to the cap (it had reset on every accepted message: a reconnect every ~0.5 s,
    forever). A stream that stayed open STABLE_STREAM_S starts them from the first
    delay again."""
    now = [0.0]
    delays: list[float] = []
    follower = KnobFollower(
        "127.0.0.1:1", "demo", backoff=Backoff(0.5, 8.0, random.Random(0)), clock=lambda: now[0]
    )
    lasted = [0.0]

    def one_answer() -> None:
        now[0] += lasted[0]
        follower._accept(8, 512, 1)

    def wait(delay: float) -> bool:
        delays.append(delay)
        if len(delays) == 6:
            lasted[0] = follower_mod.STABLE_STREAM_S
        if len(delays) == 7:
            follower._stop.set()
        return False

    monkeypatch.setattr(follower, "_follow_once", one_answer)
    monkeypatch.setattr(follower._stop, "wait", wait)
    follower._run()
    assert delays[4] >= 0.8 * 8.0  # at the cap after short-lived streams
    assert delays[6] <= 0.6  # a stream that served: retried soon


@pytest.mark.parametrize(
    ("extra", "env", "model"),
    [
        ({}, {"GOVERNOR_MODEL": " "}, "served"),  # the engine had failed to start
        ({"governor_model": " "}, {"GOVERNOR_MODEL": "env-model"}, "env-model"),
        ({"governor_model": "  flag  "}, {}, "flag"),
    ],
)
def test_a_blank_model_setting_is_not_given(
    extra: dict[str, Any], env: dict[str, str], model: str
) -> None:
    settings = EngineSettings.resolve(extra, "served", {"GOVERNOR_SERVER": "g:1", **env})
    assert settings.model == model and settings.server == "g:1"
    blank_flag = EngineSettings.resolve({"governor_server": " "}, "m", {"GOVERNOR_SERVER": "g:2"})
    assert blank_flag.server == "g:2"


@pytest.mark.parametrize(
    ("value", "preempt", "warned"),
    [
        (False, False, False),
        ("false", False, False),  # a quoted Helm value had left preemption on
        ("0", False, False),
        ("No", False, False),
        (True, True, False),
        ("yes", True, False),
        ("maybe", True, True),
        (2, True, True),
    ],
)
def test_preempt_over_cap_reads_booleans_and_their_spellings(
    value: Any, preempt: bool, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    extra = {"governor_preempt_over_cap": value}
    with caplog.at_level(logging.WARNING, logger="vllm.governor_engine"):
        assert preempt_over_cap(extra) is preempt
    assert any("governor_preempt_over_cap" in r.getMessage() for r in caplog.records) is warned
    assert preempt_over_cap({}) is True
    assert preempt_over_cap(None) is True
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.governor_engine"):
        EngineSettings.resolve(extra, "m", {})  # what the API server's middleware reads
    assert not caplog.records  # a bad value is warned about once, by the scheduler


@pytest.mark.parametrize(
    "observed_at", [float("nan"), float("inf"), 1_000_000.0 + MAX_AHEAD_S + 1, 1e12]
)
def test_a_distribution_stamped_in_the_future_or_not_finite_is_never_sent(
    observed_at: float,
) -> None:
    """Such a stamp never aged out: the header was served 30 days later."""
    now = [1_000_000.0]
    cache = LatencyDistCache(
        EngineSettings("h:1", "m", None, ""),
        fetch=lambda: ("p50=10ms", observed_at),
        wall=lambda: now[0],
    )
    cache.refresh()
    assert cache.header() is None
    ahead = LatencyDistCache(
        EngineSettings("h:1", "m", None, ""),
        fetch=lambda: ("p50=10ms", now[0] + MAX_AHEAD_S),
        wall=lambda: now[0],
    )
    ahead.refresh()
    assert ahead.header() == b"p50=10ms"  # within the clock skew allowed


def test_a_quantile_past_a_day_is_left_out() -> None:
    assert format_header(321.0, MAX_QUANTILE_MS, 1e300) == "p50=321ms,p90=86400000ms"


def test_refresh_failures_are_warned_once_per_problem_and_recovery_said(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They were logged at DEBUG only: responses lost the header with no reason given."""
    answers: list[Any] = [OSError("no CA"), OSError("no CA"), OSError("DNS"), ("p50=5ms", 0.0)]

    def fetch() -> tuple[str | None, float]:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    cache = LatencyDistCache(EngineSettings("h:1", "m", None, ""), fetch=fetch)

    def wait(delay: float) -> bool:
        if not answers:
            cache._stop.set()
        return False

    monkeypatch.setattr(cache._stop, "wait", wait)
    with caplog.at_level(logging.INFO, logger="vllm.governor_engine"):
        cache._run()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("not refreshed (OSError: no CA)" in m for m in messages) == 1
    assert sum("not refreshed (OSError: DNS)" in m for m in messages) == 1
    assert messages[-1] == "governor: latency distribution refreshed again"
