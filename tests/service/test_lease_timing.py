"""Lease election timing under slow answers, with the real `kubernetes` client against
`FakeKubeAPI` (tests/service/fake_kube.py): the leader's renew deadline counts from the
start of the step whose write succeeded, not from the write's answer, so a slow answer
(within the request timeout) never lets two instances lead at once (service/leader.py,
module doc). The fake clock advances only where the test (or the fake server, for a
slow answer) says; nothing sleeps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from actuators.kubeapi import api_client
from service.leader import LeaseElector
from tests.service.fake_kube import FakeKubeAPI
from tests.service.fakes import FakeClock, quiet_logger

NS = "llm"
LEASE = "governor-leader"


class SlowLeaseAnswers(FakeKubeAPI):
    """`FakeKubeAPI` whose Lease writes (create, renew) are committed at once but
    answered `write_answer_s` later on `clock` (it advances while the client waits), and
    which runs `before_get` once while a Lease GET is in flight, before serving it."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(timeout_delay_s=1.0)
        self.clock = clock
        self.write_answer_s = 0.0
        self.before_get: Callable[[], None] | None = None

    def _route(
        self, method: str, path: str, body: Any, ctype: str, query: str = ""
    ) -> tuple[int, Any]:
        lease = "/leases" in path
        if method == "GET" and lease and self.before_get is not None:
            hook, self.before_get = self.before_get, None
            hook()
        out = super()._route(method, path, body, ctype, query)
        if method in ("PUT", "POST") and lease:
            self.clock.advance(self.write_answer_s)  # committed; the answer comes later
        return out


def _elector(api: FakeKubeAPI, identity: str, clock: FakeClock, **kw: Any) -> LeaseElector:
    """Defaults: lease 10 s, renew deadline 7 s. The fake clock does not move during a
    request unless the fake server moves it, so the client's own timeout is generous."""
    return LeaseElector(
        api_client(api.url),
        NS,
        LEASE,
        identity,
        monotonic=clock.monotonic,
        wall=clock.wall,
        request_timeout_s=30.0,
        logger=quiet_logger(),
        **kw,
    )


def test_a_slow_renewal_answer_never_makes_two_leaders() -> None:
    """A renews at 1002.0 (committed) but the answer arrives at 1003.99; B's GET, sent
    at 1000.1, is served after the commit. A is then cut off. B may take over at
    1000.1 + 10 = 1010.1, so A must stop before: at 1002.0 + 7 = 1009.0 (counted from
    the answer, 1010.99, both led from 1010.1 on)."""
    clock = FakeClock(mono=1000.0)
    with SlowLeaseAnswers(clock) as api:
        a, b = _elector(api, "a", clock), _elector(api, "b", clock)
        assert a.step() is True

        def a_renews_slowly() -> None:
            clock.mono = 1002.0
            api.write_answer_s = 1.99
            assert a.step() is True
            api.write_answer_s = 0.0

        clock.mono = 1000.1
        api.before_get = a_renews_slowly
        assert b.step() is False
        assert clock.monotonic() == pytest.approx(1003.99) and a.is_leader()
        clock.mono = 1008.9
        assert a.is_leader()
        for step in range(20):  # a makes no further renewal; b tries every 0.5 s
            clock.mono = 1009.1 + 0.5 * step
            assert not a.is_leader(), "a leads past its renew deadline"
            if b.step():
                break
        assert b.is_leader() and clock.monotonic() == pytest.approx(1010.1)


def test_the_renew_deadline_counts_from_before_a_slow_create() -> None:
    clock = FakeClock(mono=1000.0)
    with SlowLeaseAnswers(clock) as api:
        api.write_answer_s = 1.9
        a = _elector(api, "a", clock)
        assert a.step() is True  # created at 1000.0, answered at 1001.9
        clock.mono = 1006.9
        assert a.is_leader()
        clock.mono = 1007.0
        assert not a.is_leader()


def test_the_lease_duration_is_rounded_up() -> None:
    """A follower must count at least the leader's lease: 10.4 s is written as 11."""
    clock = FakeClock()
    with FakeKubeAPI() as api:
        a = _elector(api, "a", clock, lease_duration_s=10.4)
        assert a.step() is True  # create
        lease = api.lease(NS, LEASE)
        assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 11
        clock.advance(2)
        assert a.step() is True  # renew
        lease = api.lease(NS, LEASE)
        assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 11
