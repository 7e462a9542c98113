"""Cheap, non-timing checks that the performance work kept behaviour (issue 7).

- the answer parsers of `PrometheusSource` give what straightforward parse-then-group
  code gives (a reference copy below), on randomized answers with NaN, infinities,
  duplicated series and buckets, malformed samples, missing labels and noise (the
  same values and the same faults per model);
- observing the replayed recording gives the recorded fleet's known values;
- the inlined capacity bisection returns the same float as a `feasible(lam)` bisection,
  and the galloping search the same integer as a bisection;
- a tick pauses the cyclic GC and shortens the GIL switch interval only while it runs;
- the metrics' kept children follow `forget`;
- the tick benchmark runs (tiny sizes).
"""

from __future__ import annotations

import gc
import math
import random
import sys
from collections import defaultdict
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from benchmarks.promreplay import ReplayClient, load_recording, model_names
from controller.batching import _largest_within, slo_knobs
from controller.config import SLA, KnobBounds
from controller.loop import ControlLoop
from controller.metrics import GovernorMetrics
from controller.types import Knobs, Lengths
from estimators.answers import BUCKET_NOISE, parse_edge_buckets, parse_tagged
from estimators.prometheus import PrometheusSource
from estimators.promql import SIGNAL_LABEL
from estimators.stepmodel import load_profile
from estimators.types import ModelQuery, Observation, SourceError
from tests.conftest import FakeClock, make_model
from tests.service.fakes import quiet_logger
from tests.unit.helpers import obs

LABEL = "model_name"


# --- reference parsers: the straightforward code the one-pass parsers replaced ---------
Faults = dict[str, set[str]]
"""model -> the signals with a fault (a malformed sample, or a duplicated series)."""


def _ref_vector(raw: Any, faults: Faults) -> list[tuple[dict[str, str], float]]:
    if not isinstance(raw, list):
        raise SourceError("not a vector")
    out = []
    for item in raw:
        try:
            metric, pair = item["metric"], item["value"]
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise TypeError("bad value")
            value = pair[1]
            if not isinstance(metric, dict) or not isinstance(value, str | int | float):
                raise TypeError("bad sample")
            if isinstance(value, bool):
                raise TypeError("bad sample")
            out.append(({str(k): str(v) for k, v in metric.items()}, float(value)))
        except (KeyError, TypeError, ValueError) as exc:
            metric = item.get("metric") if isinstance(item, dict) else None
            model = metric.get(LABEL) if isinstance(metric, dict) else None
            if model is None:
                raise SourceError("malformed") from exc
            faults.setdefault(str(model), set()).add(str(metric.get(SIGNAL_LABEL, "untagged")))
    return out


def _ref_tagged(raw: Any, faults: Faults) -> dict[str, dict[str, float]]:
    """model -> signal -> value (NaN, and a fault, for a signal answered twice)."""
    rows: defaultdict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in _ref_vector(raw, faults):
        model, signal = labels.get(LABEL), labels.get(SIGNAL_LABEL)
        if model is not None and signal is not None:
            if signal in rows[model]:
                value = math.nan
                faults.setdefault(model, set()).add(signal)
            rows[model][signal] = value
    return dict(rows)


