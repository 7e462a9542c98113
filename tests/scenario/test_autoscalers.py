"""Baseline autoscalers' arithmetic (HPA, KEDA, KPA), flaps, scenario runs and the oracle."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from controller.config import SLA, ScalingPolicy
from controller.types import Knobs
from estimators.stepmodel import load_profile
from service.cli import main
from simulator.autoscalers import Kpa, _HpaCore
from simulator.oracle import oracle, scenario_oracle, window_replicas
from simulator.plant import Plant
from simulator.scenario import Scenario, count_flaps, run_policy
from simulator.traces import Trace, load_trace

SLA_STD = SLA(ttft_p95_ms=500, itl_p95_ms=50)


@pytest.mark.parametrize(
    ("ratio", "current", "want"),
    [
        pytest.param(1.05, 4, 4, id="within-tolerance"),
        pytest.param(1.5, 4, 6, id="ceil-of-ratio"),
        pytest.param(10.0, 2, 6, id="rate-limited-to-max-100pct-or-4"),
        pytest.param(None, 4, None, id="missing-metric-no-action"),
        pytest.param(float("nan"), 4, None, id="nan-metric-no-action"),
    ],
)
def test_hpa_core_first_sync(ratio: float | None, current: int, want: int | None) -> None:
    assert _HpaCore(1, 20).desired(ratio, current, 100.0, current) == want


def test_hpa_core_scale_down_waits_300s_for_max_of_window() -> None:
    hpa = _HpaCore(1, 20)
    assert hpa.desired(2.0, 4, 0.0, 4) == 8
    assert hpa.desired(0.25, 8, 15.0, 8) == 8  # recommendation 8 from t=0 still in window
    assert hpa.desired(0.25, 8, 299.0, 8) == 8
    assert hpa.desired(0.25, 8, 316.0, 8) == 2  # window passed; -100 % per 15 s allows it


def test_hpa_core_multiplies_the_ready_pods_not_those_starting() -> None:
    """Kubernetes' replica calculator: ceil(usageRatio x readyPodCount). Found in review
    (session 15): the simulated HPAs multiplied every replica, starting ones included,
    so a metric that stays high while new replicas start doubled the fleet at each
    15 s sync (hpa-gpu on conversation x4: 2 -> 3 -> 5 -> 8 -> ... -> 64)."""
    hpa = _HpaCore(1, 64)
    assert hpa.desired(2.0, 2, 0.0, 2) == 4
    # 15 s later the two new replicas still start: the same ratio on 2 ready pods
    assert hpa.desired(2.0, 4, 15.0, 2) == 4
    # once they serve and the metric is still 2x, the four ready pods ask for 8
    assert hpa.desired(2.0, 4, 30.0, 4) == 8
    # no ready pod reports the metric: no action
    assert hpa.desired(2.0, 4, 45.0, 0) is None


class _FakeEngine:
    def __init__(self, running: int, waiting: int) -> None:
        self.num_running, self.num_waiting = running, waiting


class _FakeFleet:
    def __init__(self, ready: int, per_engine: tuple[int, int]) -> None:
        self.ready_replicas = ready
        self.router_queue_len = 0
        self.per_engine = per_engine

    def live_engines(self):
        return [(i, _FakeEngine(*self.per_engine)) for i in range(self.ready_replicas)]


def test_kpa_stable_target_is_70_per_pod() -> None:
    fleet = _FakeFleet(2, (70, 0))
    kpa = Kpa(fleet, "m", 1, 50)  # type: ignore[arg-type]
    assert kpa.evaluate(0.0) == 2  # 140 in flight / 70 per pod


def test_kpa_panics_on_double_and_never_scales_down_in_panic() -> None:
    fleet = _FakeFleet(2, (70, 0))
    kpa = Kpa(fleet, "m", 1, 50)  # type: ignore[arg-type]
    for t in range(0, 60, 2):
        kpa.evaluate(float(t))
    fleet.per_engine = (350, 0)  # 700 in flight; the 6 s panic window averages 140,140,700
    want = kpa.evaluate(60.0)
    assert kpa.panic_since == 60.0 and want == 5  # ceil(326.7 / 70)
    fleet.per_engine = (0, 0)
    for t in range(62, 120, 2):  # in panic (held for the 60 s stable window): no scale-down
        assert kpa.evaluate(float(t)) == 5
    # the 6 s window still saw 2x at t=64; panic ends 60 s later, with no load in the window
    assert kpa.evaluate(124.0) == 1


@pytest.mark.parametrize(
    ("actions", "flaps"),
    [
        pytest.param([(0, 2), (100, -1)], 1, id="up-then-down-within-10min"),
        pytest.param([(0, 2), (700, -1)], 0, id="reversal-after-10min"),
        pytest.param([(0, 1), (60, 1), (120, 1)], 0, id="monotone"),
        pytest.param([(0, 1), (60, -1), (120, 1), (180, -1)], 3, id="sawtooth"),
        pytest.param([], 0, id="none"),
    ],
)
def test_count_flaps(actions: list[tuple[float, int]], flaps: int) -> None:
    assert count_flaps(actions) == flaps


@pytest.fixture(scope="module")
def small_trace() -> Trace:
    return load_trace("synthetic:step:low=10,high=40,duration=300", seed=3)


@pytest.mark.parametrize("policy", ["governor", "hpa-gpu", "hpa-queue", "keda", "kpa", "static"])
def test_every_policy_runs_and_scores(policy: str, small_trace: Trace) -> None:
    sc = Scenario(
        trace=small_trace, sla=SLA_STD, start_replicas=1, static_replicas=3, drain_tail_s=120
    )
    r = run_policy(policy, sc)
    assert r.requests == len(small_trace)
    assert 0.0 <= r.slo_attainment <= 1.0
    # at least one replica from t=0 to the end of the run
    assert r.gpu_hours >= sc.end_s / 3600 - 1e-9
    assert r.flaps <= r.scaling_actions
    if policy == "static":
        assert r.gpu_hours == pytest.approx(3 * sc.end_s / 3600, rel=1e-6)


def test_governor_reacts_to_a_step_within_two_ticks_and_is_not_dominated() -> None:
    """A 4x step at t=150 s on one replica: the panic window sees it at the next tick;
    the cold start (45 s) still costs attainment, for every policy. No baseline reaches
    the governor's attainment with fewer GPU-hours. (8 req/s before the step: one
    replica serves about 11 at the 99 % goal with the 0.85 headroom; 10 already asked
    for a second replica before the step.)"""
    trace = load_trace("synthetic:step:low=8,high=32,duration=300,at=0.5", seed=3)
    # 5 s scrapes: the 10 s panic window needs two samples (issue 10 item 4 lifts this).
    sc = Scenario(
        trace=trace, sla=SLA_STD, start_replicas=1, drain_tail_s=120, scrape_interval_s=5.0
    )
    first_up: list[float] = []

    def on_sync(t: float, fleet, policy) -> None:
        if fleet.active_replicas > 1 and not first_up:
            first_up.append(t)

    gov = run_policy("governor", sc, on_sync=on_sync)
    assert first_up and 150.0 < first_up[0] <= 150.0 + 2 * 5.0 + 15.0  # two ticks + one sync
    assert gov.flaps == 0 and max(gov.series["total"]) >= 3
    for name in ("hpa-gpu", "hpa-queue", "keda", "kpa"):
        other = run_policy(name, sc)
        dominated = other.slo_attainment >= gov.slo_attainment and other.gpu_hours < gov.gpu_hours
        assert not dominated, (name, other.summary(), gov.summary())


def test_governor_starting_on_a_bigger_fleet_waits_the_window_to_scale_down() -> None:
    """Four replicas up and little load: the first tick has no data (one scrape), so the
    loop starts from the fleet's size, and nothing is scaled down inside the 300 s
    stabilization window (before, the first decision treated the fleet as min replicas
    and halved it at the first HPA sync)."""
    trace = load_trace("synthetic:poisson:rate=2,duration=400", seed=4)
    sc = Scenario(trace=trace, sla=SLA_STD, start_replicas=4, drain_tail_s=0)
    r = run_policy("governor", sc)
    early = [n for t, n in zip(r.series["t"], r.series["total"], strict=True) if t < 300.0]
    assert early and min(early) == 4
    assert r.series["total"][-1] < 4  # it does scale down once the window has passed


def test_settling_tail_runs_until_no_scale_down_is_pending() -> None:
    """After the load stops the governor scales down once its stabilization window has
    passed; the settling tail follows it there (the series end with the count it holds
    and no scale-down pending) and leaves the scores of the scored window unchanged."""
    trace = load_trace("synthetic:poisson:rate=30,duration=240", seed=2)
    sc = Scenario(trace=trace, sla=SLA_STD, start_replicas=3, drain_tail_s=60)
    plain = run_policy("governor", sc)
    tail = run_policy("governor", sc, settle_max_s=1800)
    assert plain.settled_s is None
    assert tail.settled_s is not None and tail.settled_s > sc.end_s
    assert tail.settled_replicas is not None
    assert tail.settled_replicas < tail.series["total"][0] == 3
    assert tail.series["total"][-1] == tail.series["desired"][-1] == tail.settled_replicas
    assert tail.series["t"][-1] == tail.settled_s
    for key in ("slo_attainment", "gpu_hours", "scaling_actions", "flaps"):
        assert getattr(tail, key) == getattr(plain, key), key


def test_oracle_more_load_needs_more_replicas() -> None:
    p = load_profile()
    k = Knobs(160, 2560)
    light = load_trace("synthetic:poisson:rate=5,duration=60", seed=1)
    heavy = load_trace("synthetic:poisson:rate=60,duration=60", seed=1)
    n_light = window_replicas((light, p, k, SLA_STD, 32, 0, 0.0, "least-outstanding", 0.0))
    n_heavy = window_replicas((heavy, p, k, SLA_STD, 32, 0, 0.0, "least-outstanding", 0.0))
    assert 1 <= n_light < n_heavy
    empty = Trace(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert window_replicas((empty, p, k, SLA_STD, 32, 0, 0.0, "least-outstanding", 0.0)) == 0
    res = oracle(heavy, p, k, SLA_STD, workers=1)
    assert res.replicas == [n_heavy] and res.gpu_hours == pytest.approx(n_heavy / 60)


def test_the_oracle_runs_on_the_plants_router() -> None:
    """The oracle sizes each window behind the router the policies run behind: 60 req/s
    of conversation-like requests need 4 warm replicas behind the least-outstanding
    router and 6 when kube-proxy spreads them at random (each replica then queues on its
    own); a scenario's oracle takes the router from its plant."""
    p = load_profile()
    k = Knobs(160, 2560)
    heavy = load_trace("synthetic:poisson:rate=60,duration=60", seed=1)
    assert oracle(heavy, p, k, SLA_STD, workers=1).replicas == [4]
    assert oracle(heavy, p, k, SLA_STD, workers=1, router="random").replicas == [6]
    sc = Scenario(trace=heavy, sla=SLA_STD, plant=Plant(router="random"))
    assert scenario_oracle(sc, workers=1).replicas[0] > 4


