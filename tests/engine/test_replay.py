"""The replay of a kept capacity run (tests/engine/replay.py), without an engine: the
engine world's config, today's decider and a source that plays a ladder and a step."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from estimators.types import ModelQuery, Observation, ObservationResult
from tests.engine.capacity import LADDER_POLICY
from tests.engine.realengine import MODEL_NAME, governor_config
from tests.engine.replay import (
    FIRST_RUNG_S,
    LEAD_S,
    replay,
    replay_config,
    rung_means,
    window_report,
)

LADDER_END_S = 1_000.0
STEP_AT_S = 1_100.0


class PlayedRun:
    """One replica serving `rate_rps(now)`: 3 req/s through the ladder, 0 after it,
    150 req/s from the step (3 running, none waiting, 20 ms ITL before it)."""

    def __init__(self) -> None:
        self.ticks: list[float] = []

    @staticmethod
    def rate_rps(now_s: float) -> float:
        if now_s >= STEP_AT_S:
            return 150.0
        return 3.0 if now_s <= LADDER_END_S + 12.0 else 0.0

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        self.ticks.append(now_s)
        rate = self.rate_rps(now_s)
        obs = Observation(
            model=MODEL_NAME,
            observed_at_s=now_s,
            arrival_rate_rps=rate,
            arrival_rate_short_rps=rate,
            running=3.0 if rate else 0.0,
            waiting=0.0 if rate < 100 else 60.0,
            ready_replicas=1,
            targets_up=1,
            targets_down=0,
            itl_mean_ms=20.0 if rate else None,
            prompt_tokens_mean=32.0,
            prompt_tokens_p95=32.0,
            output_tokens_mean=16.0,
            output_tokens_p95=16.0,
        )
        return {m.name: obs for m in models}


def _rung(
    rate: float, ended: float, ttft: float = 1.0, sent: float | None = None
) -> dict[str, float]:
    return {
        "rate_rps": rate,
        "ttft_within": ttft,
        "tpot_within": 1.0,
        "finished": 27,
        "done_rps": rate,
        "sent_rps": rate if sent is None else sent,
        "gov_capacity_rps": 42.0,
        "judged_s": 9.0,
        "ended_unix_s": ended,
        "a_field_of_a_later_capacity_py": 1.0,
    }


def test_a_replay_reads_each_rung_at_its_end_and_counts_the_step_ticks(tmp_path: Path) -> None:
    (tmp_path / "governor.yaml").write_text(yaml.safe_dump(governor_config("http://kept:9090")))
    config = replay_config(tmp_path, "http://replayed:9090")
    assert str(config.prometheus.url).startswith("http://replayed:9090")
    assert config.policy.backlog_drain_s == LADDER_POLICY["backlog_drain_s"]
    result = {
        "rungs": [_rung(3.0, LADDER_END_S, sent=2.7), _rung(3.6, LADDER_END_S + 12.0, ttft=0.5)],
        "measured_capacity_rps": 3.0,  # what runs before session 11 recorded: the asked rate
        "step_started_unix_s": STEP_AT_S,
    }
    source = PlayedRun()
    out = replay(result, config, source)

    tick_s = config.policy.tick_interval_s
    assert source.ticks[0] == LADDER_END_S - FIRST_RUNG_S - LEAD_S
    assert all(b - a == tick_s for a, b in zip(source.ticks, source.ticks[1:], strict=False))
    assert [(r.rate_rps, r.within_sla) for r in out.rungs] == [(3.0, True), (3.6, False)]
    assert [r.at_s for r in out.rungs] == [LADDER_END_S, LADDER_END_S + 12.0]
    assert out.rungs[0].live_capacity_rps == 42.0
    # the last rung within the SLA is the measured one: its replayed capacity is kept
    assert out.capacity_rps is not None and out.capacity_rps == out.rungs[0].capacity_rps
    # measured: the load the engine was offered (the generator sent 2.7 of the 3 asked)
    assert out.measured_capacity_rps == 2.7
    assert out.over_measured == out.capacity_rps / 2.7
    # 150 req/s on one replica with a queue: a scale-up within the step's first ticks
    assert out.ticks_to_scale_up is not None and 1 <= out.ticks_to_scale_up <= 3


def test_windows_log_every_tick_and_change_no_decision(tmp_path: Path) -> None:
    """`replay(..., windows=True)` keeps each tick's window readings as the plant learning
    took them, the belief after each matching the rungs', and decides exactly as
    without them; the report puts each rung's end among the readings."""
    (tmp_path / "governor.yaml").write_text(yaml.safe_dump(governor_config("http://kept:9090")))
    config = replay_config(tmp_path, "http://replayed:9090")
    result = {
        "rungs": [_rung(3.0, LADDER_END_S), _rung(3.6, LADDER_END_S + 12.0, ttft=0.5)],
        "step_started_unix_s": STEP_AT_S,
    }
    plain = replay(result, config, PlayedRun())
    source = PlayedRun()
    logged = replay(result, config, source, windows=True)

    assert plain.windows == []
    assert [w.at_s for w in logged.windows] == source.ticks
    assert [(g.capacity_rps, g.speed) for g in logged.rungs] == [
        (g.capacity_rps, g.speed) for g in plain.rungs
    ]
    assert logged.ticks_to_scale_up == plain.ticks_to_scale_up
    # the ladder's windows (3 running, 20 ms) read the engine slower than the profile,
    # and what the speed learned is what each rung's end saw
    read = [w for w in logged.windows if w.speed_window is not None]
    assert read and all(w.speed_window == w.fit_window and w.speed_window > 1.0 for w in read)
    assert read[0].fit_parts is not None and read[0].fit_parts[0] == 20.0
    # each reading's belief is the one after its own tick: the jump to the slower speed
    # shows on the tick that confirms it, half a window after the reading that set it
    # pending (the second: the first tick has no time behind it, dt 0)
    jumped = next(w for w in logged.windows if w.speed > 1.0)
    assert jumped.speed == pytest.approx(jumped.speed_window)
    assert jumped.at_s - read[1].at_s == config.policy.window_s / 2.0
    at_end = {w.at_s: w for w in logged.windows}
    for g in logged.rungs:
        assert at_end[g.at_s].speed == g.speed and at_end[g.at_s].seq_ratio == g.seq_ratio
    lines = window_report(logged)
    assert sum(line.startswith("-- ") for line in lines) == len(logged.rungs)
    assert len(lines) == len(logged.rungs) + sum(
        any(
            v is not None for v in (w.speed_window, w.fit_window, w.clean_window, w.standing_window)
        )
        for w in logged.windows
    )


