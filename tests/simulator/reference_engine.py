"""A deliberately naive vLLM V1 scheduler simulation, the oracle for the fast engine.

Written from vLLM's own formulation, not from `simulator.engine`: every request has
`num_tokens` (prompt + generated) and `num_computed_tokens`; each step walks the whole
running list in order and schedules `min(num_tokens - num_computed, budget)` tokens per
request, allocating KV blocks for `num_computed + new` tokens and preempting the last
running request (recompute, to the head of the waiting queue) when an allocation fails;
waiting requests are admitted FCFS only in steps without preemption. A request samples a
token in a step that brings `num_computed` up to `num_tokens`. O(running) per step and
per-token bookkeeping: slow, obviously correct, only for small workloads.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

from estimators.histogram import ITL_BUCKETS_S
from estimators.stepmodel import Profile


@dataclass
class RefRequest:
    rid: int
    arrival_s: float
    prompt: int
    out: int
    hit: int = 0  # prompt tokens found in the prefix cache at each prefill's start
    generated: int = 0
    computed: int = 0
    blocks: int = 0
    prefilled: bool = False  # the current prefill has completed (it is decoding)
    sched_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    last_token_s: float = math.nan
    preemptions: int = 0
    refused: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated


@dataclass
class RefResult:
    requests: dict[int, RefRequest]
    steps: int
    busy_s: float
    itl_counts: list[int] = field(default_factory=list)
    generation_tokens: int = 0
    preemptions: int = 0


def simulate(
    arrivals: list[tuple[float, int, int]],
    profile: Profile,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    kv_blocks: int,
    max_model_len: int,
    prefix_hit_frac: float = 0.0,
) -> RefResult:
    """Run `arrivals` [(arrival_s, prompt, output)] (sorted) to completion; each
    prefill starts with the whole blocks of `prefix_hit_frac` of its prompt computed."""
    st = profile.step_model()
    bs = profile.memory.block_size_tokens
    reqs: dict[int, RefRequest] = {}
    pending: list[RefRequest] = []
    for rid, (t, p, o) in enumerate(arrivals):
        hit = math.floor(p * prefix_hit_frac / bs) * bs
        r = RefRequest(rid, t, p, max(1, min(o, max_model_len - p)), hit)
        reqs[rid] = r
        if p > max_model_len:
            r.refused = True
        else:
            pending.append(r)
    waiting: list[RefRequest] = []
    running: list[RefRequest] = []
    free = kv_blocks
    t = 0.0
    steps = 0
    busy = 0.0
    itl_counts = [0] * (len(ITL_BUCKETS_S) + 1)
    gen_tokens = 0
    preemptions = 0
    pi = 0
    while True:
        while pi < len(pending) and pending[pi].arrival_s <= t:
            waiting.append(pending[pi])
            pi += 1
        if not running and not waiting:
            if pi == len(pending):
                break
            t = pending[pi].arrival_s
            continue
        budget = max_num_batched_tokens
        scheduled: list[tuple[RefRequest, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.num_tokens - r.computed, budget)
            stop = False
            while True:
                extra = math.ceil((r.computed + n) / bs) - r.blocks
                if extra <= free:
                    free -= extra
                    r.blocks += extra
                    break
                victim = running.pop()
                free += victim.blocks
                victim.blocks = 0
                victim.computed = 0
                victim.prefilled = False
                victim.preemptions += 1
                preemptions += 1
                waiting.insert(0, victim)
                preempted = True
                if victim is r:
                    stop = True
                    break
            if stop:
                break
            scheduled.append((r, n))
            budget -= n
            i += 1
        if not preempted:
            while waiting and budget > 0 and len(running) < max_num_seqs:
                r = waiting[0]
                r.computed = r.hit
                n = min(r.num_tokens - r.computed, budget)
                need = math.ceil((r.computed + n) / bs)
                if need > free:
                    break
                waiting.pop(0)
                free -= need
                r.blocks = need
                if math.isnan(r.sched_s):
                    r.sched_s = t
                running.append(r)
                scheduled.append((r, n))
                budget -= n
        if not scheduled:
            assert preempted
            continue
        num_tokens = sum(n for _, n in scheduled)
        sampling = 0
        kv_dec = 0
        units = 0.0
        for r, n in scheduled:
            if r.prefilled:
                kv_dec += r.computed + n
            else:
                units += n * (r.computed + n / 2.0)
            if r.computed + n == r.num_tokens:
                sampling += 1
        d_ms = st.step_ms(num_tokens, sampling, kv_dec, units)
        t_end = t + d_ms / 1000.0
        steps += 1
        busy += d_ms / 1000.0
        done: list[RefRequest] = []
        for r, n in scheduled:
            r.computed += n
            if r.computed == r.num_tokens:
                r.prefilled = True
                r.generated += 1
                gen_tokens += 1
                if r.generated == 1:
                    r.first_token_s = t_end
                else:
                    gap_s = t_end - r.last_token_s
                    itl_counts[bisect_left(ITL_BUCKETS_S, gap_s)] += 1
                r.last_token_s = t_end
                if r.generated >= r.out:
                    r.finish_s = t_end
                    done.append(r)
        for r in done:
            running.remove(r)
            free += r.blocks
            r.blocks = 0
        t = t_end
    assert free == kv_blocks, "blocks leaked"
    return RefResult(reqs, steps, busy, itl_counts, gen_tokens, preemptions)
