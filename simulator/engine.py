"""simulator.engine: one simulated vLLM V1 continuous-batching engine, event-driven.

Owns the scheduling semantics (docs/ARCHITECTURE.md, Plant model) and the per-request ground
truth (`RequestLog`). Times are seconds (`_s`) on the simulation clock; step durations
are milliseconds (`_ms`) from `estimators.stepmodel.StepTimeModel`.

Scheduling, per step (vLLM V1 `Scheduler.schedule`, FCFS):

1. Running requests in admission order: every decoding request gets 1 token; the (at
   most one) partially prefilled request - always the last admitted - gets its next
   chunk, `min(remaining prompt, remaining budget)`. Each needs KV blocks (16 tokens)
   for all its tokens. When an allocation fails, the most recently admitted running
   request is preempted by recompute: its blocks are freed, its computed tokens are lost
   and it goes to the HEAD of the waiting queue; repeat until the allocation fits or the
   request itself was preempted (then scheduling stops).
2. Only if nothing was preempted this step: waiting requests in FCFS order are admitted
   while budget (`max_num_batched_tokens`) remains and fewer than `max_num_seqs` run;
   each is allocated blocks for `min(prompt, budget)` tokens (the last admitted one is
   chunked); the first that cannot get its blocks stops admission.

Prefix-cache hits (`prefix_hit_frac`, default 0): each prefill, resumed ones too, starts
with the whole blocks of that share of its prompt computed (some of it always left, as
vLLM computes at least a prompt's last token); the chunk's attention reads them
(`c (hit + c / 2)`), they hold KV blocks as the request's own (none shared), and
`vllm:prefix_cache_hits_total` counts them against `_queries_total` (tokens needed).

A prefill that completes samples the first token at the end of its step; a decode step
samples one token. A preempted request keeps the tokens it already streamed (as vLLM V1
does): on resume it recomputes prompt + generated tokens in one prefill (chunked as
usual) whose step samples its next token. Prompts longer than `max_model_len` are
refused at enqueue (counted); outputs are capped so prompt + output <= max_model_len.

Speed (the fast path; exact, not approximate). The engine keeps a step counter `k`.
A decoding request with offset `off` has context `off + k` at step `k` (tokens in KV
after that step), so the summed decode context is `s_off + n_dec * k` (O(1)), it
finishes at a known step (a heap keyed by finishing step), and it needs a new block at
step `k` exactly when `(off + k - 1) % 16 == 0`: requests are counted per residue class
of `off mod 16`, so the number of blocks a step allocates, and the first step at which
allocation would fail, follow from 16 counters, and runs of pure-decode steps go as one
*jump* (simulator.engine_jump). Only a preempting step walks the running list
(simulator.engine_preempt).
`tests/simulator/test_differential.py` checks this against a per-request reference.

Timing model: steps run back to back while the engine has work; a step is decided at
its start and its effects (tokens, completions, freed blocks) apply at its end. A request
that arrives during a step is considered at the next step start. Gauges read between
steps reflect the in-flight step's scheduling decisions.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass
from heapq import heappop, heappush

from controller.types import Knobs
from estimators.histogram import E2E_BUCKETS_S, QUEUE_BUCKETS_S, TTFT_BUCKETS_S
from estimators.stepmodel import Profile
from simulator.engine_jump import DecodeJumps, steps_within
from simulator.engine_metrics import (
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS_MS,
    REQUEST_PHASE_BUCKETS_S,
    TPOT_BUCKETS_S,
    EngineMetrics,
)
from simulator.engine_preempt import Preemption
from simulator.requests import RequestLog

INF = math.inf


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one step (or a jump of `steps` identical-composition decode steps) did.

    Only collected when the engine is given a `step_log` list (tests, debugging).
    `chunks` are (rid, tokens, tokens already computed) prefill pieces in schedule order;
    `preempted` the rids preempted while scheduling, in order.
    """

    start_s: float
    end_s: float
    index: int
    steps: int
    decodes: tuple[int, ...]
    chunks: tuple[tuple[int, int, int], ...]
    preempted: tuple[int, ...]


