"""A follower serves engines and KEDA the leader's published values only within its own
configured model bounds: a value outside them (a hand-edited state ConfigMap, a leader
on an older target set or version with wider bounds) is refused, named in a warning,
and the follower keeps serving what it served before. Fake clock, shared store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import structlog

from controller.config import GovernorConfig
from service.core import ServiceCore
from service.leader import AlwaysLeader
from service.store import FileStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger


class _Follower(AlwaysLeader):
    """Never the leader: the core mirrors the leader's saved publications."""

    def is_leader(self) -> bool:
        return False


def _config() -> GovernorConfig:
    return make_config(model_entry("demo"), model_entry("other"))


def _edit(path: Path, model: str, field: str, value: int) -> None:
    """Hand-edit the saved publication of `model` in the state file."""
    data = json.loads(path.read_text())
    data["state"]["published"][model][field] = value
    data["state"]["published"][model]["generation"] += 1
    path.write_text(json.dumps(data))


# replicas bounds [1, 20]; knob bounds max_num_seqs [8, 1024], tokens [256, 65536]
@pytest.mark.parametrize(
    ("field", "value", "bounds"),
    [
        ("max_num_seqs", 4096, [8, 1024]),
        ("max_num_seqs", 4, [8, 1024]),
        ("max_num_batched_tokens", 100, [256, 65_536]),
        ("replicas", 21, [1, 20]),
        ("replicas", 0, [1, 20]),
    ],
)
def test_a_follower_refuses_a_leader_value_outside_its_bounds(
    tmp_path: Path, field: str, value: int, bounds: list[int]
) -> None:
    path = tmp_path / "state.json"
    clock = FakeClock()
    source = FakeSource({"demo": 30.0, "other": 30.0})
    leader = ServiceCore(_config(), source, FileStore(path), clock=clock, logger=quiet_logger())
    follower = ServiceCore(_config(), source, FileStore(path), clock=clock, elector=_Follower("b"))
    leader.tick(clock.advance(5))
    follower.tick(clock.monotonic())
    good = follower.board.get("demo")
    assert good.origin == "leader"

    _edit(path, "demo", field, value)
    with structlog.testing.capture_logs() as logs:
        follower.tick(clock.advance(5))
        follower.tick(clock.advance(5))
    assert follower.board.get("demo") == good  # the last good value, still served
    assert follower.board.get("other").origin == "leader"  # the valid model still mirrored
    warnings = [e for e in logs if e["event"] == "leader_publication_refused"]
    assert len(warnings) == 1  # once while the same value stays refused, not every tick
    (w,) = warnings
    assert (w["model"], w["field"], w["value"], w["bounds"]) == ("demo", field, value, bounds)
    assert w["log_level"] == "warning"

    leader.tick(clock.advance(5))  # the leader publishes again, within the bounds
    follower.tick(clock.monotonic())
    lp, fp = leader.board.get("demo"), follower.board.get("demo")
    assert (fp.knobs, fp.replicas, fp.generation) == (lp.knobs, lp.replicas, lp.generation)
    assert fp.origin == "leader"


def test_a_follower_that_never_mirrored_keeps_its_defaults(tmp_path: Path) -> None:
    """Nothing good seen from the leader yet: the configured defaults stay served."""
    path = tmp_path / "state.json"
    clock = FakeClock()
    source = FakeSource({"demo": 30.0, "other": 30.0})
    leader = ServiceCore(_config(), source, FileStore(path), clock=clock, logger=quiet_logger())
    follower = ServiceCore(
        _config(), source, FileStore(path), clock=clock, elector=_Follower("b"),
        logger=quiet_logger(),
    )  # fmt: skip
    leader.tick(clock.advance(5))
    _edit(path, "demo", "replicas", 500)
    follower.tick(clock.advance(5))
    demo = follower.board.get("demo")
    assert (demo.origin, demo.generation, demo.replicas) == ("default", 0, None)
