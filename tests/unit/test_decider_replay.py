"""The decider reproduces its recorded decisions over the conv and code traces.

Inputs (observations, tick times, config, profile, initial state) were recorded from the
simulator; the replay is open-loop and exact: every field of every decision and the final
saved state must match. An intended change of behaviour re-blesses the recording (see
tests/unit/decider_replay.py) and says so in its commit message.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.decider_replay import PATH, replay

DATA = json.loads(PATH.read_text())


@pytest.mark.parametrize("name", sorted(DATA))
def test_decisions_replay_bit_for_bit(name: str) -> None:
    entry = DATA[name]
    decisions, final = replay(entry)
    assert len(decisions) == len(entry["decisions"]) > 100
    for i, (got, want) in enumerate(zip(decisions, entry["decisions"], strict=True)):
        assert got == want, f"{name}: tick {i} at {want['at_s']} s differs"
    assert final == entry["final_state"]
