"""The decision board as the serving process mirrors it (actuators.publisher): `mirror`
serves another board's values as they are, watchers wake on served changes only, and
quiet subscribers (the feed to the serving process) hear every change."""

from __future__ import annotations

from dataclasses import replace

from actuators.publisher import (
    ORIGIN_DECISION,
    DecisionBoard,
    LatencyDistribution,
    ModelSlot,
    Published,
)
from controller.types import Knobs
from estimators.types import LatencyQuantiles

SLOT = ModelSlot("m", "ns", Knobs(64, 4096), Knobs(512, 16384))


def _dist(t: float) -> LatencyDistribution:
    q = LatencyQuantiles(p50_ms=10.0, p90_ms=20.0, p95_ms=30.0, p99_ms=40.0)
    return LatencyDistribution(ttft=q, itl=q, e2e=q, observed_at_unix_s=t)


def _entry(**over: object) -> Published:
    base = Published(
        model="m",
        namespace="ns",
        knobs=Knobs(128, 8192),
        generation=7,
        replicas=3,
        reason="KNOBS_CHANGED",
        decided_at_unix_s=1.0,
        origin=ORIGIN_DECISION,
    )
    return replace(base, **over)  # type: ignore[arg-type]


def test_mirror_serves_entries_as_they_are_and_wakes_on_served_changes_only() -> None:
    board = DecisionBoard()
    board.mirror({"m": _entry()}, {"m": SLOT})
    assert board.get("m") == _entry()  # generation, origin: the source board's
    assert board.ceiling("m") == Knobs(512, 16384)
    v = board.version
    board.mirror({"m": _entry(latency=_dist(2.0))}, {})
    assert board.version == v  # latency alone: no watcher woken
    assert board.get("m").latency == _dist(2.0)
    board.mirror({"m": _entry(replicas=4, latency=_dist(2.0))}, {})
    assert board.version == v + 1
    board.mirror({}, {}, removed=["m"])
    assert board.models() == [] and board.version == v + 2
    assert board.ceiling("m") is None


def test_quiet_subscribers_hear_latency_and_ceiling_changes() -> None:
    board = DecisionBoard([SLOT])
    loud: list[int] = []
    quiet: list[int] = []
    board.subscribe(lambda: loud.append(1))
    board.subscribe(lambda: quiet.append(1), quiet=True)
    board.set_latency({"m": _dist(1.0)})
    assert (len(loud), len(quiet)) == (0, 1)
    board.configure([replace(SLOT, ceiling=Knobs(256, 8192))])
    assert (len(loud), len(quiet)) == (0, 2)
    assert board.ceiling("m") == Knobs(256, 8192)
    board.restore({"m": replace(board.get("m"), latency=_dist(5.0))})
    assert (len(loud), len(quiet)) == (0, 3)
    board.configure([SLOT, ModelSlot("n", "ns", Knobs(8, 512))])
    assert (len(loud), len(quiet)) == (1, 4)


def test_a_batch_notifies_once_at_its_end() -> None:
    """A tick's decisions and latency distributions: one notification, after both."""
    board = DecisionBoard([SLOT])
    calls: list[tuple[int, int]] = []  # (version, knobs) seen by each notification
    board.subscribe(
        lambda: calls.append((board.version, board.get("m").knobs.max_num_seqs)), quiet=True
    )
    with board.batch():
        board.mirror({"m": _entry()}, {})
        board.set_latency({"m": _dist(3.0)})
        assert calls == []  # held until the batch ends
        with board.batch():
            board.set_latency({"m": _dist(4.0)})
        assert calls == []  # the outermost batch decides
    assert calls == [(board.version, 128)]
    board.set_latency({"m": _dist(5.0)})
    assert len(calls) == 2  # outside a batch: at once


def test_a_leaders_value_never_takes_the_served_generation_back() -> None:
    """Found in review: a leader that published a tick the store never saved (the write
    failed as the lease lapsed) and then followed the new leader served the older saved
    generation again, so engines saw 2 -> 1 and the old knobs. A leader's value at or
    below the served generation is served one above it with other knobs, and keeps the
    served number with the same knobs; above it, the leader's number."""
    from actuators.publisher import ORIGIN_LEADER

    board = DecisionBoard([SLOT])
    k1, k2, k3 = Knobs(128, 8192), Knobs(8, 256), Knobs(32, 2048)
    board.restore({"m": _entry(knobs=k1, generation=7)}, ORIGIN_LEADER)
    assert (board.get("m").generation, board.get("m").knobs) == (7, k1)
    board.restore({"m": _entry(knobs=k2, generation=6)}, ORIGIN_LEADER)
    assert (board.get("m").generation, board.get("m").knobs) == (8, k2)
    board.restore({"m": _entry(knobs=k2, generation=6)}, ORIGIN_LEADER)
    assert board.get("m").generation == 8  # same knobs: no new number, none lower
    board.restore({"m": _entry(knobs=k3, generation=8)}, ORIGIN_LEADER)
    assert (board.get("m").generation, board.get("m").knobs) == (9, k3)
    board.restore({"m": _entry(knobs=k3, generation=12)}, ORIGIN_LEADER)
    assert board.get("m").generation == 12  # above: the leader's numbering
