"""Engine calibration against the profile and the vLLM V1 scheduling rules, one by one."""

from __future__ import annotations

import math

import pytest

from controller.types import Knobs
from estimators.stepmodel import load_profile
from simulator.engine import Engine, StepRecord
from simulator.requests import RequestLog

PROFILE = load_profile()
ST = PROFILE.step_model()


def make(
    mns: int = 1024,
    mnbt: int = 8192,
    *,
    kv_blocks: int | None = None,
    max_model_len: int | None = None,
) -> tuple[Engine, RequestLog, list[StepRecord]]:
    log = RequestLog()
    steps: list[StepRecord] = []
    eng = Engine(
        PROFILE,
        Knobs(mns, mnbt),
        log=log,
        kv_capacity_blocks=kv_blocks,
        max_model_len=max_model_len,
        step_log=steps,
    )
    return eng, log, steps


def submit(eng: Engine, log: RequestLog, t: float, prompt: int, output: int) -> int:
    eng.advance_to(t)
    rid = log.add(t, prompt, output)
    eng.enqueue(rid, t, prompt, output)
    return rid


def run_all(eng: Engine) -> None:
    eng.advance_to(math.inf)
    assert eng.is_empty


# --- calibration ------------------------------------------------------------------------


def test_kv_capacity_matches_profile() -> None:
    eng, _, _ = make()
    assert PROFILE.kv_capacity_tokens == 464_688
    assert eng.total_blocks == 29_043 == PROFILE.kv_capacity_blocks
    assert eng.total_blocks * eng.bs == 464_688
    assert eng.kv_usage_frac == 0.0


def test_single_stream_decode_step_time_matches_formula() -> None:
    eng, log, _ = make()
    rid = submit(eng, log, 0.0, 1000, 5)
    run_all(eng)
    rec = log.arrays()
    # 4 decode steps at 1001..1004 tokens of context, each
    # max(6.6, 2.3 + 0.0218) + 0.7 + 0.015 + 5e-5 * ctx ms (docs/ARCHITECTURE.md, Plant model).
    expect_ms = sum(
        max(6.6, 2.3 + 0.0218 * 1) + 0.7 + 0.015 * 1 + 5.0e-5 * ctx for ctx in range(1001, 1005)
    )
    assert (rec.finish_s[rid] - rec.first_token_s[rid]) * 1000 == pytest.approx(expect_ms)
    assert expect_ms == pytest.approx(sum(ST.decode_step_ms(1, c) for c in range(1001, 1005)))
    assert rec.mean_itl_s[rid] * 1000 == pytest.approx(expect_ms / 4)


def test_prefill_time_matches_formula() -> None:
    eng, log, _ = make()
    rid = submit(eng, log, 0.0, 2048, 1)
    run_all(eng)
    ttft_ms = log.arrays().ttft_s[rid] * 1000
    # 2.3 + 0.0218 * 2048 + 0.7 + 0.015 + 1.31e-6 * 2048 * 1024 = 50.4 ms
    assert ttft_ms == pytest.approx(ST.prefill_ms(2048))
    assert ttft_ms == pytest.approx(50.4, abs=0.05)


def test_chunked_prefill_time_matches_formula() -> None:
    eng, log, steps = make()
    rid = submit(eng, log, 0.0, 10_000, 1)
    run_all(eng)
    first = ST.step_ms(8192, 0, 0, 8192 * (0 + 8192 / 2))
    second = ST.step_ms(1808, 1, 0, 1808 * (8192 + 1808 / 2))
    assert log.arrays().ttft_s[rid] * 1000 == pytest.approx(first + second)
    assert [s.chunks for s in steps] == [((rid, 8192, 0),), ((rid, 1808, 8192),)]


def test_decode_batch_step_time_uses_summed_context() -> None:
    eng, log, steps = make()
    a = submit(eng, log, 0.0, 100, 3)
    b = submit(eng, log, 0.0, 300, 3)
    run_all(eng)
    decode = [s for s in steps if s.decodes == (a, b)]
    assert sum(s.steps for s in decode) == 2
    # contexts (101 + 301) then (102 + 302)
    expect = ST.step_ms(2, 2, 402) + ST.step_ms(2, 2, 404)
    rec = log.arrays()
    assert (rec.finish_s[a] - rec.first_token_s[a]) * 1000 == pytest.approx(expect)