def test_oracle_leaves_out_requests_no_count_could_serve() -> None:
    """A 16k-token prompt cannot meet a 100 ms TTFT on an idle replica: the oracle does
    not buy max_replicas for it (it still counts as a miss for every policy)."""
    p = load_profile()
    k = Knobs(160, 2560)
    sla = SLA(ttft_p95_ms=100, itl_p95_ms=50)
    hopeless = Trace.from_arrays([0.0], [16_000], [10])
    assert window_replicas((hopeless, p, k, sla, 32, 0, 0.0, "least-outstanding", 0.0)) == 0
    mixed = Trace.from_arrays([0.0, 1.0], [16_000, 100], [10, 10])
    assert window_replicas((mixed, p, k, sla, 32, 0, 0.0, "least-outstanding", 0.0)) == 1


def test_simulate_cli_writes_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    rc = main(
        [
            "simulate",
            "--trace",
            "synthetic:poisson:rate=8,duration=120",
            "--policies",
            "governor,static",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--no-progress",
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    for name in ("governor", "static"):
        for key in (
            "slo_attainment",
            "gpu_hours",
            "scaling_actions",
            "flaps",
            "ttft_p95_ms",
            "itl_p95_ms",
        ):
            assert key in doc["policies"][name]
    assert doc["oracle"]["gpu_hours"] > 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "governor" in printed
    # Two ratios to the oracle: the whole run's (drain tail included) and the trace's
    # minutes' (what the matrix's cells and the README quote), both in the table.
    gov = doc["policies"]["governor"]
    orc = doc["oracle"]["gpu_hours"]
    assert gov["oracle_ratio"] == pytest.approx(gov["gpu_hours"] / orc)
    assert gov["oracle_ratio_trace"] == pytest.approx(gov["gpu_hours_trace"] / orc)
    assert gov["oracle_ratio_trace"] < gov["oracle_ratio"]
    row = next(line for line in printed.splitlines() if line.startswith("governor "))
    assert "trace x oracle" in printed and f"{gov['oracle_ratio_trace']:.2f}" in row.split()


def test_simulate_cli_writes_each_governor_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--decisions F`: one JSON line per governor tick that decided (simulated seconds,
    a tick interval apart from the first data on), each with its stage trace and the
    explain text; the replicas decided are the last stage's output. Without the
    governor among the policies, or with a matrix, the flag is refused before any run."""
    out = tmp_path / "decisions.jsonl"
    argv = ["simulate", "--trace", "synthetic:poisson:rate=8,duration=120", "--no-oracle"]
    rc = main([*argv, "--policies", "governor,static", "--decisions", str(out), "--no-progress"])
    assert rc == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) >= 20
    times = [r["at_s"] for r in records]
    assert times[0] > 0 and all(b - a == 5.0 for a, b in itertools.pairwise(times))
    for r in records:
        assert r["valid"] and r["replicas"] == r["stages"][-1]["after"] >= 1
        assert r["stages"][0]["name"] == "raw" and r["stages"][0]["reason"]
        assert f"replicas={r['replicas']}" in r["explain"]
        assert r["max_num_seqs"] >= 1 and r["plant_speed"] is not None
    assert any(r["demand_rps"] and r["capacity_rps_per_replica"] for r in records)
    assert f"decisions: {out} ({len(records)} ticks)" in capsys.readouterr().out
    assert main([*argv, "--policies", "static", "--decisions", str(out)]) == 2
    assert "--decisions: the governor is not among --policies static" in capsys.readouterr().err
    assert main(["simulate", "--matrix-quick", "--decisions", str(out)]) == 2
    assert "--decisions: not read with --matrix" in capsys.readouterr().err


def test_a_decision_record_is_json_whatever_its_numbers() -> None:
    """A number with no JSON form (an infinite raw count, a NaN) is written as null,
    so every line of `--decisions` parses as strict JSON."""
    from controller.types import Decision, Knobs, Reason
    from simulator.report import decision_record

    d = Decision(
        model="m",
        at_s=5.0,
        valid=True,
        replicas=2,
        knobs=Knobs(8, 512),
        stages=(),
        knob_reason=Reason.KNOBS_UNCHANGED,
        raw_replicas=math.inf,
        demand_rps=math.nan,
        capacity_rps_per_replica=3.5,
    )
    record = json.loads(json.dumps(decision_record(d), allow_nan=False))
    assert record["raw_replicas"] is None and record["demand_rps"] is None
    assert record["capacity_rps_per_replica"] == 3.5 and record["replicas"] == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        pytest.param(["--rate-scale", "-2"], "--rate-scale must be > 0", id="negative-rate"),
        pytest.param(["--policies", "hpa,foo"], "unknown policy hpa, foo", id="unknown-policy"),
        pytest.param(["--duration", "abc"], "--duration must be a number", id="nan-duration"),
    ],
)
def test_simulate_cli_bad_arguments_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", *args])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--trace", "synthetic:poisson", "--duration", "1", "--rate-scale", "3000"],
        ["demo", "--trace", "synthetic:poisson", "--duration", "1", "--rate-scale", "101"],
        ["run", "--simulated-fleet", "synthetic:poisson", "--sim-rate-scale", "3000"],
    ],
)
def test_a_rate_scale_past_the_bound_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--rate-scale / --sim-rate-scale had no upper bound: 3000 raised numpy's
    _ArrayMemoryError (a traceback), the whole trace scaled before --duration cut it."""
    from service.run import MAX_SIM_RATE_SCALE
    from simulator.traces import MAX_RATE_MULTIPLIER

    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    assert "rate-scale must be <= 100" in capsys.readouterr().err
    assert MAX_SIM_RATE_SCALE == MAX_RATE_MULTIPLIER == 100
    with pytest.raises(ValueError, match="in \\(0, 100\\]"):
        load_trace("synthetic:poisson:duration=1", rate_multiplier=101)


def test_simulate_without_memory_for_the_trace_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A MemoryError building the scaled trace: a message naming the flags, exit 2, no
    traceback (the run has not started)."""
    import simulator.cli_args

    def no_memory(*a: object, **k: object) -> Trace:
        raise MemoryError

    monkeypatch.setattr(simulator.cli_args, "load_trace", no_memory)
    argv = ["simulate", "--trace", "azure:conv", "--rate-scale", "80", "--no-oracle"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--trace azure:conv at --rate-scale 80: out of memory" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["simulate", "--trace", "synthetic:poisson", "--seed", "-1"], "--seed must be >= 0"),
        (["simulate", "--trace", "azure:code", "--seed", "-1"], "--seed must be >= 0"),
        (["demo", "--trace", "azure:conv", "--seed", "-3"], "--seed must be >= 0"),
        (["simulate", "--seed", "1.5"], "--seed must be a whole number"),
    ],
)
def test_a_negative_seed_is_refused_as_the_seed(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative --seed was blamed on --trace for synthetic traces ("--trace
    synthetic:poisson: expected non-negative integer") and accepted for azure ones."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--duration", "30"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "--trace" not in err.splitlines()[-1]


def test_demo_start_replicas_outside_the_fleet_bounds_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --start-replicas 1000` ran (with 402 replicas, against the scenario's bound
    64) where `simulate` refuses a start outside [min, max]: the same check now, exit 2
    before anything runs or is written."""
    out = tmp_path / "demo"
    argv = ["demo", "--trace", "synthetic:poisson", "--duration", "60", "--speed", "0"]
    assert main([*argv, "--out", str(out), "--start-replicas", "1000"]) == 2
    err = capsys.readouterr().err
    assert "--start-replicas 1000 is outside [1, 64], the fleet's replica bounds" in err
    assert not out.exists()


def test_simulate_cli_missing_trace_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--trace", str(tmp_path / "nope.csv"), "--no-oracle"]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_cli_live_view_table_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "demo",
            "--duration",
            "120",
            "--speed",
            "0",
            "--baselines",
            "static",
            "--out",
            str(tmp_path),
            "--trace",
            "synthetic:poisson:rate=30,duration=120",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "replicas" in out and "SLO so far" in out  # the live view
    assert "governor" in out and "static" in out and "oracle" in out  # the table
    assert "settled at t=" in out and "goals: SLO attainment >= 99%" in out
    doc = json.loads((tmp_path / "demo.json").read_text())
    assert set(doc["policies"]) == {"governor", "static"}
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("hold_s", "want"),
    [
        (0.0, 1.0),  # no window: the oracle itself
        (60.0, 1.0),  # one window: each minute holds only its own count
        (120.0, 7 / 5),  # [3, 1, 1] -> [3, 3, 1]
        (300.0, 9 / 5),  # the default scale-down window: [3, 3, 3]
    ],
)
def test_oracle_held_through_a_scale_down_window(hold_s: float, want: float) -> None:
    """A policy that keeps a scale-down window of `hold_s` pays each minute the largest
    count asked within it, even knowing every minute's need (matrix "oracle held")."""
    from simulator.oracle import OracleResult

    orc = OracleResult(gpu_hours=5 / 60, window_s=60.0, replicas=[3, 1, 1])
    assert orc.held_ratio(hold_s) == pytest.approx(want)
    assert OracleResult(gpu_hours=0.0, window_s=60.0, replicas=[0, 0]).held_ratio(300.0) is None


@pytest.mark.parametrize(
    ("counts", "hold_s", "flap_s", "start", "want"),
    [
        ([1, 3, 1, 1], 60.0, 0.0, 1, 6),  # no flap window: the oracle itself
        ([1, 3, 1, 1], 60.0, 120.0, 1, 8),  # [1, 3, 3, 1]: 3 cannot drop right after it rose
        ([1, 3, 1, 1], 60.0, 180.0, 1, 10),  # [1, 3, 3, 3]: nor in the two windows after
        ([1, 1, 2, 2], 60.0, 120.0, 4, 6),  # [1, 1, 2, 2]: the rise comes 2 windows later
        ([1, 1, 2, 2], 60.0, 180.0, 4, 8),  # [2, 2, 2, 2]: one step down from the start
        ([3, 1, 1, 1], 120.0, 120.0, 1, 8),  # held [3, 3, 1, 1], the rise 2 windows back
        ([0, 0], 300.0, 600.0, 4, None),  # no GPU-hours: no ratio
    ],
)
def test_oracle_held_without_a_flap(
    counts: list[int], hold_s: float, flap_s: float, start: int, want: float | None
) -> None:
    """The cheapest cover of the held counts from `start` that never reverses within
    `flap_s` (matrix "no flap"): what 0 flaps with that window cost even knowing every
    minute's need. `want` in replica-windows over the oracle's own."""
    from simulator.oracle import OracleResult

    orc = OracleResult(gpu_hours=sum(counts) / 60, window_s=60.0, replicas=counts)
    got = orc.flap_free_ratio(hold_s, flap_s, start)
    assert got == (None if want is None else pytest.approx(want / sum(counts)))


def test_the_demo_judges_gpu_hours_as_the_matrix_does() -> None:
    """Over the trace's minutes (`oracle_ratio_trace`), not the whole run with its drain
    tail (found in review, session 15: the same run met the goal in the matrix and
    missed it in the demo)."""
    from simulator.cli import demo_goals

    row = {"slo_attainment": 0.995, "flaps": 0, "oracle_ratio": 1.36, "oracle_ratio_trace": 1.16}
    assert "GPU-h <= 1.3x oracle met" in demo_goals({"policies": {"governor": row}})
    row |= {"oracle_ratio": 1.16, "oracle_ratio_trace": 1.36}
    assert "GPU-h <= 1.3x oracle MISSED" in demo_goals({"policies": {"governor": row}})


def test_a_governor_tick_longer_than_the_hpa_sync_runs_in_time_order() -> None:
    """A tick of 20 s (allowed up to 300 s) comes after the HPA's first 15 s sync: the
    run's event heap orders them (an unordered list once advanced the fleet to 20 s and
    then asked it back to 15 s: "cannot go back in time")."""
    trace = load_trace("synthetic:poisson:rate=5,duration=120", seed=1)
    sc = Scenario(
        trace=trace,
        sla=SLA_STD,
        drain_tail_s=0,
        governor_policy=ScalingPolicy(tick_interval_s=20.0),
    )
    ticks: list[float] = []
    syncs: list[float] = []
    res = run_policy(
        "governor",
        sc,
        on_tick=lambda t, _p: ticks.append(t),
        on_sync=lambda t, _f, _p: syncs.append(t),
    )
    assert ticks[:3] == [20.0, 40.0, 60.0] and syncs[:3] == [15.0, 30.0, 45.0]
    assert res.requests == len(trace)
