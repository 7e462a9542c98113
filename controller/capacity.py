"""Per-replica capacity at the SLA: a queueing model of one continuous-batching engine.

`capacity_rps` answers: how many requests per second can one replica with these knobs
serve while `sla.attainment_goal_frac` of its requests (default 99 %) meet both the TTFT
target and the mean inter-token-latency target? It bisects on the per-replica arrival
rate `lam` (req/s) over the model below.

Why not a fluid model: spreading every prompt's prefill evenly over all steps predicts a
mean step of 12 ms at 16 req/s on the conversation trace, where the engine runs 30 ms
(measured in the simulated plant): decode-only steps sit at the step-time floor, and the
prefill comes in chunks that make ~40 % of the steps 50+ ms long. And a mean within
the target is a median request at the target, not 99 % of requests.

The model (lengths lognormal, fitted to each mean and p95, moments truncated at the
profile's max_model_len: controller.lognormal; `w(L) = per_token L + attn L^2 / 2`
the prefill work of an L-token prompt, ms):

1. Mean step T (ms), a fixed point: B = lam Lout T decoding sequences; a decode-only
   step takes Td = max(floor, base + per_token B) + fixed + B (per_seq + per_kv ctx);
   prompts add their prefill work, minus the floor slack of the steps that carry a
   chunk (fraction f = 1 - exp(-lam T), or more where chunks are budget-bound), at most
   all of that work: T = Td + lam T E[w] - min(f slack, lam T E[w]) + f per_seq. (A
   chunk step is never faster than the floor: short prompts, whose work fits within
   the slack, leave a step at the floor; with the slack subtracted whole, 32-token
   prompts read a step 10-25 % shorter than the plant's at 20-90 req/s.)
2. ITL at the goal quantile: a request decoding Lout tokens (the output median) over
   D = Lout T shares its steps with N ~ Poisson(lam D) prompts' prefills; its mean ITL
   is Td + sum(w(L_i)) / Lout. The quantile of that sum: the larger of a normal
   approximation and the single-big-prompt bound (heavy-tailed prompts: one prompt at
   the 1 - (1 - goal) / (lam D) quantile dominates).
3. TTFT at the goal quantile: overhead + the step in flight (T) + the wait in the
   prefill queue (service S(L) = chunks x Td + w(L); prompts over the p99.75 left out
   of the moments, see TAIL_SHARE) + the p95 prompt's own prefill. A request waits only
   when every replica is busy (least-outstanding routing: Erlang C of c = the fleet's
   replicas), and then behind the work of the replica it was sent to: an exponential
   tail to the goal quantile that drains at one replica's spare capacity (1 - rho), not
   a shared queue's c (1 - rho) (`pooled_servers`).
4. Decodes within max_num_seqs and KV capacity.

Prefix-cache hits (`Lengths.prefix_hit_frac` = h, the share of prompt tokens the engines
find cached; `priced_hit_frac`) are not computed: a prompt's prefill work is
`per_token (1 - h) L + attn (1 - h^2) L^2 / 2` (its attention still reads all L tokens)
and it takes (1 - h) L tokens of the token budget; its context counts whole (decode
cost, KV). At h = 0 every term is the model above, bit for bit.

Measured against the simulated plant (docs/capacity.md, `python -m
simulator.capacity_check`: Poisson arrivals with each matrix trace's lengths, the knobs
the governor picks, 1-8 warm replicas): the model reads 0.78x-0.90x the plant's 99 %
capacity on conversation x16's lengths, 0.99x-1.16x on diurnal's, 0.40x-0.64x on code
x4's, and on long-context's (prompts mean 12k, p95 40k; 16 / 1,280 knobs) 1.88x on one
replica down to 0.82x on eight, as step 2's single-big-prompt bound does not pool
across replicas nor depend on the chunk size (tests/simulator/test_capacity_vs_plant.py
pins four replicas). The fluid model this replaces read one replica at 17.8 req/s on
conversation lengths and 1.77 on long-context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.config import SLA
from controller.lognormal import Prompts, lognormal_sigma, normal_quantile
from controller.types import Knobs, Lengths
from estimators.stepmodel import Profile

KV_RESERVE_FRAC = 0.9
"""Decodes may fill this fraction of the KV cache at their mean full context."""
TAIL_SHARE = 0.25
"""The prompts above the 1 - TAIL_SHARE x (1 - goal) quantile (p99.75 for a 99 % goal)
are left out of the queueing moments: a quarter of the misses the goal allows. Their
prefill would set the tail moments the model uses (a lognormal's 4th moment at sigma
1.2 comes mostly from prompts over 20k tokens), although they are a few requests."""
_FIXED_POINT_ITERS = 60
_BISECTION_STEPS = 24
_LIMIT_STEP = 1e-3
"""How far above its capacity `binding_limit` reads the model (fraction of the rate):
enough to clear the bisection's last bracket and the fixed point's tolerance."""


@dataclass(frozen=True, slots=True)
class Operating:
    """The model at one per-replica rate: mean step, decodes, chunk-step fraction (ms,
    sequences, fraction) and the goal-quantile ITL and TTFT (ms)."""

    step_ms: float
    decodes: float
    chunk_frac: float
    itl_q_ms: float
    ttft_q_ms: float


def operating_point(
    lam: float, knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int = 1
) -> Operating | None:
    """The model's operating point at `lam` req/s per replica of `replicas` (module doc),
    or None where a replica cannot keep up (saturated, decodes over max_num_seqs or the
    KV cache)."""
    return _Model.of(knobs, lengths, sla, profile, replicas).at(lam)


def capacity_rps(
    knobs: Knobs,
    lengths: Lengths,
    sla: SLA,
    profile: Profile,
    target_utilization_frac: float,
    replicas: int = 1,
) -> float:
    """Requests/s per replica that a fleet of `replicas` with `knobs` serves with
    `sla.attainment_goal_frac` of requests within the SLA (module doc), times the target
    utilization. Always > 0. Example (conversation lengths, SLA 500 / 50 ms, 152 / 2,560
    knobs, goal 99 %): 13.1 req/s on one replica.

    Lengths are read to LENGTH_DIGITS significant digits, and answers are kept per
    (profile, knobs, lengths so read, SLA, fleet size): the smoothed lengths move little
    from tick to tick, and the model costs ~0.5 ms of CPU per answer.
    """
    key, rounded = _key(knobs, lengths, sla, profile, replicas)
    answer = _cached_capacity(key, knobs, Lengths(*rounded), sla, profile, replicas)
    return max(answer * target_utilization_frac, CAPACITY_FLOOR_RPS)


def capacity_limit(
    knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int = 1
) -> str:
    """`binding_limit` (which target bounds `capacity_rps`: one of LIMITS), kept per key
    as `capacity_rps` keeps its answers, and read above the capacity it keeps: what a
    decision reports about its sizing, so a tick that reuses a capacity reuses its limit
    and a new key costs one operating point more than its capacity."""
    key, rounded = _key(knobs, lengths, sla, profile, replicas)
    hit = _LIMITS.get(key)
    if hit is None or hit[0] is not profile:
        if len(_LIMITS) >= _CACHE_SIZE:
            _LIMITS.clear()
        read = Lengths(*rounded)
        lam = _cached_capacity(key, knobs, read, sla, profile, replicas)
        hit = _LIMITS[key] = (profile, _limit_above(knobs, read, sla, profile, replicas, lam))
    return hit[1]


def _cached_capacity(
    key: tuple[Any, ...], knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int
) -> float:
    """`_capacity` on `lengths` (already rounded), kept under `key` (`_key`)."""
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not profile:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        hit = _CACHE[key] = (profile, _capacity(knobs, lengths, sla, profile, replicas))
    return hit[1]


def _key(
    knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int
) -> tuple[tuple[Any, ...], tuple[float, ...]]:
    """The cache key of `capacity_rps` and `capacity_limit`, and the lengths as they read
    them (`_rounded`)."""
    # The key from plain fields (a dataclass's `astuple` deep-copies: ~10 us a call),
    # the rounding kept for the last Lengths object (held, so its id cannot be reused):
    # a decider asks for 2-3 fleet sizes with the same lengths in a row.
    last = _LAST_ROUNDED[0]  # one read: another thread may swap the pair meanwhile
    if last[0] is lengths:
        rounded = last[1]
    else:
        rounded = _rounded(lengths)
        _LAST_ROUNDED[0] = (lengths, rounded)
    key = (
        id(profile),
        knobs.max_num_seqs,
        knobs.max_num_batched_tokens,
        rounded,
        sla.ttft_p95_ms,
        sla.itl_p95_ms,
        sla.attainment_goal_frac,
        replicas if replicas > 1 else 1,
    )
    return key, rounded


CAPACITY_FLOOR_RPS = 1e-3
"""What `capacity_rps` answers where no rate meets the SLA (req/s per replica)."""
RELAX_FACTOR = 1.5
"""An SLA target that one unloaded replica comes within this factor of is sized for at
this multiple of what that replica gives (see relaxed_sla). At 2 (before) engines 4x
slower than the profile were sized for a relaxed target that still met few requests:
diurnal 84.54 % and conversation x16 52.49 % (hpa-queue 90.35 % and 52.17 %); 1.25-1.75
meet 91.89-92.52 % and 81.17 % there (tests/scenario/test_far_off.py), and no matrix
cell moves between 1.5 and 2 (no plant of the matrices is slow enough to relax)."""


def relaxed_sla(knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile) -> SLA | None:
    """The SLA to size a fleet for where one replica at a trickle of load gives more
    than 1 / RELAX_FACTOR of a target (TTFT or ITL), or None where it gives less of
    both (or no fixed point exists even at a trickle).

    More replicas cannot make a step faster than an unloaded replica's: a target below
    what a replica gives at a trickle (e.g. engines learned 5x slower than the profile)
    is out of every fleet's reach, and sizing for it asks for replicas without end. A
    target just above it leaves the queue a few ms: each replica adds little, and where
    the belief crossed the edge the capacity jumped (prompts 3x longer, the believed p95
    prompt taking most of a 500 ms TTFT target to prefill: 2.74 req/s per replica at
    the relaxed target, 0.75 at the true one 5 s later, as the smoothed p95 fell by 0.1 %;
    the fleet went 27 -> 57 replicas in one tick). So each target in reach of the
    trickle's value x RELAX_FACTOR is sized for max(target, RELAX_FACTOR x that value),
    which is the target itself at the band's edge; the decider reports SLA_INFEASIBLE.
    Example: ITL target 50 ms, a replica's unloaded step 80 ms -> sized for 120 ms; 40 ms
    -> 60 ms; 30 ms -> 50 ms (None).

    Lengths are read as `capacity_rps` reads them, and answers kept per key likewise.
    """
    key, rounded = _key(knobs, lengths, sla, profile, 1)
    hit = _RELAXED.get(key)
    if hit is None or hit[0] is not profile:
        if len(_RELAXED) >= _CACHE_SIZE:
            _RELAXED.clear()
        hit = _RELAXED[key] = (profile, _relaxed(knobs, Lengths(*rounded), sla, profile))
    return hit[1]


def _relaxed(knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile) -> SLA | None:
    """`relaxed_sla` on `lengths` (already rounded), computed."""
    model = _Model.of(knobs, lengths, sla, profile, 1)
    op = model.at(1e-6 * model.ceiling_rps)
    if op is None:
        return None
    itl, ttft = sla.itl_p95_ms, sla.ttft_p95_ms
    if RELAX_FACTOR * op.itl_q_ms <= itl and RELAX_FACTOR * op.ttft_q_ms <= ttft:
        return None
    return sla.model_copy(
        update={
            "itl_p95_ms": max(itl, RELAX_FACTOR * op.itl_q_ms),
            "ttft_p95_ms": max(ttft, RELAX_FACTOR * op.ttft_q_ms),
        }
    )


LENGTH_DIGITS = 3
_LAST_ROUNDED: list[tuple[Any, tuple[float, ...]]] = [(None, ())]
_CACHE_SIZE = 16_384  # > 3 fleet sizes x 5,000 models: a full table is cleared
_CACHE: dict[tuple[Any, ...], tuple[Profile, float]] = {}
_LIMITS: dict[tuple[Any, ...], tuple[Profile, str]] = {}
_RELAXED: dict[tuple[Any, ...], tuple[Profile, SLA | None]] = {}


def _rounded(lengths: Lengths) -> tuple[float, float, float, float, float]:
    """The lengths as `capacity_rps` reads them (LENGTH_DIGITS significant digits; the
    prefix-cache hit share as `priced_hit_frac`)."""
    return (
        _significant(lengths.prompt_mean),
        _significant(lengths.prompt_p95),
        _significant(lengths.output_mean),
        _significant(lengths.output_p95),
        priced_hit_frac(lengths.prefix_hit_frac),
    )


HIT_STEP = 0.05
"""The prefix-cache hit share is priced in steps of this much, rounded down."""
HIT_MAX = 0.95
"""The largest share of a prompt priced as prefix-cache hits: some of every prompt is
prefilled (vLLM recomputes at least its last token)."""


def priced_hit_frac(hit: float) -> float:
    """The share of prompt tokens priced as found in the prefix cache: `hit` rounded
    down to HIT_STEP, so a share that wanders by a point does not move the capacity
    and one read a hair low never prices more than was seen. Example: 0.57 -> 0.55."""
    return math.floor(min(max(hit, 0.0), HIT_MAX) / HIT_STEP + 1e-9) * HIT_STEP


def _significant(v: float) -> float:
    """`v` to LENGTH_DIGITS significant digits. Example: 1,155.4 -> 1,160."""
    if not (math.isfinite(v) and v > 0):
        return v
    return round(v, LENGTH_DIGITS - 1 - math.floor(math.log10(v)))


def _capacity(knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int) -> float:
    """The bisection of `capacity_rps` (req/s per replica, no utilization factor)."""
    model = _Model.of(knobs, lengths, sla, profile, replicas)
    lo, hi = 0.0, model.ceiling_rps
    t_lo = None  # the mean step at `lo`: T rises with the rate, so it starts mid's iteration
    itl_max, ttft_max = sla.itl_p95_ms, sla.ttft_p95_ms
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        # `model.at(mid, t_lo)` within both targets, without building the Operating
        # record, and the TTFT left out where the ITL already fails: the same answer.
        t = model.step_fixed_point(mid, t_lo)
        if t is not None and model.within(mid, t, itl_max, ttft_max):
            lo, t_lo = mid, t
        else:
            hi = mid
    return lo


def binding_limit(
    knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int = 1
) -> str:
    """Which limit the model reaches first as the per-replica rate rises past its
    capacity (`capacity_rps` without the utilization factor): "ITL" or "TTFT" (that
    goal quantile over its target), or "saturation" (no mean step: the replica cannot
    keep up, or its decodes exceed max_num_seqs or the KV cache). Read _LIMIT_STEP above
    the capacity, on the lengths as `capacity_rps` reads them. Example: conversation lengths,
    SLA 500 / 50 ms, 152 / 2,560 knobs, one replica -> "TTFT"."""
    lengths = Lengths(*_rounded(lengths))
    lam = _capacity(knobs, lengths, sla, profile, replicas)
    return _limit_above(knobs, lengths, sla, profile, replicas, lam)


LIMITS = ("ITL", "TTFT", "saturation")
"""What `binding_limit` answers."""


def _limit_above(
    knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int, lam: float
) -> str:
    """`binding_limit` given the capacity `lam` (req/s per replica, `_capacity`'s answer
    on these rounded `lengths`)."""
    model = _Model.of(knobs, lengths, sla, profile, replicas)
    op = model.at(lam * (1.0 + _LIMIT_STEP) + model.ceiling_rps / 2.0**_BISECTION_STEPS)
    if op is None:
        return "saturation"
    return "ITL" if op.itl_q_ms > sla.itl_p95_ms else "TTFT"


class _Model:
    """The loop invariants of one (knobs, lengths, sla, profile)."""

    __slots__ = (
        "attn_p",
        "budget",
        "ceiling_rps",
        "computed",
        "ctx_full",
        "e_lw",
        "e_w",
        "e_w2",
        "goal",
        "kv_cap",
        "m",
        "m1c",
        "max_seqs",
        "out_mean",
        "out_med",
        "overhead_ms",
        "own_l",
        "own_w",
        "per_seq",
        "prompts",
        "pt_p",
        "servers",
        "z",
    )

    @staticmethod
    def of(knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int = 1) -> _Model:
        return _Model(knobs, lengths, sla, profile, replicas)

    def __init__(
        self, knobs: Knobs, lengths: Lengths, sla: SLA, profile: Profile, replicas: int = 1
    ) -> None:
        self.servers = pooled_servers(replicas)
        m = self.m = profile.step_model()
        # Prefix-cache hits are not computed: an L-token prompt with a share h found in
        # the cache prefills (1 - h) L tokens, whose attention reads all L before them:
        # per token x (1 - h) L + attn x (1 - h^2) L^2 / 2 (1.0 at h = 0: the same bits).
        u = self.computed = 1.0 - lengths.prefix_hit_frac
        pt = self.pt_p = m.per_token * u
        attn = self.attn_p = m.attn * (1.0 - lengths.prefix_hit_frac**2)
        self.goal = sla.attainment_goal_frac
        pr = self.prompts = Prompts.of(
            lengths.prompt_mean,
            lengths.prompt_p95,
            float(profile.max_model_len),
            1.0 - (1.0 - self.goal) * TAIL_SHARE,
        )
        self.e_w = pt * pr.m1 + attn / 2.0 * pr.m2
        self.e_w2 = pt * pt * pr.m2 + pt * attn * pr.m3 + attn * attn / 4.0 * pr.m4
        # E[L w(L)] with the chunks' tokens counted as computed ones (u L).
        self.e_lw = u * (pt * pr.m2 + attn / 2.0 * pr.m3)
        self.m1c = u * pr.m1  # tokens computed per prompt, mean
        so = lognormal_sigma(lengths.output_mean, lengths.output_p95)
        self.out_mean = max(lengths.output_mean, 1.0)
        self.out_med = max(1.0, lengths.output_mean * math.exp(-so * so / 2.0))
        self.per_seq = m.per_seq + m.per_kv * (lengths.prompt_mean + lengths.output_mean / 2.0)
        self.ctx_full = lengths.prompt_mean + lengths.output_mean
        self.kv_cap = profile.kv_capacity_tokens * KV_RESERVE_FRAC
        self.budget = float(knobs.max_num_batched_tokens)
        self.max_seqs = knobs.max_num_seqs
        self.z = normal_quantile(self.goal)
        self.overhead_ms = profile.request_overhead_ms
        own = lengths.prompt_p95
        self.own_l = u * own  # its computed tokens
        self.own_w = pt * own + attn / 2.0 * own * own
        # The rate that keeps the GPU busy with prefill and decode work alone.
        self.ceiling_rps = 1000.0 / max(
            1e-6, self.e_w + self.out_mean * (m.per_token + self.per_seq)
        )

    def _chunk_frac(self, a: float, room: float) -> float:
        """Fraction of steps that carry a prefill chunk: a step with an arrival pending
        (`a` arrivals per step, Poisson), or as many as the token budget needs."""
        need = a * self.m1c / room
        return min(1.0, max(1.0 - math.exp(-a * max(1.0, self.m1c / room)), need))

    def _next_step_ms(self, lam: float, t: float) -> float:
        """One application of the fixed-point map of step 1 (ms); inf where the decodes
        exceed the token budget, max_num_seqs or the KV cache."""
        m = self.m
        pt = m.per_token
        b = lam * self.out_mean * t / 1000.0
        room = self.budget - b
        if room < 1.0 or b > self.max_seqs or b * self.ctx_full > self.kv_cap:
            return math.inf
        td = max(m.floor, m.base + pt * b) + m.fixed + b * self.per_seq
        slack = max(0.0, m.floor - m.base - pt * b)
        a = lam * t / 1000.0  # arrivals per step
        f = self._chunk_frac(a, room)
        work = a * self.e_w
        return td + work - min(f * slack, work) + f * self.per_seq

    def _step_map(self, lam: float) -> Callable[[float], float]:
        """`_next_step_ms` at rate `lam` as a closure over plain locals (the same
        arithmetic in the same order, so the same bits): the Newton search of `at` calls
        it ~10 times per rate and the bisection ~24 rates per capacity, where attribute
        lookups and the `_chunk_frac` call were most of the cost."""
        m = self.m
        floor, base, fixed, pt = m.floor, m.base, m.fixed, m.per_token
        lam_out = lam * self.out_mean
        budget, max_seqs, ctx_full, kv_cap = self.budget, self.max_seqs, self.ctx_full, self.kv_cap
        per_seq, e_w, m1 = self.per_seq, self.e_w, self.m1c
        floor_base = floor - base
        exp, inf = math.exp, math.inf

        def step(t: float) -> float:
            b = lam_out * t / 1000.0
            room = budget - b
            if room < 1.0 or b > max_seqs or b * ctx_full > kv_cap:
                return inf
            x = base + pt * b
            td = (x if x > floor else floor) + fixed + b * per_seq
            x = floor_base - pt * b
            slack = x if x > 0.0 else 0.0
            a = lam * t / 1000.0
            # _chunk_frac(a, room), inlined: min(1, max(1 - exp(-a max(1, m1 / room)), need))
            need = a * m1 / room
            x = m1 / room
            x = 1.0 - exp(-a * (x if x > 1.0 else 1.0))
            x = need if need > x else x
            f = x if x < 1.0 else 1.0
            work = a * e_w
            x = f * slack
            return td + work - (x if x < work else work) + f * per_seq

        return step

    def at(self, lam: float, start_ms: float | None = None) -> Operating | None:
        """The operating point at `lam`; `start_ms` a mean step known to be at most the
        answer (the one at a lower rate), where the search starts. None: no fixed point
        (the replica cannot keep up) or a bound of step 4 broken."""
        t = self.step_fixed_point(lam, start_ms)
        if t is None:
            return None
        m = self.m
        pt = m.per_token
        b = lam * self.out_mean * t / 1000.0
        room = max(1.0, self.budget - b)
        td = max(m.floor, m.base + pt * b) + m.fixed + b * self.per_seq
        a = lam * t / 1000.0
        f = self._chunk_frac(a, room)
        return Operating(t, b, f, self._itl_q(lam, t, td, a), self._ttft_q(lam, t, td, room))

    def step_fixed_point(self, lam: float, start_ms: float | None = None) -> float | None:
        """The mean step at `lam` (ms; module doc, step 1), searched from `start_ms` (see
        `at`); None where there is none (the replica cannot keep up) or decodes overflow."""
        m = self.m
        t = m.floor + m.fixed if start_ms is None else start_ms
        step = self._step_map(lam)
        # Newton on g(t) = F(t) - t from below: g > 0 left of the smallest fixed point
        # and falls towards it; a slope that stops falling before g reaches 0 means none.
        for _ in range(_FIXED_POINT_ITERS):
            g = step(t) - t
            if not math.isfinite(g):
                return None
            if g <= 1e-6 * t:
                return t
            h = 1e-3 * t
            slope = (step(t + h) - (t + h) - g) / h
            if not slope < -1e-9:
                return None
            t += -g / slope
        return None

    def within(self, lam: float, t: float, itl_max_ms: float, ttft_max_ms: float) -> bool:
        """Whether the operating point at `lam` with mean step `t` (from
        `step_fixed_point`) has its goal-quantile ITL and TTFT within these (ms): what
        `at` computes, the TTFT only when the ITL is within."""
        m = self.m
        b = lam * self.out_mean * t / 1000.0
        td = max(m.floor, m.base + m.per_token * b) + m.fixed + b * self.per_seq
        if not self._itl_q(lam, t, td, lam * t / 1000.0) <= itl_max_ms:
            return False
        return self._ttft_q(lam, t, td, max(1.0, self.budget - b)) <= ttft_max_ms

    def _itl_q(self, lam: float, t: float, td: float, a: float) -> float:
        """Goal-quantile mean ITL of a median-length output (module doc, step 2), ms."""
        n = lam * self.out_med * t / 1000.0  # prompts arriving while it decodes
        tail = self.z * math.sqrt(max(0.0, lam * t * self.e_w2 / (1000.0 * self.out_med)))
        miss = 1.0 - self.goal
        if n > miss:
            ell = self.prompts.quantile(1.0 - miss / n)
            pt, attn = self.pt_p, self.attn_p
            tail = max(tail, (pt * ell + attn / 2.0 * ell * ell) / self.out_med)
        return td + a * self.e_w + tail

    def _ttft_q(self, lam: float, t: float, td: float, room: float) -> float:
        """Goal-quantile TTFT (module doc, step 3), ms; inf when prefill saturates."""
        pr = self.prompts
        u = self.computed
        es = self.m1c / room * td + self.e_w
        es2 = u * u * pr.m2 / (room * room) * td * td + 2.0 * td / room * self.e_lw + self.e_w2
        rho = lam * es / 1000.0
        if rho >= 1.0:
            return math.inf
        miss = 1.0 - self.goal
        c = self.servers
        # P(wait) = Erlang C (every replica busy), then an exponential tail whose mean is
        # the residual work E[S^2] / 2E[S] over one replica's spare capacity (1 - rho):
        # the request waits in its own replica's queue (module doc, step 3).
        waits = erlang_c(c, c * rho)
        wait = 0.0
        if waits > miss:
            wait = es2 / (2.0 * es) / (1.0 - rho) * math.log(waits / miss)
        # Chunks counted continuously: a ceil would make capacity jump by half where a
        # p95 estimate crosses a multiple of the budget (4,580 -> 4,610 tokens at 2,304).
        own = max(1.0, self.own_l / room) * td + self.own_w
        return self.overhead_ms + t + wait + own


def pooled_servers(replicas: int) -> int:
    """Servers whose all-busy probability (Erlang C) says whether a request waits, for
    a fleet of `replicas`: one per replica.

    Least-outstanding routing pools the fleet only partly: it sends a request to an idle
    replica while there is one, but a request that waits waits in the queue of the
    replica it was sent to, not in one shared queue, so the wait's tail drains at one
    replica's spare capacity (`_Model._ttft_q`). Priced as a shared queue (a tail over
    c (1 - rho)), the model read 1.32x and 1.16x the plant's capacity on diurnal lengths
    at 2 and 4 replicas, where the decider's 0.85 target utilization missed the goal;
    priced so, 1.01x and 0.99x (docs/capacity.md).
    """
    return max(1, replicas)


def fleet_capacity_rps(
    capacity: Callable[[int], float],
    demand_rps: float,
    current: int,
    max_replicas: int,
    tolerance_frac: float,
) -> tuple[float, float]:
    """(Per-replica capacity of the fleet the demand needs, that of the current fleet),
    req/s, given `capacity(n)`, the per-replica capacity in a fleet of n (it rises with
    n: pooling).

    The fleet is the smallest n with n x capacity(n) >= demand, searched from the size
    the current fleet's capacity asks for. The answer puts demand / capacity (the raw
    replica count) in ((n - 1)(1 + tolerance), n] (for n - 1 below 1 / tolerance), so
    the deadband moves a smaller fleet up to exactly n and never moves n down to n - 1,
    which would need n again (a direction reversal). Sizing at the current size alone
    would overshoot on the way up and give back the pooling gain minutes later.
    Example: capacity(1) = 5.5, capacity(2) = 12.5, demand 10, tolerance 0.1, current 1
    -> n = 2; 10 / 12.5 = 0.8 raised to 1.1 -> (9.09, 5.5) req/s per replica.

    On the way down the deadband adds its headroom to this raised count: a fleet over
    n >= 6 steps down to n + 1, not n (ceil((n - 1) x 1.1 x 1.1) > n). That replica is
    what keeps descents from reversing: without it the matrix gains flaps in seven rows
    (docs/decider-history.md, "Levers off the one-factor misses").
    """
    n = max(1, current)
    caps = {n: capacity(n)}

    def at(k: int) -> float:
        if k not in caps:
            caps[k] = capacity(k)
        return caps[k]

    need = min(max(1, math.ceil(demand_rps / caps[n] - 1e-9)), max_replicas)
    while need < max_replicas and need * at(need) < demand_rps:
        need += 1
    while need > 1 and (need - 1) * at(need - 1) >= demand_rps:
        need -= 1
    cap = at(need)
    least = min(float(need), (need - 1) * (1.0 + tolerance_frac) + 1e-6)
    if need > 1 and demand_rps / cap < least:
        cap = demand_rps / least
    return cap, caps[n]


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with `servers` servers and
    `offered` = arrival rate x mean service time (< servers). Example: 1 server at 0.5
    -> 0.5; 4 servers at 2.0 -> 0.174."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    b = 1.0  # Erlang B by its recursion, stable for any server count
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1.0 - b))