# --- scheduling rules ---------------------------------------------------------------------


def test_running_first_then_waiting_fcfs_and_last_admitted_chunked() -> None:
    eng, log, steps = make(mns=16, mnbt=100)
    a = submit(eng, log, 0.0, 30, 10)
    # Arrive while A's prefill step is in flight.
    b = submit(eng, log, 0.001, 50, 5)
    c = submit(eng, log, 0.002, 50, 5)
    d = submit(eng, log, 0.003, 10, 5)
    eng.advance_to(0.2)
    s0, s1, s2 = steps[0], steps[1], steps[2]
    assert s0.chunks == ((a, 30, 0),) and s0.decodes == ()
    # Step 1: A decodes first (1 token), then B whole, then C chunked to the budget left.
    assert s1.decodes == (a,)
    assert s1.chunks == ((b, 50, 0), (c, 49, 0))
    # Step 2: decodes (A, B), then C's last token as a continuing chunk, then D.
    assert s2.decodes == (a, b)
    assert s2.chunks == ((c, 1, 49), (d, 10, 0))
    run_all(eng)
    rec = log.arrays()
    assert rec.first_token_s[b] == s1.end_s
    assert rec.first_token_s[c] == s2.end_s == rec.first_token_s[d]


def test_budget_limits_tokens_per_step() -> None:
    eng, log, steps = make(mns=64, mnbt=256)
    for i in range(10):
        submit(eng, log, 0.0, 100 + i, 20)
    run_all(eng)
    for s in steps:
        assert len(s.decodes) + sum(c for _, c, _ in s.chunks) <= 256


def test_max_num_seqs_caps_running() -> None:
    eng, log, steps = make(mns=2, mnbt=8192)
    ids = [submit(eng, log, 0.0, 50, 4) for _ in range(3)]
    eng.advance_to(0.01)  # inside the first step
    assert eng.num_running == 2 and eng.num_waiting == 1
    run_all(eng)
    assert steps[0].chunks == ((ids[0], 50, 0), (ids[1], 50, 0))
    rec = log.arrays()
    # The third is admitted only in the step after the first two finish.
    assert rec.sched_s[ids[2]] == pytest.approx(max(rec.finish_s[ids[0]], rec.finish_s[ids[1]]))
    assert max(len(s.decodes) + len(s.chunks) for s in steps) <= 2


def test_preempts_most_recently_admitted_to_queue_head_and_admits_nothing() -> None:
    # 8 blocks of 16 tokens. A and B hold 3 blocks each, C 2: the cache is full.
    eng, log, steps = make(mns=16, mnbt=512, kv_blocks=8, max_model_len=128)
    a = submit(eng, log, 0.0, 48, 30)
    b = submit(eng, log, 0.0, 48, 30)
    c = submit(eng, log, 0.0, 32, 30)
    eng.advance_to(0.001)
    d = submit(eng, log, 0.001, 10, 2)  # fits once C's blocks are freed
    eng.advance_to(0.05)
    # Step 0 admits A, B, C (8 blocks). D cannot be admitted (no free block). In step 1
    # A, B, C all decode: A's and B's 49th token need a 4th block: C (the most recently
    # admitted) is preempted, freeing 2 blocks for them.
    assert steps[0].chunks == ((a, 48, 0), (b, 48, 0), (c, 32, 0))
    pre = next(s for s in steps if s.preempted)
    assert pre.preempted == (c,)
    assert pre.decodes == (a, b)
    assert pre.chunks == ()  # nothing admitted in a preempting step, although D would fit
    # C went back to the head of the queue, before D.
    assert [r.rid for r in eng.waiting] == [c, d]
    run_all(eng)
    rec = log.arrays()
    assert rec.preemptions[c] >= 1
    assert rec.preemptions[a] == 0
    assert rec.sched_s[d] > rec.sched_s[c]  # FCFS order kept
    assert eng.free == eng.total_blocks


