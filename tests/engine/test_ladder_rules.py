"""The capacity ladder's judgement of a rung (tests/engine/capacity.py), without an
engine: a rung is within the SLA only when the engine's histograms say so and the server
finished what was sent."""

from __future__ import annotations

import math

from tests.engine.capacity import KEEP_UP_FRAC, KEEP_UP_Z, Rung, served_within_sla


def _rung(done_rps: float, sent_rps: float, ttft: float = 1.0, tpot: float = 1.0) -> Rung:
    return Rung(15.5, ttft, tpot, finished=78, done_rps=done_rps, sent_rps=sent_rps)


def test_a_rung_the_server_fell_behind_on_is_past_capacity() -> None:
    # Measured on the 2-core machine: 15.5 req/s offered, 8.44 finished, every TTFT in.
    assert not _rung(8.44, 15.5).within_sla
    assert _rung(12.95, 12.9).within_sla  # kept up (finished a little more than sent)
    # 10 req/s over the 9 s judged: 90 sent, the bar 0.85 x 90 - 2 x sqrt(90) = 57.5
    bar = (KEEP_UP_FRAC * 90.0 - KEEP_UP_Z * math.sqrt(90.0)) / 9.0
    assert _rung(bar, 10.0).within_sla
    assert not _rung(bar - 0.01, 10.0).within_sla


def test_a_rung_short_of_the_fraction_by_the_counts_noise_kept_up() -> None:
    """A quiet run's ladder ended at 6.2 req/s on 7.5 sent and 6.55 finished per second
    over 9 s (0.84 of it, every TTFT within the SLA), where the engine serves ~66: 70
    requests are too few to read 0.84 as falling behind."""
    assert _rung(6.55, 7.77).within_sla
    assert not _rung(0.55 * 70.6, 70.6).within_sla  # 80 req/s asked: fell behind


def test_the_histograms_still_judge_a_rung_the_server_kept_up_with() -> None:
    assert not _rung(12.9, 12.9, ttft=0.94).within_sla
    assert not _rung(12.9, 12.9, tpot=0.94).within_sla


def test_the_capacity_measured_is_the_load_the_engine_was_offered() -> None:
    """The load generator on the busy 2-core machine sent 23.9 req/s of 32.1 asked: the
    engine served 23.9 within the SLA, not 32.1."""
    assert Rung(32.1, 1.0, 1.0, finished=209, done_rps=23.2, sent_rps=23.9).offered_rps == 23.9
    assert Rung(15.5, 1.0, 1.0, finished=78, done_rps=15.9, sent_rps=16.1).offered_rps == 15.5


def test_the_capacity_measured_is_the_most_served_within_the_sla() -> None:
    """The highest rate served within the SLA up to the first rung past it: completions,
    at most the load offered. Not the last rung's offer: ci16's generator sent 56.6 of
    79.9 asked after the engine had served 63.6 of 66.6 a rung before, and ci3's last
    rung within the SLA passed sending 62.9 while the engine finished 55.4."""
    assert Rung(66.6, 1.0, 1.0, finished=574, done_rps=63.6, sent_rps=63.6).served_rps == 63.6
    assert Rung(62.9, 1.0, 1.0, finished=499, done_rps=55.4, sent_rps=62.9).served_rps == 55.4
    ladder = [
        Rung(46.2, 1.0, 1.0, finished=384, done_rps=41.1, sent_rps=42.9),
        Rung(66.6, 1.0, 1.0, finished=574, done_rps=63.6, sent_rps=63.6),
        Rung(79.9, 1.0, 1.0, finished=474, done_rps=51.5, sent_rps=56.6),
        Rung(95.8, 0.878, 1.0, finished=559, done_rps=61.6, sent_rps=65.7),
        Rung(120.0, 1.0, 1.0, finished=900, done_rps=99.0, sent_rps=99.0),  # after: not read
    ]
    assert served_within_sla(ladder) == 63.6
    assert served_within_sla(ladder[3:]) is None


def test_a_rung_past_the_sla_that_its_confirmation_passes_does_not_end_the_ladder() -> None:
    """ci-20261205T0526's ladder ended at 115 req/s asked on 92.8 % of first tokens
    within the SLA (a 4 s transient; the engine finished 116.4 a second of 102.5 sent).
    Judged again over that stretch and one more rung (`confirm`), a transient passes
    and the ladder goes on; an engine past its capacity fails the confirmation too, and
    the ladder ends at the rung before, as it did before confirmations."""
    before = Rung(95.8, 1.0, 1.0, finished=844, done_rps=93.9, sent_rps=92.8)
    past = Rung(115.0, 0.928, 1.0, finished=1040, done_rps=116.4, sent_rps=102.5)
    passed = Rung(115.0, 0.962, 1.0, 2000, 110.2, 108.0, judged_s=21.0, confirms=True)
    failed = Rung(115.0, 0.90, 1.0, 2000, 110.2, 108.0, judged_s=21.0, confirms=True)
    higher = Rung(138.0, 1.0, 1.0, finished=1200, done_rps=128.0, sent_rps=130.0)
    assert not past.within_sla and passed.within_sla
    assert served_within_sla([before, past, passed, higher]) == 128.0
    assert served_within_sla([before, past, passed]) == 108.0
    assert served_within_sla([before, past, failed, higher]) == 92.8
    assert served_within_sla([before, past]) == 92.8  # runs recorded before confirmations
    # a confirmation stands only for the rung it follows: a later rung past the SLA
    # with no confirmation still ends the ladder
    assert served_within_sla([before, past, passed, Rung(138.0, 0.5, 1.0, 9, 9.0, 9.0)]) == 108.0