class _Req:
    """Engine-side state of one request (hot: plain slots)."""

    __slots__ = (
        "arr",
        "blocks",
        "comp",
        "fin",
        "gen",
        "gen0",
        "hit",
        "k0",
        "last_tok",
        "need",
        "npre",
        "off",
        "out",
        "prompt",
        "rid",
        "sched",
    )

    def __init__(self, rid: int, arr: float, prompt: int, out: int, hit: int = 0) -> None:
        self.rid = rid
        self.arr = arr  # engine arrival (dispatch) time, s
        self.prompt = prompt
        self.out = out  # output tokens to generate in total
        self.gen = 0  # tokens generated so far (valid while not decoding)
        self.need = prompt  # tokens the current prefill must compute (prompt + gen)
        self.hit = hit  # of those, found in the prefix cache at each prefill's start
        self.comp = 0  # tokens of the current prefill computed
        self.blocks = 0  # KV blocks held while prefilling
        self.off = 0  # decode: context at step k is off + k
        self.k0 = 0  # decode: first decode step
        self.gen0 = 0  # decode: tokens generated when decoding started
        self.fin = -1  # decode: step producing the last token
        self.sched = -1.0  # first scheduled, s
        self.last_tok = -1.0  # time of the last token before a preemption, s
        self.npre = 0


