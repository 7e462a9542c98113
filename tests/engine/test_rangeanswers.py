"""A replay's range-query client (tests/engine/rangeanswers.py): the replay it serves
is the one instant queries give, decision for decision, and an instant it cannot answer
from a range is sent as the instant query it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tests.engine.replay as replay_module
from tests.engine.rangeanswers import RangeAnswers
from tests.engine.recorded import recorded_names, world


@pytest.mark.prometheus
def test_a_recorded_run_replays_through_ranges_as_through_instant_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recorded run's first three rungs (a real Prometheus on its TSDB), replayed with
    every tick's window readings: through `RangeAnswers` (one range query per query
    text, no instant query) exactly as through the source's own client, tick by tick."""
    result = world(recorded_names()[-1], tmp_path / "w")
    result["rungs"] = result["rungs"][:3]
    del result["step_started_unix_s"]
    made: list[RangeAnswers] = []
    plain_client = replay_module._client

    def client(*args: Any) -> RangeAnswers | None:
        c = plain_client(*args)
        if c is not None:
            made.append(c)
        return c

    monkeypatch.setattr(replay_module, "_client", client)
    ranged = replay_module.replay_world(result, windows=True)
    instant = replay_module.replay_world(result, windows=True, instant=True)

    assert len(made) == 1 and made[0].fallbacks == 0
    assert 0 < made[0].ranges <= 12  # the queries of a tick, each asked once
    assert len(ranged.rungs) == 3 and all(r.capacity_rps for r in ranged.rungs)
    assert sum(w.speed_window is not None for w in ranged.windows) >= 5
    assert ranged == instant


class _Inner:
    """The instant queries sent past the ranges."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        raise AssertionError("not on this path")

    def query_body(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bytes:
        self.sent.append((query, (params or {})["time"]))
        return b"{}"


@pytest.mark.parametrize("at", ["102.500", "99.000", "205.000"])
def test_an_instant_off_the_grid_is_sent_as_the_instant_query_it_is(at: str) -> None:
    """Between two steps, before the grid's start, past its end: the inner client's
    instant query, no range asked (the URL is never reached)."""
    inner = _Inner()
    client = RangeAnswers(inner, "http://127.0.0.1:9/unreachable", 100.0, 200.0, 5.0)
    assert client.query_body("up", {"time": at}) == b"{}"
    assert inner.sent == [("up", at)]
    assert (client.fallbacks, client.ranges) == (1, 0)


def test_a_grid_that_is_no_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="bad grid"):
        RangeAnswers(_Inner(), "http://x", 100.0, 200.0, 0.0)
