"""A change of a model's configured default knobs is a knob change (actuators.publisher):
a new generation, so an engine that applies a config only when its generation grows
(the BatchingConfig contract: "increases by one on every change of the knobs") learns
the new defaults. Before, the static policy (whose decisions are the defaults) kept
generation 0 through any number of default changes, and such an engine kept running the
first defaults."""

from __future__ import annotations

from actuators.publisher import ORIGIN_RESTORED, DecisionBoard, ModelSlot, Published
from controller.types import Decision, Knobs, Reason

CEILING = Knobs(1024, 32768)


def _slot(defaults: Knobs) -> ModelSlot:
    return ModelSlot("m", "ns", defaults, CEILING)


def _static(knobs: Knobs, replicas: int = 2) -> Decision:
    """A decision of the static policy: the configured defaults."""
    return Decision("m", 0.0, True, replicas, knobs, (), Reason.KNOBS_STATIC)


class GenerationFollower:
    """An engine that applies the served knobs only when the generation grows."""

    def __init__(self, start: Knobs) -> None:
        self.knobs, self.generation = start, 0

    def poll(self, board: DecisionBoard) -> None:
        p = board.get("m")
        if p.generation > self.generation:
            self.knobs, self.generation = p.knobs, p.generation


def test_static_policy_default_changes_reach_an_engine_that_follows_generations() -> None:
    first, second, third = Knobs(64, 4096), Knobs(32, 2048), Knobs(128, 8192)
    board = DecisionBoard([_slot(first)])
    engine = GenerationFollower(first)  # started with the defaults (`governor engine-args`)
    board.apply([_static(first)])
    assert board.get("m").generation == 0  # nothing changed yet

    board.configure([_slot(second)])  # an operator edits the defaults
    assert (board.get("m").knobs, board.get("m").generation) == (second, 1)
    board.apply([_static(second)])
    assert board.get("m").generation == 1  # the same knobs again: no new generation
    engine.poll(board)
    assert engine.knobs == second

    board.configure([_slot(third)])  # and again: the static decision brings them
    board.apply([_static(third)])
    engine.poll(board)
    assert (engine.knobs, engine.generation) == (third, 2)


def test_defaults_changed_while_down_are_served_in_a_new_generation_after_restart() -> None:
    old, new = Knobs(64, 4096), Knobs(32, 2048)
    saved = Published("m", "ns", old, 0, 3, "KNOBS_STATIC", 100.0)  # the last run's state
    board = DecisionBoard([_slot(new)])  # restarted with new defaults
    board.restore({"m": saved}, origin=ORIGIN_RESTORED)
    p = board.get("m")
    assert (p.knobs, p.generation, p.replicas) == (new, 1, 3)
    engine = GenerationFollower(old)  # still runs what the last run served
    engine.poll(board)
    assert engine.knobs == new
    same = Published("m", "ns", new, 0, 3, "KNOBS_STATIC", 100.0)
    fresh = DecisionBoard([_slot(new)])
    fresh.restore({"m": same}, origin=ORIGIN_RESTORED)
    assert fresh.get("m").generation == 0  # unchanged defaults stay generation 0