def _ref_buckets(raw: Any, faults: Faults) -> dict[str, dict[str, list[tuple[float, float]]]]:
    acc: defaultdict[tuple[str, str], defaultdict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for labels, value in _ref_vector(raw, faults):
        model, le, hist = labels.get(LABEL), labels.get("le"), labels.get(SIGNAL_LABEL)
        if model is not None and le is not None and hist is not None:
            acc[(hist, model)][le].append(value)
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for (hist, model), by_le in acc.items():
        column = out.setdefault(hist, {})
        by_bound: defaultdict[float, float] = defaultdict(float)
        for le, values in by_le.items():
            try:
                bound = float(le)
            except ValueError:
                continue
            if not math.isnan(bound):  # a repeated `le` voids the histogram
                by_bound[bound] += values[0] if len(values) == 1 else math.nan
        if not by_bound or not all(0 <= v < math.inf for v in by_bound.values()):
            continue
        running, buckets = 0.0, []
        for bound in sorted(by_bound):
            if by_bound[bound] < running * (1.0 - BUCKET_NOISE):  # past noise: void
                break
            running = max(running, by_bound[bound])
            buckets.append((bound, running))
        else:
            column[model] = buckets
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _mutated(rng: random.Random, result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for item in result:
        item = {"metric": dict(item["metric"]), "value": list(item["value"])}
        x = rng.random()
        if x < 0.03:
            item["value"][1] = "NaN"
        elif x < 0.05:
            item["value"][1] = rng.choice(["+Inf", "-Inf"])
        elif x < 0.08:
            item["value"][1] = rng.uniform(0, 50)  # a number, not a string
        elif x < 0.25:
            item["value"][1] = repr(float(item["value"][1]) * rng.uniform(0.5, 1.5))
        elif x < 0.27:
            item["metric"]["le"] = rng.choice(["NaN", "x", 0.5, "1e400"])
        elif x < 0.29:
            item["metric"].pop(LABEL, None)
        elif x < 0.30:
            item["metric"].pop(SIGNAL_LABEL, None)
        elif x < 0.31 and LABEL in item["metric"]:  # malformed, its model named
            item["value"] = rng.choice(["90", [1, True], [1, "x"], [1, "2", "3"]])
        out.append(item)
        if rng.random() < 0.05:
            out.append({"metric": dict(item["metric"]), "value": list(item["value"])})
    rng.shuffle(out)
    return out


def test_one_pass_parsers_equal_the_reference_on_randomized_answers() -> None:
    rec = load_recording()
    rng = random.Random(7)
    for _ in range(60):
        for name, result in rec["answers"].items():
            raw = _mutated(rng, result)
            got: dict[str, dict[str, str]] = {}
            want: Faults = {}
            if name == "sla_buckets":
                parsed = parse_edge_buckets(raw, name, LABEL, got)
                assert _same(parsed, _ref_buckets(raw, want)), name
            else:
                assert _same(parse_tagged(raw, name, LABEL, got), _ref_tagged(raw, want)), name
            assert {m: set(d) for m, d in got.items()} == want, name


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {"resultType": "vector"},
        [1.0, "2"],
        [{"metric": {"job": "a"}}],
        [{"metric": "x", "value": [1, "2"]}],
        [{"metric": {"job": "a"}, "value": [1, "abc"]}],
        [{"metric": {LABEL: None}, "value": [1, None]}],
    ],
)
def test_malformed_answers_are_refused_like_the_reference(raw: Any) -> None:
    with pytest.raises(SourceError):
        _ref_vector(raw, {})
    with pytest.raises(SourceError):
        parse_tagged(raw, "q", LABEL, {})
    with pytest.raises(SourceError):
        parse_edge_buckets(raw, "q", LABEL, {})


def test_replayed_recording_gives_the_recorded_fleets_values() -> None:
    src = PrometheusSource("http://replay.invalid", window_s=60.0, short_window_s=10.0)
    src._client = ReplayClient(src.queries, 4, variants=1)
    res = src.observe([ModelQuery(n, 1.0, 0.05) for n in model_names(4)], 1_800_000_000.0)
    a, b = res["model-00000"], res["model-00003"]  # clones of llama-a and qwen/qwen-b
    assert isinstance(a, Observation) and isinstance(b, Observation)
    # tests/integration/conftest.py: A 40 req/s, ITL p95 65.625 ms, TTFT p95 625 ms,
    # means 330/84 tokens; B 32 req/s (30 completions + queue growth 2/s), ITL p95 125 ms.
    # Rates within 10 %: rate() extrapolates under scrape jitter in the recording.
    assert a.arrival_rate_rps == pytest.approx(40.0, rel=0.1)
    assert a.itl_p95_ms == pytest.approx(65.625)
    assert a.ttft_p95_ms == pytest.approx(625.0)
    assert (a.prompt_tokens_mean, a.output_tokens_mean) == (pytest.approx(330), pytest.approx(84))
    assert a.itl_attainment_frac == pytest.approx(0.90)
    assert b.arrival_rate_rps == pytest.approx(32.0, rel=0.1)
    assert b.itl_p95_ms == pytest.approx(125.0)
    # one exporter (one pod, one target) serves A's two engines: ready counts pods
    assert a.staleness_s == pytest.approx(1.0) and a.ready_replicas == 1
    # The fields added for issues 10 and 12 (tests/integration/conftest.py's values).
    assert a.decode_time_p95_ms == pytest.approx(1750.0)
    assert a.decode_time_mean_ms == pytest.approx(740.0)
    assert a.tpot_p95_ms == pytest.approx(62.5) and a.tpot_attainment_frac == pytest.approx(0.9)
    assert a.step_tokens_mean == pytest.approx(288.0)
    assert a.ttft_attainment_frac == 1.0  # all 20 TTFTs <= 1 s
    assert b.ttft_attainment_frac == pytest.approx(19 / 20)  # one of 20 at 1.5 s
    assert a.itl_dist is not None and a.itl_dist.p99_ms == pytest.approx(87.5)
    assert (a.targets_up, a.targets_down) == (1, 0)
    assert a.arrival_rate_5m_rps == pytest.approx(40.0, rel=0.1)
    assert b.decode_time_p95_ms is None and b.step_tokens_mean is None