def test_preempted_request_recomputes_prompt_and_generated_tokens() -> None:
    eng, log, steps = make(mns=16, mnbt=512, kv_blocks=8, max_model_len=128)
    a = submit(eng, log, 0.0, 48, 40)
    submit(eng, log, 0.0, 48, 40)
    c = submit(eng, log, 0.0, 32, 5)
    run_all(eng)
    resumed = [ch for s in steps for ch in s.chunks if ch[0] == c][1]
    # C generated 1 token before preemption: it recomputes 32 + 1 tokens.
    assert resumed == (c, 33, 0)
    assert log.arrays().preemptions[a] == 0


def test_partial_prefill_that_cannot_allocate_preempts_itself() -> None:
    # 12 blocks. A decodes holding 5 of them; B's first 63-token chunk gets 4 blocks,
    # its second chunk needs 8 in all: the allocation fails and B (the last running
    # request) preempts itself.
    eng, log, steps = make(mns=16, mnbt=64, kv_blocks=12, max_model_len=160)
    a = submit(eng, log, 0.0, 64, 60)
    eng.advance_to(0.02)
    b = submit(eng, log, 0.02, 120, 3)
    run_all(eng)
    pre = [s for s in steps if s.preempted]
    assert pre and pre[0].preempted == (b,)
    assert pre[0].decodes == (a,)
    rec = log.arrays()
    assert rec.preemptions[b] >= 1 and rec.preemptions[a] == 0
    assert not math.isnan(rec.finish_s[b])


def test_refuses_prompts_longer_than_max_model_len() -> None:
    eng, log, _ = make(max_model_len=1000)
    ok = submit(eng, log, 0.0, 1000, 50)
    bad = submit(eng, log, 0.0, 1001, 5)
    run_all(eng)
    rec = log.arrays()
    assert bool(rec.refused[bad]) and math.isnan(rec.finish_s[bad])
    assert eng.metrics.refused == 1
    assert eng.metrics.success == 1
    assert not rec.refused[ok]
    # prompt + output is capped at max_model_len: a 1000-token prompt yields 1 token.
    assert rec.finish_s[ok] == rec.first_token_s[ok]
    assert rec.output_tokens[ok] == 1
    assert eng.metrics.req_gen_sum == 1


def test_queue_time_is_observed_when_a_request_finishes_as_vllm_does() -> None:
    """vLLM V1 observes vllm:request_queue_time_seconds for finished requests only
    (PrometheusStatLogger.record over iteration_stats.finished_requests): 40 requests
    queued at once show in the histogram as they finish, not when first scheduled."""
    eng, log, _ = make(mns=8, mnbt=512)
    rids = [submit(eng, log, 0.0, 64, 20) for _ in range(40)]
    eng.advance_to(0.5)
    m = eng.metrics
    assert 0 < m.success < len(rids)  # some admitted and still running or waiting
    assert sum(m.queue) == m.success
    run_all(eng)
    assert sum(m.queue) == m.success == len(rids)
    rec = log.arrays()
    assert m.queue_sum == pytest.approx(float((rec.sched_s - rec.arrival_s).sum()))


def test_invalid_knobs_refused_like_vllm() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(PROFILE, Knobs(256, 128))
    with pytest.raises(ValueError, match="max_model_len"):
        Engine(PROFILE, Knobs(8, 512), kv_capacity_blocks=10)


def test_idle_engine_costs_nothing_and_wakes_on_arrival() -> None:
    eng, log, steps = make()
    eng.advance_to(1e6)
    assert eng.wake_s == math.inf and steps == []
    rid = submit(eng, log, 1e6 + 5, 100, 2)
    run_all(eng)
    assert log.arrays().sched_s[rid] == 1e6 + 5


