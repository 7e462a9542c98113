"""The capacity ladder's judgement of a rung (tests/engine/capacity.py), without an
engine: a rung is within the SLA only when the engine's histograms say so and the server
finished what was sent."""

from __future__ import annotations

from tests.engine.capacity import KEEP_UP_FRAC, Rung


def _rung(done_rps: float, sent_rps: float, ttft: float = 1.0, tpot: float = 1.0) -> Rung:
    return Rung(15.5, ttft, tpot, finished=78, done_rps=done_rps, sent_rps=sent_rps)


def test_a_rung_the_server_fell_behind_on_is_past_capacity() -> None:
    # Measured on the 2-core machine: 15.5 req/s offered, 8.44 finished, every TTFT in.
    assert not _rung(8.44, 15.5).within_sla
    assert _rung(12.95, 12.9).within_sla  # kept up (finished a little more than sent)
    assert _rung(KEEP_UP_FRAC * 10.0, 10.0).within_sla
    assert not _rung(KEEP_UP_FRAC * 10.0 - 0.01, 10.0).within_sla


def test_the_histograms_still_judge_a_rung_the_server_kept_up_with() -> None:
    assert not _rung(12.9, 12.9, ttft=0.94).within_sla
    assert not _rung(12.9, 12.9, tpot=0.94).within_sla
