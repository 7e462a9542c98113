"""Bounds narrowed at runtime reach what engines and KEDA are served at once: the leader's
and a follower's board move a served value inside the new knob and replica bounds when
the targets change, logged with model, field, old and new value, not at the leader's
next valid decision (a stretch without data puts that off). Fake clock, shared store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from actuators.publisher import Published
from controller.config import GovernorConfig
from service.core import ServiceCore
from service.leader import AlwaysLeader
from service.store import FileStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger

NARROW_KNOBS = {
    "max_num_seqs_max": 32,
    "max_num_batched_tokens_max": 2048,
    "default_max_num_seqs": 32,
    "default_max_num_batched_tokens": 2048,
}


class _Follower(AlwaysLeader):
    """Never the leader: the core mirrors the leader's saved publications."""

    def is_leader(self) -> bool:
        return False


def _config() -> GovernorConfig:
    return make_config(model_entry("demo"))


def _narrowed(**replicas: int) -> dict[str, Any]:
    """The demo target with knobs of at most 32 seqs / 2048 tokens and `replicas`."""
    return model_entry("demo", knobs=NARROW_KNOBS, replicas=replicas)


def _leader(path: Path, clock: FakeClock, source: FakeSource) -> ServiceCore:
    """A leader that decided knobs of its own (generation 1, above 32 seqs) and 4
    replicas on 60 req/s, then lost its data."""
    core = ServiceCore(_config(), source, FileStore(path), clock=clock, logger=quiet_logger())
    for _ in range(40):
        core.tick(clock.advance(5))
    p = core.board.get("demo")
    assert p.origin == "decision" and p.generation == 1
    assert p.knobs.max_num_seqs > 32 and p.knobs.max_num_batched_tokens > 2048
    assert p.replicas == 4
    source.set("demo", None)
    core.tick(clock.advance(5))  # no data: the decision is a hold, the board unchanged
    assert core.board.get("demo") == p
    return core


def _clamp_lines(logs: list[dict[str, Any]]) -> set[tuple[str, str, int, int]]:
    return {
        (e["model"], e["field"], e["old"], e["new"])
        for e in logs
        if e["event"] == "board_value_clamped"
    }


@dataclass
class _Narrowed:
    """A leader (`_leader`) after a target edit: the value served before the edit and
    the (model, field, old, new) of each board_value_clamped line the edit logged."""

    core: ServiceCore
    clock: FakeClock
    source: FakeSource
    before: Published
    clamped: set[tuple[str, str, int, int]]


def _narrow(tmp_path: Path, target: dict[str, Any]) -> _Narrowed:
    clock = FakeClock()
    source = FakeSource({"demo": 60.0})
    core = _leader(tmp_path / "state.json", clock, source)
    before = core.board.get("demo")
    with structlog.testing.capture_logs() as logs:
        core.set_target(target)
    return _Narrowed(core, clock, source, before, _clamp_lines(logs))


def test_narrowed_bounds_move_the_leaders_served_values_at_once(tmp_path: Path) -> None:
    n = _narrow(tmp_path, _narrowed(min_replicas=1, max_replicas=2))
    core, clock, before = n.core, n.clock, n.before
    p = core.board.get("demo")
    assert (p.knobs.max_num_seqs, p.knobs.max_num_batched_tokens, p.replicas) == (32, 2048, 2)
    assert p.generation == before.generation + 1  # a knob change engines can follow
    assert p.reason == "KNOBS_CHANGED"
    assert n.clamped == {
        ("demo", "max_num_seqs", before.knobs.max_num_seqs, 32),
        ("demo", "max_num_batched_tokens", before.knobs.max_num_batched_tokens, 2048),
        ("demo", "replicas", 4, 2),
    }

    served = (p.knobs, p.replicas, p.generation)
    for _ in range(3):  # still no data: holds, then the fallback, within the new bounds
        core.tick(clock.advance(5))
        now = core.board.get("demo")
        assert (now.knobs, now.replicas, now.generation) == served
    assert core.loop.snapshot().models["demo"].decision.valid  # the fallback was published
    n.source.set("demo", 60.0)
    core.tick(clock.advance(5))  # data again: the decider arrives at the same knobs
    back = core.board.get("demo")
    assert (back.knobs, back.generation) == (p.knobs, p.generation)
    assert back.replicas is not None and back.replicas <= 2


def test_a_raised_min_replicas_raises_the_served_replicas(tmp_path: Path) -> None:
    n = _narrow(tmp_path, model_entry("demo", replicas={"min_replicas": 6, "max_replicas": 20}))
    p = n.core.board.get("demo")
    assert (p.knobs, p.generation, p.replicas) == (n.before.knobs, n.before.generation, 6)
    assert n.clamped == {("demo", "replicas", 4, 6)}


def test_bounds_within_which_the_value_lies_change_nothing(tmp_path: Path) -> None:
    n = _narrow(tmp_path, model_entry("demo", replicas={"min_replicas": 2, "max_replicas": 4}))
    assert n.core.board.get("demo") == n.before
    assert not n.clamped


def test_a_follower_moves_its_served_values_inside_narrowed_bounds(tmp_path: Path) -> None:
    """The follower applies the narrowed targets from the store; until then it served the
    leader's old values, which the leader's own state still holds: without the move it
    would refuse nothing (they were within its old bounds) and keep serving them."""
    path = tmp_path / "state.json"
    clock = FakeClock()
    source = FakeSource({"demo": 60.0})
    leader = _leader(path, clock, source)
    follower = ServiceCore(
        _config(), source, FileStore(path), clock=clock, elector=_Follower("b"),
        logger=quiet_logger(),
    )  # fmt: skip
    follower.tick(clock.monotonic())
    lp, fp = leader.board.get("demo"), follower.board.get("demo")
    assert (fp.knobs, fp.replicas, fp.generation) == (lp.knobs, lp.replicas, lp.generation)

    leader.set_target(_narrowed(min_replicas=1, max_replicas=2))  # stored, not yet saved
    with structlog.testing.capture_logs() as logs:
        follower.tick(clock.advance(5))
    p = follower.board.get("demo")
    assert (p.knobs.max_num_seqs, p.knobs.max_num_batched_tokens, p.replicas) == (32, 2048, 2)
    assert {(f, new) for _, f, _, new in _clamp_lines(logs)} == {
        ("max_num_seqs", 32),
        ("max_num_batched_tokens", 2048),
        ("replicas", 2),
    }
    leader.tick(clock.advance(5))  # a hold: saves the leader's board as it now is
    follower.tick(clock.monotonic())
    lp, fp = leader.board.get("demo"), follower.board.get("demo")
    assert (fp.knobs, fp.replicas, fp.generation) == (lp.knobs, lp.replicas, lp.generation)