# --- batching --------------------------------------------------------------------------
def _random_case(rng: random.Random) -> tuple[Lengths, SLA]:
    pm = rng.choice([rng.uniform(1, 200), rng.uniform(100, 3000), rng.uniform(1000, 100_000)])
    om = rng.choice([rng.uniform(1, 50), rng.uniform(50, 1000), rng.uniform(500, 8000)])
    lengths = Lengths(pm, pm * rng.uniform(1, 4), om, om * rng.uniform(1, 4))
    sla = SLA(
        ttft_p95_ms=rng.choice([1, 50, 200, 1000, 5000, 60_000]),
        itl_p95_ms=rng.choice([1, 5, 6.5, 8, 10, 20, 50, 100, 1000]),
    )
    return lengths, sla


def _bisect(pred: Any, hi: int) -> int:
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def test_galloping_search_equals_bisection_and_stays_in_range() -> None:
    for hi in range(0, 40):
        for edge in range(-1, hi + 2):
            for guess in range(-3, hi + 5):
                seen: list[int] = []

                def pred(b: int, edge: int = edge, seen: list[int] = seen) -> bool:
                    seen.append(b)
                    return b <= edge

                assert _largest_within(pred, guess, hi) == _bisect(lambda b, e=edge: b <= e, hi)
                assert all(1 <= b <= hi for b in seen)