class Engine(DecodeJumps, Preemption):
    """One vLLM V1 engine replica on the simulation clock.

    Drive it with `enqueue(rid, t_s, prompt_tokens, output_tokens)` for arrivals in time
    order (after `advance_to(t_s)`) and `advance_to(t_s)`, which applies every step that
    ends at or before `t_s` and schedules the next one when it starts before `t_s`.
    `advance_to(t_s, exact=True)` also applies the finished prefix of an in-flight
    decode jump (for scrapes). `wake_s` is the earliest time at which `advance_to` has
    anything to do (inf when idle), so an idle engine costs nothing.
    """

    def __init__(
        self,
        profile: Profile,
        knobs: Knobs,
        *,
        log: RequestLog | None = None,
        start_s: float = 0.0,
        kv_capacity_blocks: int | None = None,
        max_model_len: int | None = None,
        step_log: list[StepRecord] | None = None,
        overhead_s: float = 0.0,
        prefix_hit_frac: float = 0.0,
    ) -> None:
        self.profile = profile
        self.knobs = knobs
        self.mns, self.mnbt = checked_knobs(knobs)
        self.bs = bs = profile.memory.block_size_tokens
        self.total_blocks = (
            int(kv_capacity_blocks)
            if kv_capacity_blocks is not None
            else profile.kv_capacity_blocks
        )
        self.max_model_len = (
            int(max_model_len) if max_model_len is not None else profile.max_model_len
        )
        if self.total_blocks * bs < self.max_model_len:
            raise ValueError(
                f"KV cache ({self.total_blocks * bs} tokens) smaller than max_model_len "
                f"({self.max_model_len}): vLLM refuses to start"
            )
        self._set_step_model(profile)
        if not (math.isfinite(overhead_s) and overhead_s >= 0):
            raise ValueError(f"overhead_s must be finite and >= 0, got {overhead_s}")
        # Server time a request spent before it reached the engine (HTTP, tokenization):
        # the fleet delivers it that much later; vLLM's TTFT and e2e include it.
        self.overhead_s = float(overhead_s)
        if not (0.0 <= prefix_hit_frac < 1.0):
            raise ValueError(f"prefix_hit_frac must be in [0, 1), got {prefix_hit_frac}")
        self.prefix_hit_frac = float(prefix_hit_frac)
        self.log = log if log is not None else RequestLog()
        self.metrics = EngineMetrics(self.max_model_len)
        self.start_s = float(start_s)

        self.k = 0  # index of the next step
        self.t_next = float(start_s)  # start of the next step when none is in flight
        self.free = self.total_blocks
        self.waiting: deque[_Req] = deque()
        self.dec: dict[int, _Req] = {}  # decoding requests, admission order
        self.partial: _Req | None = None  # the (last admitted) partially prefilled request
        self.heap: list[tuple[int, int]] = []  # (finishing step, rid); lazy deletion
        self.cnt = [0] * bs  # decoding requests per residue of off mod bs
        self.n_dec = 0
        self.s_off = 0
        self.n_out = 0  # outstanding requests: waiting + running (router's view)
        # in-flight work: 0 none, 1 one general step, 2 a pure-decode jump
        self.fl_kind = 0
        self.t_end = INF
        self.wake_s = INF
        self.fl_first: list[_Req] = []
        self.fl_nd = 0
        self.fl_d = 0.0
        self.fl_n = 0
        self.j_k0 = 0
        self.j_m = 0
        self.j_a = 0.0
        self.j_b = 0.0
        self.j_t0 = 0.0
        self.step_log = step_log
        self._log_pre: list[int] = []
        self._log_chunks: list[tuple[int, int, int]] = []

    # -- observables -----------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Requests waiting (including preempted ones), the `vllm:num_requests_waiting` gauge."""
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        """Requests running (decoding, prefilling, or admitted in the in-flight step)."""
        n = self.n_dec + (1 if self.partial is not None else 0)
        if self.fl_kind == 1:
            n += len(self.fl_first)
        return n

    @property
    def kv_usage_frac(self) -> float:
        """Fraction of KV blocks allocated, `vllm:kv_cache_usage_perc` (1 = full)."""
        return 1.0 - self.free / self.total_blocks

    def busy_s_at(self, t_s: float) -> float:
        """GPU busy seconds up to `t_s`: finished steps plus the elapsed part of the
        in-flight step or jump (steps run back to back from its start)."""
        busy = self.metrics.busy_s
        if self.fl_kind == 1:
            start = self.t_end - self.fl_d / 1000.0
        elif self.fl_kind == 2:
            start = self.j_t0
        else:
            return busy
        if t_s > start:
            busy += min(t_s, self.t_end) - start
        return busy

    @property
    def is_empty(self) -> bool:
        """No request waiting, running or in flight."""
        return self.n_out == 0 and self.fl_kind == 0

    @property
    def steps(self) -> int:
        """Steps executed so far."""
        return self.k

    # -- arrivals ----------------------------------------------------------------------------

    def enqueue(self, rid: int, t_s: float, prompt_tokens: int, output_tokens: int) -> bool:
        """Hand request `rid` to this engine at `t_s` (not before the last `advance_to`).

        The engine first advances to `t_s`, so a step that starts before `t_s` never
        sees the request and one that starts at or after `t_s` can admit it.
        Returns False when refused (prompt longer than max_model_len): it is counted in
        `metrics.refused`, marked in the log, and never queued.
        """
        if self.wake_s <= t_s:
            self.advance_to(t_s)
        log = self.log
        if prompt_tokens > self.max_model_len:
            self.metrics.refused += 1
            log.refused[rid] = True
            log.dispatch_s[rid] = t_s
            return False
        out = output_tokens
        room = self.max_model_len - prompt_tokens
        if out > room or out < 1:
            out = max(1, room if out > room else out)
            log.output_tokens[rid] = out  # the tokens it will actually generate
        log.dispatch_s[rid] = t_s
        hit = int(prompt_tokens * self.prefix_hit_frac) // self.bs * self.bs
        r = _Req(rid, t_s, prompt_tokens, out, hit)  # hit < prompt: frac < 1
        if self.fl_kind == 2 and not self.waiting:
            self._truncate_jump(t_s)
        idle = self.n_out == 0 and self.fl_kind == 0
        self.waiting.append(r)
        self.n_out += 1
        if idle:
            if self.t_next < t_s:
                self.t_next = t_s
            self.wake_s = self.t_next
        return True

    def set_knobs(self, knobs: Knobs, t_s: float) -> None:
        """Change the knobs live at `t_s`, as the governor's scheduler plugin does (README,
        "Real engine"): the steps that start at or after `t_s` use the new admission cap
        and token budget; a step in flight keeps its composition and a decode jump is cut
        after the step in flight at `t_s`. Over a lowered cap, the newest running requests
        are preempted at the next step start (back to the front of the waiting queue, as
        vLLM preempts for KV space)."""
        mns, mnbt = checked_knobs(knobs)
        self._cut_at(t_s)
        self.knobs, self.mns, self.mnbt = knobs, mns, mnbt

    def set_profile(self, profile: Profile, t_s: float) -> None:
        """The hardware changes at `t_s` (simulator.plant's speed change): the steps that
        start at or after `t_s` take `profile`'s step times; a step in flight keeps its
        duration and a decode jump is cut after the step in flight at `t_s`. Only the
        step times change (the KV cache and context length stay the engine's)."""
        self._cut_at(t_s)
        self.profile = profile
        self._set_step_model(profile)

    def _cut_at(self, t_s: float) -> None:
        """Apply every step up to `t_s` (seconds) and cut an in-flight decode jump after
        its step in flight at `t_s`, so what changes now changes the steps after it."""
        if self.wake_s <= t_s:
            self.advance_to(t_s)
        if self.fl_kind == 2:
            self._truncate_jump(t_s)

    def _set_step_model(self, profile: Profile) -> None:
        """The step-time coefficients (ms, per unit) the steps read, from `profile`."""
        st = profile.step_model()
        self._floor, self._base, self._per_token = st.floor, st.base, st.per_token
        self._fixed, self._per_seq, self._per_kv = st.fixed, st.per_seq, st.per_kv
        self._attn = st.attn

    # -- time ----------------------------------------------------------------------------------

    def advance_to(self, t_s: float, exact: bool = False) -> None:
        """Apply every step ending at or before `t_s`; schedule the next when it starts before.

        With `exact`, also apply the steps of an in-flight decode jump that end by `t_s`,
        so counters and gauges are exact at `t_s` (scrapes).
        """
        while True:
            kind = self.fl_kind
            if kind:
                if self.t_end > t_s:
                    break
                if kind == 1:
                    self._finish_step()
                else:
                    self._apply_jump(self.j_m)
            if self.n_out == 0:
                self.wake_s = INF
                return
            if self.t_next >= t_s:
                self.wake_s = self.t_next
                return
            self._schedule(self.t_next)
        self.wake_s = self.t_end
        if exact and kind == 2 and self.j_t0 < t_s:
            mm = steps_within(self.j_a, self.j_b, self.j_t0, t_s, self.j_m, strict=False)
            if mm > 0:
                self._apply_jump(mm)
                self.wake_s = self.t_end

    # -- scheduling ----------------------------------------------------------------------------

    def _schedule(self, t0: float) -> None:
        """Decide the step starting at `t0` (or a pure-decode jump) and put it in flight."""
        if self.n_dec + (self.partial is not None) > self.mns:  # a cap lowered live
            self._preempt_over_cap(t0)
        k = self.k
        nd = self.n_dec
        bs = self.bs
        cnt = self.cnt
        free = self.free
        p = self.partial
        waiting = self.waiting
        preempted = False
        if nd:
            need = cnt[(1 - k) % bs]
            if need > free:
                self._preempt_for_decodes(k, t0)
                nd = self.n_dec
                free = self.free
                p = self.partial
                preempted = True
            else:
                if p is None:
                    # Pure decode unless the waiting head can be admitted now.
                    admissible = False
                    if waiting and nd < self.mns:
                        budget = self.mnbt - nd
                        r = waiting[0]
                        c = r.need - r.hit
                        c = c if c < budget else budget
                        admissible = -(-(r.hit + c) // bs) <= free - need
                    if not admissible:
                        m = self._jump_len(k, free, nd)
                        if m > 1:
                            self._start_jump(t0, k, m)
                            return
                free -= need
        budget = self.mnbt - nd
        n_tok = nd
        n_samp = nd
        units = 0.0
        first: list[_Req] = []
        n_run = nd
        if p is not None:
            n_run += 1
            if budget > 0:
                comp = p.comp
                c = p.need - comp
                if c > budget:
                    c = budget
                nb = -(-(comp + c) // bs) - p.blocks
                if nb > free:
                    # The partial prefill is the last running request: it preempts itself.
                    free += self._preempt_partial()
                    n_run -= 1
                    preempted = True
                else:
                    free -= nb
                    p.blocks += nb
                    if self.step_log is not None:
                        self._log_chunks.append((p.rid, c, comp))
                    units += c * (comp + c * 0.5)
                    p.comp = comp + c
                    n_tok += c
                    budget -= c
                    if p.comp == p.need:
                        first.append(p)
                        self.partial = None
                        n_samp += 1
        if not preempted:
            free, tok, samp, units_new = self._admit(t0, free, budget, n_run, first)
            n_tok += tok
            n_samp += samp
            units += units_new
        self.free = free
        if n_tok == 0:
            # Only possible when this step preempted everything it had: nothing runs,
            # the next step (same instant, same index) admits from the waiting queue.
            if not preempted:
                raise RuntimeError("engine scheduled an empty step without preemption")
            self.fl_kind = 0
            if self.step_log is not None:
                self._log_step(t0, t0, k, 0)
            return
        self._start_step(t0, k, nd, n_tok, n_samp, units, first)

    def _start_step(
        self, t0: float, k: int, nd: int, n_tok: int, n_samp: int, units: float, first: list[_Req]
    ) -> None:
        """Put the step starting at `t0` in flight: `nd` decodes and `n_tok` tokens in all,
        `n_samp` sequences sampled, prefill attention `units` (tokens^2), the requests
        whose prefill completes in it `first`; its duration from the step-time model
        (ms)."""
        lin = self._base + self._per_token * n_tok
        if lin < self._floor:
            lin = self._floor
        d = (
            lin
            + self._fixed
            + self._per_seq * n_samp
            + self._per_kv * (self.s_off + nd * k)
            + self._attn * units
        )
        self.fl_kind = 1
        self.fl_first = first
        self.fl_nd = nd
        self.fl_d = d
        self.fl_n = n_tok
        self.t_end = t0 + d / 1000.0
        if self.step_log is not None:
            self._log_step(t0, self.t_end, k, 1)

    def _admit(
        self, t0: float, free: int, budget: int, n_run: int, first: list[_Req]
    ) -> tuple[int, int, int, float]:
        """Step 2 of the module doc: admit waiting requests that arrived by `t0` in FCFS
        order while `budget` tokens, `free` KV blocks and sequence slots (`n_run` run)
        remain; the last one admitted may be chunked (it becomes the partial prefill),
        the others complete their prefill this step (appended to `first`). Returns the
        blocks left free, the tokens and sampled sequences the admissions add to the
        step, and their attention units (tokens^2 / 2)."""
        waiting, bs, mns, mt = self.waiting, self.bs, self.mns, self.metrics
        n_tok = n_samp = 0
        units = 0.0
        while waiting and budget > 0 and n_run < mns:
            r = waiting[0]
            if r.arr > t0:
                break
            need_r, hit = r.need, r.hit
            c = need_r - hit
            c = c if c < budget else budget
            nb = -(-(hit + c) // bs)
            if nb > free:
                break
            waiting.popleft()
            free -= nb
            r.blocks = nb
            r.comp = hit + c
            if r.sched < 0.0:
                r.sched = t0
                self.log.sched_s[r.rid] = t0
            mt.prefix_queries += need_r
            mt.prefix_hits += hit
            if self.step_log is not None:
                self._log_chunks.append((r.rid, c, hit))
            units += c * (hit + c * 0.5)
            n_tok += c
            budget -= c
            n_run += 1
            if hit + c == need_r:
                first.append(r)
                n_samp += 1
            else:
                self.partial = r
        return free, n_tok, n_samp, units

    def _log_step(self, t0: float, t1: float, k: int, steps: int) -> None:
        assert self.step_log is not None
        self.step_log.append(
            StepRecord(
                t0,
                t1,
                k,
                steps,
                tuple(self.dec),
                tuple(self._log_chunks),
                tuple(self._log_pre),
            )
        )
        self._log_chunks = []
        self._log_pre = []

    def _finish_step(self) -> None:
        """Apply the in-flight general step's effects at its end."""
        k = self.k
        t1 = self.t_end
        d = self.fl_d
        m = self.metrics
        m.busy_s += d / 1000.0
        m.steps += 1
        n_tok = self.fl_n
        m.iter_tokens[bisect_left(ITERATION_TOKENS_BUCKETS, n_tok)] += 1
        m.iter_tokens_sum += n_tok
        nd = self.fl_nd
        if nd:
            m.itl[bisect_left(ITL_BUCKETS_MS, d)] += nd
            m.itl_sum += nd * d / 1000.0
            m.generation_tokens += nd
            self._complete_decoders(t1, k)
        if self.fl_first:
            self._first_tokens(self.fl_first, t1, k)
        self.k = k + 1
        self.t_next = t1
        self.fl_kind = 0

    def _first_tokens(self, reqs: list[_Req], t1: float, k: int) -> None:
        """Requests whose prefill completed in step `k` (ending at `t1`) sample a token."""
        m = self.metrics
        log = self.log
        dec = self.dec
        cnt = self.cnt
        bs = self.bs
        for r in reqs:
            if r.gen == 0:
                ttft = t1 - r.arr + self.overhead_s
                m.ttft[bisect_left(TTFT_BUCKETS_S, ttft)] += 1
                m.ttft_sum += ttft
                m.prompt_tokens += r.prompt
                log.first_token_s[r.rid] = t1
            else:
                gap = t1 - r.last_tok
                m.itl[bisect_left(ITL_BUCKETS_MS, gap * 1000.0)] += 1
                m.itl_sum += gap
            m.generation_tokens += 1
            gen = r.gen + 1
            r.gen = gen
            if gen >= r.out:
                self.free += r.blocks
                r.blocks = 0
                self._record_finish(r, t1)
            else:
                k0 = k + 1
                off = r.need + 1 - k0
                r.off = off
                r.k0 = k0
                r.gen0 = gen
                r.fin = fin = k0 + r.out - gen - 1
                r.blocks = 0  # from now on derived from off (same count)
                dec[r.rid] = r
                cnt[off % bs] += 1
                self.n_dec += 1
                self.s_off += off
                heappush(self.heap, (fin, r.rid))

    def _complete_decoders(self, t1: float, k: int) -> None:
        """Complete every decoder whose last token came at step `k` or before (the
        step or jump ending at `t1`); heap entries of preempted requests are dropped."""
        heap = self.heap
        dec = self.dec
        while heap and heap[0][0] <= k:
            f, rid = heappop(heap)
            r = dec.get(rid)
            if r is not None and r.fin == f:
                self._complete_decoder(r, t1, k)

    def _complete_decoder(self, r: _Req, t1: float, k: int) -> None:
        """Decoding request `r` produced its last token in step `k` ending at `t1`."""
        off = r.off
        self.free += -(-(off + k) // self.bs)
        self.cnt[off % self.bs] -= 1
        self.n_dec -= 1
        self.s_off -= off
        del self.dec[r.rid]
        r.gen = r.out
        self._record_finish(r, t1)

    def _record_finish(self, r: _Req, t1: float) -> None:
        m = self.metrics
        m.success += 1
        e2e = t1 - r.arr + self.overhead_s
        m.e2e[bisect_left(E2E_BUCKETS_S, e2e)] += 1
        m.e2e_sum += e2e
        # vLLM V1 per-request phases, observed when the request finishes (as its
        # PrometheusStatLogger records finished requests): queue from arrival to first
        # scheduled, prefill from first scheduled to first token, decode from first token
        # to last, TPOT = decode / (tokens - 1) (0 for one token).
        q = r.sched - r.arr
        m.queue[bisect_left(QUEUE_BUCKETS_S, q)] += 1
        m.queue_sum += q
        t_first = self.log.first_token_s[r.rid]
        pre = t_first - r.sched
        m.prefill_t[bisect_left(REQUEST_PHASE_BUCKETS_S, pre)] += 1
        m.prefill_t_sum += pre
        dec = t1 - t_first
        m.decode_t[bisect_left(REQUEST_PHASE_BUCKETS_S, dec)] += 1
        m.decode_t_sum += dec
        tpot = dec / (r.out - 1) if r.out > 1 else 0.0
        m.tpot[bisect_left(TPOT_BUCKETS_S, tpot)] += 1
        m.tpot_sum += tpot
        tb = m.token_bounds
        m.req_prompt[bisect_left(tb, r.prompt)] += 1
        m.req_prompt_sum += r.prompt
        m.req_gen[bisect_left(tb, r.out)] += 1
        m.req_gen_sum += r.out
        self.log.finish_s[r.rid] = t1
        self.n_out -= 1


def checked_knobs(knobs: Knobs) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) of `knobs`, refused as vLLM refuses them."""
    mns, mnbt = int(knobs.max_num_seqs), int(knobs.max_num_batched_tokens)
    if mns < 1 or mnbt < 1:
        raise ValueError(f"knobs must be >= 1, got {knobs}")
    if mnbt < mns:
        # vLLM refuses to start with this configuration.
        raise ValueError(
            f"max_num_batched_tokens ({mnbt}) must be >= max_num_seqs ({mns}) (vLLM rule)"
        )
    return mns, mnbt