def test_rung_means_split_the_time_and_never_read_an_empty_window_as_zero() -> None:
    """Each histogram's mean over the rung (sum rate / count rate), the front end's
    share of TTFT and Little's law's batch; a histogram with no requests in the window
    (0 / 0 in PromQL) is unknown, and so is all that is derived from it."""
    asked: list[tuple[str, float]] = []
    seconds = {
        "time_to_first_token": 0.152,
        "queue_time": 0.0415,
        "prefill_time": 0.060,
        "decode_time": 0.6785,
        "inter_token": 0.0446,
    }

    def query(expr: str, at_s: float) -> float | None:
        asked.append((expr, at_s))
        if "request_success_total" in expr:
            return 33.1
        (value,) = (v for k, v in seconds.items() if k in expr)
        return value

    got = rung_means(query, 500.0, 12.04)
    assert {at for _, at in asked} == {500.0}
    assert all("[12s]" in expr for expr, _ in asked)
    assert got["ttft_ms"] == pytest.approx(152.0) and got["itl_ms"] == pytest.approx(44.6)
    assert got["done_rps"] == 33.1
    assert got["frontend_ms"] == pytest.approx(152.0 - 41.5 - 60.0)
    assert got["little_running"] == pytest.approx(33.1 * (60.0 + 678.5) / 1000.0)

    seconds["prefill_time"] = float("nan")  # no request prefilled within the window
    got = rung_means(query, 500.0, 12.0)
    assert got["prefill_ms"] is None
    assert got["frontend_ms"] is None and got["little_running"] is None


class EarlierWorkload(PlayedRun):
    """PlayedRun whose ticks before `until_s` carry another workload's lengths
    (16-token prompts, 64-token outputs), as the world's earlier tests leave them in
    `make test`."""

    def __init__(self, until_s: float) -> None:
        super().__init__()
        self.until_s = until_s

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        out = super().observe(models, now_s)
        if now_s >= self.until_s:
            return out
        return {
            name: dataclasses.replace(
                obs,
                prompt_tokens_mean=16.0,
                prompt_tokens_p95=16.0,
                output_tokens_mean=64.0,
                output_tokens_p95=64.0,
            )
            for name, obs in out.items()
            if isinstance(obs, Observation)
        }


def test_the_ladder_prices_its_own_requests_not_an_earlier_workloads(tmp_path: Path) -> None:
    """LADDER_POLICY smooths the lengths over one window: the capacity read at the
    ladder's end is that of the ladder's requests (16-token outputs), not of the
    workload before it (fails at the default 300 s half-life: half a minute of 64-token
    outputs before a two-minute ladder read 42.0 req/s where its own requests give
    79.5)."""
    (tmp_path / "governor.yaml").write_text(yaml.safe_dump(governor_config("http://kept:9090")))
    config = replay_config(tmp_path, "http://replayed:9090")
    ends = [LADDER_END_S - 12.0 * k for k in range(10, -1, -1)]  # two minutes of rungs
    result = {"rungs": [_rung(3.0, end) for end in ends], "step_started_unix_s": None}
    clean = replay(result, config, PlayedRun()).capacity_rps
    start = ends[0] - FIRST_RUNG_S - LEAD_S  # the replay's first tick
    after = replay(result, config, EarlierWorkload(until_s=start + 30.0)).capacity_rps
    assert clean is not None and after is not None
    assert after == pytest.approx(clean, rel=0.03)