def test_slo_knobs_seqs_equal_a_bisection_over_the_decode_step() -> None:
    rng = random.Random(5)
    p = load_profile()
    m = p.step_model()
    for _ in range(2000):
        lengths, sla = _random_case(rng)
        top = rng.choice([8, 9, 64, 256, 1024, 4096])
        bounds = KnobBounds(max_num_seqs_max=top, max_num_seqs_min=8, default_max_num_seqs=8)
        margin = rng.uniform(0.1, 1.0)
        budget = sla.itl_p95_ms * margin
        ctx = lengths.prompt_p95 + lengths.output_p95 / 2.0
        seqs = _bisect(lambda b, c=ctx, t=budget: m.decode_step_ms(b, b * c) <= t, top)
        mean_ctx = max(1.0, lengths.prompt_mean + lengths.output_mean)
        seqs = min(seqs, int(p.kv_capacity_tokens * 0.9 / mean_ctx))
        seqs = min(max(8, seqs // 8 * 8), top)  # quantized, then clamped to the bounds
        assert slo_knobs(lengths, sla, p, bounds, margin).max_num_seqs == seqs


# --- the loop ---------------------------------------------------------------------------
class _Probe:
    """A source that records the GC state and switch interval it runs under."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[tuple[bool, float]] = []
        self.fail = fail

    def observe(self, models: Any, now_s: float) -> dict[str, Any]:
        self.seen.append((gc.isenabled(), sys.getswitchinterval()))
        if self.fail:
            raise RuntimeError("source bug")
        return {m.name: obs(model=m.name, t=now_s, rate=10.0) for m in models}


@pytest.mark.parametrize("fail", [False, True])
def test_tick_pauses_gc_and_shortens_the_switch_interval_only_while_it_runs(fail: bool) -> None:
    from controller.config import GovernorConfig

    probe = _Probe(fail)
    loop = ControlLoop(
        GovernorConfig(models=(make_model("a"),)),
        probe,
        [],
        clock=FakeClock(),
        metrics=GovernorMetrics(CollectorRegistry()),
        logger=quiet_logger(),
    )
    interval = sys.getswitchinterval()
    assert gc.isenabled()
    loop.tick(1000.0)
    assert probe.seen == [(False, 0.0005)]
    assert gc.isenabled() and sys.getswitchinterval() == interval
    gc.disable()  # a process that runs without the cyclic GC keeps it off
    try:
        loop.tick(1005.0)
        assert probe.seen[-1][0] is False and not gc.isenabled()
    finally:
        gc.enable()


def test_metrics_children_follow_forget() -> None:
    from controller.types import Decision, Reason, Stage

    m = GovernorMetrics(CollectorRegistry())

    def decision(replicas: int) -> Decision:
        return Decision(
            model="a",
            at_s=0.0,
            valid=True,
            replicas=replicas,
            knobs=Knobs(64, 2048),
            stages=(Stage("raw", 1, replicas, Reason.CAPACITY),),
            knob_reason=Reason.KNOBS_UNCHANGED,
            demand_rps=1.0,
        )

    def sample(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, {"model": "a", **labels})

    m.record(decision(3), 1.0)
    assert sample("governor_desired_replicas") == 3
    m.forget("a")
    assert sample("governor_desired_replicas") is None
    m.record(decision(5), 1.0)
    assert sample("governor_desired_replicas") == 5
    total = sample("governor_stage_reasons_total", stage="raw", reason="CAPACITY")
    assert total == 2


def test_tick_benchmark_runs_on_a_tiny_fleet() -> None:
    from benchmarks.bench_tick import measure

    r = measure(5, ticks=2, warmup=1)
    assert r["models_published"] == 5 and r["problems"] == []
    assert r["queries_per_tick"] == r["queries_per_tick_min"] <= 15
    assert r["cpu_ms_median"] > 0 and set(r["breakdown_ms"]) >= {"decode_ms", "decide_ms"}


def test_tick_benchmark_fails_a_row_whose_ticks_had_no_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every replayed query refused (a query text the recording does not hold): the
    ticks cost ~10x less and the 1,000-model row read "met" while nothing was observed,
    decided or published. Now the rows fail, naming why."""
    from benchmarks.bench_tick import _query_row, _tick_rows, measure

    def refuse(self: ReplayClient, query: str, params: Any) -> Any:
        raise KeyError(query[:40])

    monkeypatch.setattr(ReplayClient, "_answer", refuse)
    r = measure(5, ticks=2, warmup=1, breakdown=False)
    assert r["models_published"] == 0
    assert any("queries sent, expected" in p for p in r["problems"]), r["problems"]
    assert any("5 of 5 decisions invalid or without data" in p for p in r["problems"])
    rows = _tick_rows([dict(r, models=1000, breakdown_ms={})], None)
    assert rows[0].met is False and "NOT MEASURED" in rows[0].value
    assert _query_row([r]).met is False


def _reaction_run(ask_s: float) -> dict[str, float]:
    never = math.isnan(ask_s)
    return {
        "ask_s": ask_s,
        "ask_evaluations": math.nan if never else 1.0,
        "applied_s": math.nan if never else 14.0,
        "replicas_at_step": 1.0,
        "slo_attainment": 0.5 if never else 0.92,
        "interval_s": 5.0,
    }


def test_a_seed_that_never_reacted_fails_the_reaction_row() -> None:
    """statistics.median over [nan, 3.5, 3.5] depends on where the NaN stands: a seed in
    which the governor never asked for more replicas vanished and the row read "met".
    Now it is left out of the medians, named, and fails the row, whatever its place."""
    import argparse
    import itertools

    from benchmarks.bench_reaction import _row
    from benchmarks.common import median

    with pytest.raises(ValueError, match="NaN"):
        median([math.nan, 2.5, 3.5])
    args = argparse.Namespace(low=10.0, high=40.0)
    for order in itertools.permutations([math.nan, 3.5, 3.5]):
        runs = [_reaction_run(a) for a in order]
        seed = [math.isnan(a) for a in order].index(True)
        row = _row("governor", runs, args)
        assert row.met is False, order
        assert f"NEVER REACTED in seed(s) {seed} (no ask): medians over 2 of 3" in row.value
        assert row.data["ask_s"] == 3.5 and row.data["never_reacted_seeds"] == [seed]
    baseline = _row("keda", [_reaction_run(math.nan), _reaction_run(20.0)], args)
    assert baseline.met is None and "NEVER REACTED in seed(s) 0" in baseline.value
    assert _row("governor", [_reaction_run(3.5)] * 3, args).met is True


def test_a_closed_loop_rep_without_answers_fails_the_grpc_row() -> None:
    """bench_grpc's closed loop: a rep that completed no call has NaN latencies and CPU
    per call; it is left out of the medians and named."""
    from benchmarks.bench_grpc import closed_loop_medians

    def rep(p99: float) -> dict[str, Any]:
        n = 0 if math.isnan(p99) else 100
        cpu = math.nan if n == 0 else 50.0
        return {
            "calls_per_s": float(n),
            "p50_ms": p99 / 2,
            "p99_ms": p99,
            "server_cpu_us_per_call": cpu,
            "calls": n,
            "errors": 0,
            "error_codes": {},
        }

    per = {"governor": [rep(2.0), rep(math.nan), rep(4.0)], "ceiling": [rep(1.0)] * 3}
    med, empty = closed_loop_medians(per)
    assert empty == "governor rep 1"
    assert med["governor"]["p99_ms"] == 3.0 and med["ceiling"]["p99_ms"] == 1.0
    assert closed_loop_medians({"governor": [rep(2.0)]})[1] == ""
