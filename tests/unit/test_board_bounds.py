"""`DecisionBoard.configure` keeps a kept model's served value within the bounds its new
slot carries (actuators.publisher.ModelSlot.bound): narrowed knob bounds move the knobs
inside them in a new generation, narrowed replica bounds move the replicas; watchers are
woken. A slot that carries no bounds changes nothing."""

from __future__ import annotations

from actuators.publisher import DecisionBoard, ModelSlot
from controller.types import Decision, Knobs, Reason

DEFAULTS = Knobs(64, 4096)
CEILING, FLOOR = Knobs(1024, 65_536), Knobs(8, 256)


def _slot(
    ceiling: Knobs = CEILING, floor: Knobs = FLOOR, replicas: tuple[int, int] = (1, 20)
) -> ModelSlot:
    """Model m's slot: knobs within [floor, ceiling], replicas within (min, max)."""
    return ModelSlot("m", "ns", DEFAULTS, ceiling, floor=floor, replicas=replicas)


def _board(knobs: Knobs, replicas: int) -> DecisionBoard:
    """A board serving `knobs` (generation 1) and `replicas` for model m."""
    board = DecisionBoard([_slot()])
    board.apply([Decision("m", 0.0, True, replicas, knobs, (), Reason.KNOBS_CHANGED)])
    assert board.get("m").generation == 1
    return board


def test_narrowed_knob_and_replica_bounds_move_the_served_value() -> None:
    board = _board(Knobs(512, 16_384), 9)
    version = board.version
    board.configure([_slot(ceiling=Knobs(128, 8192), replicas=(1, 6))])
    p = board.get("m")
    assert (p.knobs, p.replicas, p.generation) == (Knobs(128, 8192), 6, 2)
    assert p.reason == "KNOBS_CHANGED" and board.version > version


def test_raised_minima_raise_the_served_value() -> None:
    """A raised knob floor lifts both knobs (the token budget at least the sequences);
    a raised min replicas lifts a fleet at zero."""
    board = _board(Knobs(16, 512), 0)
    board.configure([_slot(floor=Knobs(32, 256), replicas=(2, 20))])
    p = board.get("m")
    assert (p.knobs, p.replicas, p.generation) == (Knobs(32, 512), 2, 2)


def test_replicas_moved_alone_keep_the_generation() -> None:
    board = _board(Knobs(512, 16_384), 9)
    board.configure([_slot(replicas=(1, 4))])
    p = board.get("m")
    assert (p.knobs, p.replicas, p.generation) == (Knobs(512, 16_384), 4, 1)


def test_a_slot_without_bounds_or_a_value_within_changes_nothing() -> None:
    board = _board(Knobs(512, 16_384), 9)
    before, version = board.get("m"), board.version
    board.configure([_slot(replicas=(9, 9))])
    board.configure([ModelSlot("m", "ns", DEFAULTS)])  # bounds not known
    assert board.get("m") == before and board.version == version
