"""The plant apart from the belief (speed, server overhead, cold start), the scrape
resolution, and the calibration signals SimulatedSource fills, against ground truth."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from controller.config import SLA
from controller.types import Knobs
from estimators.stepmodel import load_profile
from estimators.types import ModelQuery, Observation
from service.cli import main
from simulator.engine import Engine
from simulator.fleet import Fleet
from simulator.metrics import SimulatedSource
from simulator.plant import Plant
from simulator.scenario import Scenario, run_policy
from simulator.traces import Trace, synthetic

MODEL = "llama"


def _one_request(profile_speed: float, overhead_ms: float) -> tuple[float, float]:
    """(TTFT, e2e) of one 1,000-token prompt with 10 output tokens on an idle fleet."""
    plant = Plant(speed=profile_speed, overhead_ms=overhead_ms)
    belief = load_profile()
    fleet = Fleet(plant.profile(belief), overhead_s=plant.overhead_s(belief))
    fleet.submit(1.0, 1000, 10)
    fleet.run()
    rec = fleet.records()
    return float(rec.ttft_s[0]), float(rec.e2e_s[0])


def test_plant_speed_multiplies_every_step_and_keeps_the_belief() -> None:
    belief = load_profile()
    slow = Plant(speed=1.3).profile(belief)
    assert slow.name == belief.name  # the decider still loads the belief by name
    assert load_profile(belief.name).step_time == belief.step_time != slow.step_time
    for key, v in belief.step_time.model_dump().items():
        assert getattr(slow.step_time, key) == pytest.approx(1.3 * v)
    t1, e1 = _one_request(1.0, 0.0)
    t13, e13 = _one_request(1.3, 0.0)
    assert t13 == pytest.approx(1.3 * t1) and e13 == pytest.approx(1.3 * e1)


def test_overhead_is_added_before_the_first_token() -> None:
    t0, e0 = _one_request(1.0, 0.0)
    t30, e30 = _one_request(1.0, 30.0)
    assert t30 - t0 == pytest.approx(0.030) and e30 - e0 == pytest.approx(0.030)


def test_engine_ttft_metric_includes_the_overhead() -> None:
    eng = Engine(load_profile(), Knobs(1024, 8192), overhead_s=0.03)
    eng.enqueue(eng.log.add(0.0, 500, 2), 0.0, 500, 2)
    eng.advance_to(10.0)
    ttft_engine = eng.metrics.ttft_sum
    assert ttft_engine == pytest.approx(eng.log.first_token_s[0] + 0.03)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        pytest.param({"speed": 0.0}, "speed", id="zero-speed"),
        pytest.param({"speed": math.nan}, "speed", id="nan-speed"),
        pytest.param({"overhead_ms": -1.0}, "overhead_ms", id="negative-overhead"),
        pytest.param({"cold_start_factor": math.inf}, "cold_start_factor", id="inf-cold"),
        pytest.param({"router": "kube-proxy"}, "router must be one of", id="unknown-router"),
        pytest.param({"rollout": "recreate"}, "rollout must be one of", id="unknown-rollout"),
    ],
)
def test_plant_refuses_bad_values(kwargs: dict[str, float | str], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Plant(**kwargs)


def test_scenario_defaults_start_at_min_replicas_and_scrape_every_15s() -> None:
    trace = synthetic("poisson", seed=1, rate=2.0, duration=60.0)
    sc = Scenario(trace=trace, sla=SLA(ttft_p95_ms=500, itl_p95_ms=50), min_replicas=2)
    assert sc.initial_replicas == 2 and sc.scrape_interval_s == 15.0
    cold = Scenario(trace=trace, sla=sc.sla, plant=Plant(cold_start_factor=2.0), cold_start_s=40)
    fleet = cold.make_fleet(0)
    fleet.scale_to(1)
    assert fleet.replicas[0].ready_s == pytest.approx(80.0)  # plant: 2 x the configured
    assert cold.governor_config().models[0].cold_start_s == 40.0  # belief: configured


def test_every_policy_sees_the_plant_and_the_scrape() -> None:
    """A 2x slower plant at least doubles a baseline's ITL (longer steps, and bigger
    batches behind them); the metric source scrapes at the scenario's interval for
    every policy."""
    trace = synthetic("poisson", seed=2, rate=6.0, duration=120.0)
    sla = SLA(ttft_p95_ms=500, itl_p95_ms=50)
    itl = {}
    for speed in (1.0, 2.0):
        sc = Scenario(
            trace=trace, sla=sla, static_replicas=1, drain_tail_s=30, plant=Plant(speed=speed)
        )
        itl[speed] = run_policy("static", sc).itl_p95_ms
    assert itl[2.0] > 1.9 * itl[1.0]
    seen: list[float] = []

    def on_sync(t: float, fleet: Fleet, policy: object) -> None:
        src = policy.source  # type: ignore[attr-defined]
        seen.extend(s.t_s for s in src.samples if s.t_s not in seen)

    sc = Scenario(trace=trace, sla=sla, drain_tail_s=0, scrape_interval_s=30.0)
    run_policy("hpa-queue", sc, on_sync=on_sync)
    assert np.diff(sorted(seen)).min() == pytest.approx(30.0)


@pytest.fixture(scope="module")
def observed() -> tuple[Fleet, Observation]:
    fleet = Fleet(initial_replicas=2)
    src = SimulatedSource(fleet, MODEL, window_s=60.0, scrape_interval_s=15.0)
    fleet.submit_trace(synthetic("poisson", seed=5, rate=20.0, duration=700.0))
    fleet.advance_to(600.0)
    obs = src.observe([ModelQuery(MODEL, ttft_sla_s=0.25, itl_sla_s=0.05)], 600.0)[MODEL]
    assert isinstance(obs, Observation)
    return fleet, obs


def test_calibration_signals_match_ground_truth(observed: tuple[Fleet, Observation]) -> None:
    fleet, obs = observed
    rec = fleet.records()
    t0, t1 = 555.0, 600.0  # first and last scrape in (540, 600]
    fin = (rec.finish_s > t0) & (rec.finish_s <= t1)
    first = (rec.first_token_s > t0) & (rec.first_token_s <= t1)
    ttft = rec.first_token_s - rec.arrival_s
    assert obs.ttft_mean_ms == pytest.approx(1000 * ttft[first].mean(), rel=1e-6)
    decode = rec.finish_s - rec.first_token_s
    assert obs.decode_time_mean_ms == pytest.approx(1000 * decode[fin].mean(), rel=1e-6)
    prefill = rec.first_token_s - rec.sched_s
    assert obs.prefill_time_mean_ms == pytest.approx(1000 * prefill[fin].mean(), rel=1e-6)
    queue = rec.sched_s - rec.arrival_s
    assert obs.queue_time_mean_ms == pytest.approx(1000 * queue[fin].mean(), rel=1e-6)
    multi = fin & (rec.output_tokens > 1)
    tpot = np.where(multi, decode / np.maximum(rec.output_tokens - 1, 1), 0.0)
    assert obs.tpot_attainment_frac == pytest.approx(np.mean(tpot[fin] <= 0.05))
    # every gap between tokens of a request is one decode step: the ITL mean is the
    # token-weighted mean of the requests' mean ITL (no preemption at this load)
    assert rec.preemptions.sum() == 0
    assert obs.itl_mean_ms is not None and 5.0 < obs.itl_mean_ms < 50.0
    assert obs.step_tokens_mean is not None and obs.step_tokens_mean >= 1.0
    for d in (obs.ttft_dist, obs.itl_dist, obs.e2e_dist):
        assert d is not None and d.p50_ms <= d.p90_ms <= d.p95_ms <= d.p99_ms  # type: ignore[operator]
    arrived_5m = ((rec.arrival_s > 300.0) & (rec.arrival_s <= 600.0)).sum()
    assert obs.arrival_rate_5m_rps == pytest.approx(arrived_5m / 285.0, rel=0.1)
    assert obs.targets_up == 2 and obs.targets_down == 0


def test_short_window_under_two_scrapes_is_no_data(observed: tuple[Fleet, Observation]) -> None:
    fleet = Fleet(initial_replicas=1)
    src = SimulatedSource(fleet, MODEL, scrape_interval_s=15.0, short_window_s=10.0)
    fleet.submit_trace(synthetic("poisson", seed=5, rate=5.0, duration=100.0))
    fleet.advance_to(90.0)
    obs = src.observe([ModelQuery(MODEL)], 90.0)[MODEL]
    assert isinstance(obs, Observation) and obs.arrival_rate_short_rps is None


def test_an_engine_that_vanishes_from_the_scrape_is_a_down_target() -> None:
    fleet = Fleet(initial_replicas=3)
    src = SimulatedSource(fleet, MODEL, scrape_interval_s=5.0)
    fleet.submit_trace(Trace.from_arrays([1.0, 2.0], [100, 100], [5, 5], rebase=False))
    fleet.advance_to(20.0)
    live = fleet.live_engines
    fleet.live_engines = lambda: (x for x in live() if x[0] != 0)  # type: ignore[method-assign]
    fleet.advance_to(40.0)
    obs = src.observe([ModelQuery(MODEL)], 40.0)[MODEL]
    assert isinstance(obs, Observation)
    assert obs.targets_up == 2 and obs.targets_down == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(["--plant-speed", "0"], "--plant-speed must be > 0", id="zero-speed"),
        pytest.param(["--plant-overhead-ms", "-5"], "must be >= 0", id="negative-overhead"),
        pytest.param(["--scrape-interval-s", "nan"], "--scrape-interval-s", id="nan-scrape"),
        pytest.param(["--plant-router", "dns"], "--plant-router: invalid choice", id="router"),
        pytest.param(
            ["--plant-rollout", "recreate"], "--plant-rollout: invalid choice", id="rollout"
        ),
    ],
)
def test_simulate_plant_flags_refuse_bad_values(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", *args])
    assert exc.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--min-replicas", "3", "--start-replicas", "2"], "--start-replicas 2 is outside"),
        (["--max-replicas", "4", "--start-replicas", "100"], "--start-replicas 100 is outside"),
        (["--min-replicas", "5", "--max-replicas", "2"], "--min-replicas 5 is above"),
        (["--max-replicas", "4", "--static-replicas", "9"], "--static-replicas 9 is above"),
        (["--matrix", "--trace", "azure:code"], "--trace: not read with --matrix"),
        (["--matrix-quick", "--plot", "p.png"], "--plot: not read with --matrix"),
        (["--matrix", "--plant-router", "random"], "--plant-router: not read with --matrix"),
        (
            ["--matrix-quick", "--plant-speed-change", "60:1.3"],
            "--plant-speed-change: not read with --matrix",
        ),
        (
            ["--matrix", "--plant-rollout", "unavailable"],
            "--plant-rollout: not read with --matrix",
        ),
        (["--workers", "3"], "--workers: read only with --matrix"),
        (["--matrix-traces", "conv x16"], "--matrix-traces: read only with --matrix"),
        (["--matrix-combined", "--trace", "azure:code"], "--trace: not read with --matrix"),
        (["--matrix", "--matrix-combined"], "--matrix and --matrix-combined: choose one"),
    ],
)
def test_simulate_refuses_what_it_would_ignore_or_contradict(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replica flags that contradict each other (min above max once raised a pydantic
    traceback; a start above max ran static at 100 replicas) and flags the chosen mode
    never reads (`--matrix --trace azure:code` ran the full matrix) exit 2, naming them,
    before anything runs."""
    assert main(["simulate", *args]) == 2
    assert needle in capsys.readouterr().err