def test_metrics_counted_once_per_request_and_token() -> None:
    eng, log, _ = make(mns=8, mnbt=512)
    n = 30
    for i in range(n):
        submit(eng, log, i * 0.01, 200 + i, 10 + i)
    run_all(eng)
    m = eng.metrics
    assert m.success == n == sum(m.ttft) == sum(m.e2e) == sum(m.queue) == sum(m.req_gen)
    total_out = sum(10 + i for i in range(n))
    assert m.generation_tokens == total_out
    assert sum(m.itl) == total_out - n
    assert m.req_gen_sum == total_out
    assert m.prompt_tokens == sum(200 + i for i in range(n))
    rec = log.arrays()
    assert m.e2e_sum == pytest.approx(float((rec.finish_s - rec.dispatch_s).sum()))
    assert m.busy_s == pytest.approx(
        max(rec.finish_s) - 0.0 - idle_time(rec.dispatch_s, rec.finish_s)
    )


def idle_time(start: object, finish: object) -> float:
    """Idle time between 0 and the last finish given busy periods from arrivals."""
    import numpy as np

    s = np.asarray(start)
    f = np.asarray(finish)
    order = np.argsort(s)
    idle = 0.0
    busy_until = 0.0
    for i in order:
        if s[i] > busy_until:
            idle += s[i] - busy_until
        busy_until = max(busy_until, f[i])
    return idle


# --- live knobs (the governor's scheduler plugin) -----------------------------------------


def test_live_cap_lowered_preempts_the_newest_at_the_next_step_start() -> None:
    eng, log, steps = make(mns=8, mnbt=8192)
    ids = [submit(eng, log, 0.0, 40, 400) for _ in range(4)]
    eng.advance_to(0.5)  # all four decode (a jump in flight)
    eng.set_knobs(Knobs(2, 8192), 0.5)
    assert eng.knobs == Knobs(2, 8192)
    eng.advance_to(0.6)
    assert [r.rid for r in eng.waiting] == [ids[2], ids[3]]
    run_all(eng)
    # The steps that started before 0.5 kept their four decodes; the first one after
    # preempts the two newest (back to the queue's front in arrival order) and runs two.
    assert all(len(s.decodes) == 4 for s in steps[1:] if s.start_s < 0.5)
    cut = next(s for s in steps if s.start_s >= 0.5)
    assert cut.preempted == (ids[3], ids[2])
    assert cut.decodes == (ids[0], ids[1])
    later = [s for s in steps if s.start_s >= 0.5]
    assert max(len(s.decodes) + len(s.chunks) for s in later) <= 2
    rec = log.arrays()
    assert all(rec.finish_s[i] > 0 for i in ids)  # every request still finishes
    assert rec.preemptions[ids[2]] == rec.preemptions[ids[3]] == 1


def test_live_cap_raised_admits_the_waiting_at_the_next_step_start() -> None:
    eng, log, _ = make(mns=1, mnbt=8192)
    a = submit(eng, log, 0.0, 40, 2000)
    b = submit(eng, log, 0.0, 40, 5)
    eng.advance_to(1.0)
    eng.set_knobs(Knobs(2, 8192), 1.0)
    run_all(eng)
    rec = log.arrays()
    # B waited behind A's cap of 1; raised at 1.0, it is admitted at the first step that
    # starts after it (a decode step lasts well under 50 ms), long before A finishes.
    assert 1.0 <= rec.sched_s[b] < 1.05
    assert rec.finish_s[b] < rec.finish_s[a]


def test_live_token_budget_applies_to_the_next_steps() -> None:
    eng, log, steps = make(mns=64, mnbt=8192)
    for _ in range(4):
        submit(eng, log, 0.0, 3000, 4)
    eng.advance_to(0.001)  # the first step is in flight
    eng.set_knobs(Knobs(64, 512), 0.001)
    run_all(eng)
    # The step in flight keeps the old budget (8,192 tokens of the first three prompts);
    # every later one runs within 512.
    assert sum(c for _, c, _ in steps[0].chunks) == 8192
    assert all(len(s.decodes) + sum(c for _, c, _ in s.chunks) <= 512 for s in steps[1:])


def test_live_knobs_refused_like_vllm_change_nothing() -> None:
    eng, _, _ = make(mns=8, mnbt=512)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        eng.set_knobs(Knobs(256, 128), 0.0)
    assert eng.knobs == Knobs(8, 512) and (eng.mns, eng.mnbt) == (8, 512)