def test_long_prompts_are_bounded_by_the_kv_cache() -> None:
    """16 prompts of 40k tokens at once: the profile's KV cache (29,043 blocks of 16)
    holds at most 11 such sequences (2,532 blocks each with their outputs), so the rest
    wait, and growing outputs preempt the newest; a lone 40k prefill costs the quadratic
    attention term (chunks of 8,192 tokens: 1.31e-6 ms x 40,000^2 / 2 = 1,048 ms of it)."""
    prof = load_profile()
    eng = Engine(prof, Knobs(256, 8192))
    for _ in range(16):
        eng.enqueue(eng.log.add(0.0, 40_000, 500), 0.0, 40_000, 500)
    eng.advance_to(20.0)
    assert eng.num_running <= prof.kv_capacity_blocks // (40_000 // 16) == 11
    assert eng.num_waiting >= 5 and eng.kv_usage_frac > 0.85
    eng.advance_to(600.0)
    assert eng.metrics.preemptions > 0 and eng.metrics.success == 16
    alone = Engine(prof, Knobs(256, 8192))
    alone.enqueue(alone.log.add(0.0, 40_000, 1), 0.0, 40_000, 1)
    alone.advance_to(10.0)
    attention_ms = prof.step_time.prefill_attention_ms_per_token2 * 40_000**2 / 2
    linear_ms = prof.step_time.per_token_ms * 40_000
    assert alone.log.first_token_s[0] * 1000 > attention_ms + linear_ms


def test_outputs_that_cannot_be_written_are_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A results path under a file, or a directory where the file goes, is a usage
    error naming it before anything runs (it was a traceback after the whole run, the
    results lost); missing folders below a writable one are still made."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cases = [
        (["simulate", "--json", str(blocker / "out.json")], "is a file, not a directory"),
        (["simulate", "--plot", str(tmp_path)], "is a directory"),
        # matplotlib picks the format by suffix: .xyz failed after the run, none wrote
        # PATH.png beside the PATH printed
        (
            ["simulate", "--json", str(tmp_path / "j.json"), "--plot", str(tmp_path / "p.xyz")],
            ".png",
        ),
        (["simulate", "--plot", str(tmp_path / "p2")], "name a .png file"),
        (["simulate", "--matrix-quick", "--json", str(tmp_path)], "is a directory"),
        (["calibrate", "--out", str(blocker / "c.md")], "is a file, not a directory"),
        (["demo", "--out", str(blocker)], "is a file"),
    ]
    for args, needle in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, (args, err)
    assert not (tmp_path / "j.json").exists()
    from simulator.outputs import output_problem

    assert output_problem("--json", str(tmp_path / "new" / "dir" / "x.json")) is None
