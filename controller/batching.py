"""Batching knobs for the SLA.

Two knob policies:
- `seed`: the source design's rule, kept exactly for comparison (`seed_policy_knobs`).
- `slo`: from the step-time model, the largest `max_num_seqs` whose decode step at p95
  context stays under the ITL target with margin, and the token budget such that a
  mixed step (those decodes + one prefill chunk) stays under the ITL target, raised
  where the p95 prompt could not be prefilled within the TTFT target; both bounded by
  KV capacity and quantized (seqs to multiples of 8, tokens to multiples of 256).
  Where the fleet is at its max replicas and still short, the queue stands whatever the
  knobs, so every request waits past the TTFT target until it drains: the knobs then
  serve throughput (`throughput_knobs`), as many sequences as the KV cache holds.

How many requests per second one replica with these knobs serves while meeting the SLA
is controller.capacity's `capacity_rps` (a queueing model, by bisection on the arrival
rate). (A fluid model - every step carrying its even share of every prompt's
prefill, T = A / (1 - lam w / 1000) - was used until it was measured 1.6x optimistic on
the conversation trace and 3x on long-context prompts.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from controller.capacity import KV_RESERVE_FRAC, priced_hit_frac
from controller.config import SLA, KnobBounds
from controller.types import Knobs, Lengths
from estimators.stepmodel import Profile, StepTimeModel
from estimators.types import Observation

SEQS_QUANTUM = 8
TOKENS_QUANTUM = 256
SEED_MAX_SEQS = 256
MIXED_STEP_FACTOR = 2.0


def seed_knobs(
    sla_ms: float, p95_decode_latency_ms: float, p95_request_len: float, arrival_rate_5min: float
) -> Knobs:
    """The source design's rule, unchanged and unclamped.

    target_concurrency = floor(SLA_ms / p95_decode_latency_ms)
    max_num_batched_tokens = p95_request_len * (target_concurrency + 1)
    max_num_seqs = min(256, int(arrival_rate_5min * 1.8))
    Worked example: 512 tokens, 380 ms, SLA 1200 ms -> concurrency 3 -> 2048 tokens.
    """
    if p95_decode_latency_ms <= 0:
        raise ValueError(f"p95_decode_latency_ms must be > 0, got {p95_decode_latency_ms}")
    target_concurrency = math.floor(sla_ms / p95_decode_latency_ms)
    return Knobs(
        max_num_seqs=min(SEED_MAX_SEQS, int(arrival_rate_5min * 1.8)),
        max_num_batched_tokens=int(p95_request_len * (target_concurrency + 1)),
    )


def seed_policy_knobs(obs: Observation, sla: SLA) -> Knobs | str:
    """The `seed` policy's knobs from one observation (unclamped), or what is missing.

    Inputs, as the source design means them:
    - SLA: `sla.e2e_p95_ms`, a p95 end-to-end latency target (ms);
    - p95 decode latency: `obs.decode_time_p95_ms`, the p95 of the per-request decode
      time (`vllm:request_decode_time_seconds`: first token to last, one observation
      per request), not the per-token ITL;
    - p95 request length: `obs.prompt_tokens_p95`, from `vllm:request_prompt_tokens`.
      `max_num_batched_tokens` caps the tokens scheduled in one engine step; a request
      enters that budget with its whole prompt (prefill) but with one token per step
      while decoding, so the length the budget must hold (concurrency + 1) times is the
      prompt's. Interpolated quantiles are rounded to a whole token;
    - arrival rate: `obs.arrival_rate_5m_rps`, over a 5-minute window.
    Worked example (the source's): prompt p95 512, decode p95 380 ms, e2e p95 target
    1,200 ms, 5-min rate 10 req/s -> floor(1200 / 380) = 3 -> 512 x 4 = 2,048 tokens,
    min(256, int(18.0)) = 18 sequences.
    """
    missing = [
        name
        for name, v in (
            ("sla.e2e_p95_ms", sla.e2e_p95_ms),
            ("decode_time_p95_ms", obs.decode_time_p95_ms),
            ("prompt_tokens_p95", obs.prompt_tokens_p95),
            ("arrival_rate_5m_rps", obs.arrival_rate_5m_rps),
        )
        if v is None or not math.isfinite(v)
    ]
    if obs.decode_time_p95_ms is not None and obs.decode_time_p95_ms <= 0:
        missing.append("decode_time_p95_ms > 0")
    if missing or sla.e2e_p95_ms is None:
        return "seed policy lacks " + ", ".join(missing)
    assert obs.decode_time_p95_ms is not None and obs.prompt_tokens_p95 is not None
    assert obs.arrival_rate_5m_rps is not None
    return seed_knobs(
        sla.e2e_p95_ms,
        obs.decode_time_p95_ms,
        round(obs.prompt_tokens_p95),
        obs.arrival_rate_5m_rps,
    )


def clamp_knobs(knobs: Knobs, bounds: KnobBounds) -> Knobs:
    """Knobs within the configured bounds (`Knobs.within` the bounds' minima and
    maxima); the token budget is at least max_num_seqs."""
    floor = Knobs(bounds.max_num_seqs_min, bounds.max_num_batched_tokens_min)
    ceiling = Knobs(bounds.max_num_seqs_max, bounds.max_num_batched_tokens_max)
    return knobs.within(floor, ceiling)


def fewest_seqs(bounds: KnobBounds) -> int:
    """The fewest sequences `slo_knobs` gives within `bounds`: one quantum, or the
    bounds' minimum where that is more (their maximum where that is less)."""
    return clamp_knobs(Knobs(SEQS_QUANTUM, TOKENS_QUANTUM), bounds).max_num_seqs


def _step_model(profile: Profile) -> StepTimeModel:
    """`profile.step_model()`, kept per profile object (the decider asks three times per
    model per tick; profiles are immutable and few)."""
    entry = _STEP_MODELS.get(id(profile))
    if entry is None or entry[0] is not profile:
        if len(_STEP_MODELS) >= 64:
            _STEP_MODELS.clear()
        entry = _STEP_MODELS[id(profile)] = (profile, profile.step_model())
    return entry[1]


_STEP_MODELS: dict[int, tuple[Profile, StepTimeModel]] = {}


def _largest_within(pred: Callable[[int], bool], guess: int, hi: int) -> int:
    """The largest b in [1, hi] with `pred(b)`, else 0, for `pred` true up to some b and
    false above it: exactly what a bisection over [0, hi] returns, found by galloping
    from `guess` (a couple of evaluations when the guess is close)."""
    if hi < 1:
        return 0
    b = min(max(guess, 1), hi)
    if pred(b):
        step = 1
        while b < hi:
            up = min(hi, b + step)
            if not pred(up):
                lo, top = b, up - 1  # answer in [b, up - 1]
                break
            b, step = up, step * 2
        else:
            return b
    else:
        top, step = b - 1, 1  # pred fails at b: answer in [0, b - 1]
        lo = 0
        while top >= 1:
            down = max(1, top - step + 1)
            if pred(down):
                lo = down
                break
            top, step = down - 1, step * 2
    while lo < top:
        mid = (lo + top + 1) // 2
        if pred(mid):
            lo = mid
        else:
            top = mid - 1
    return lo


def _decode_seqs_guess(model: StepTimeModel, budget_ms: float, ctx: float) -> int:
    """Continuous solution of decode_step_ms(B, B * ctx) <= budget_ms: the smaller of
    the linear branch (base + per_token B) and the floor branch; a starting point only."""
    try:
        linear = (budget_ms - model.base - model.fixed) / (
            model.per_token + model.per_seq + model.per_kv * ctx
        )
        per_b = model.per_seq + model.per_kv * ctx
        room = budget_ms - model.floor - model.fixed
        floor_branch = room / per_b if per_b > 0 else (math.inf if room >= 0 else -1.0)
        guess = min(linear, floor_branch)
        return int(guess) if math.isfinite(guess) else 1 << 20
    except (ArithmeticError, ValueError):
        return 1


def slo_knobs(
    lengths: Lengths, sla: SLA, profile: Profile, bounds: KnobBounds, itl_margin_frac: float
) -> Knobs:
    """Knobs that keep decode and mixed steps under the ITL target (see module doc).

    Worked example (default profile, ITL 50 ms, margin 0.85, conversation p95s 4083/451,
    means 1155/211): decode step budget 42.5 ms -> 152 sequences at 4308 tokens of context
    (42.32 ms) -> 152 after quantizing; a mixed step of up to 85 ms with 152 decodes leaves
    room for a chunk of ~2,500 tokens -> budget 2,560. With half of every prompt found
    in the prefix cache (`Lengths.prefix_hit_frac` 0.5), a chunk starts 3,062 tokens in
    on average, not 2,042, and the p95 prompt computes 2,042 tokens within the TTFT
    target, not 4,083.
    """
    model = _step_model(profile)
    step_budget_ms = sla.itl_p95_ms * itl_margin_frac
    decode_ctx = lengths.prompt_p95 + lengths.output_p95 / 2.0
    # Largest B with decode_step_ms(B, B * ctx) <= budget (monotone in B), searched from
    # the continuous solution of the linear and floor branches (2-3 evaluations instead
    # of a bisection's 10; the same answer).
    seqs = _largest_within(
        lambda b: model.decode_step_ms(b, b * decode_ctx) <= step_budget_ms,
        _decode_seqs_guess(model, step_budget_ms, decode_ctx),
        bounds.max_num_seqs_max,
    )
    seqs = min(seqs, kv_bound_seqs(lengths, profile))
    seqs = max(SEQS_QUANTUM, seqs // SEQS_QUANTUM * SEQS_QUANTUM)

    mean_decode_ctx = lengths.prompt_mean + lengths.output_mean / 2.0
    # Prefix-cache hits (the share capacity prices: `priced_hit_frac`) are not computed:
    # a prompt's chunks start past its cached share (their attention reads it), and only
    # the rest takes the token budget. At 0 every term is the rule without hits.
    hit = priced_hit_frac(lengths.prefix_hit_frac)
    # A step that carries a full prefill chunk may take up to MIXED_STEP_FACTOR x the ITL
    # target: such steps are a minority of a request's decode steps, so its mean ITL
    # stays under target, while a bigger budget prefills in fewer, better-amortized
    # steps (more throughput, lower TTFT). Measured on the conversation trace x16 with
    # 6 replicas: budget 1,024 -> 98.3 % attainment, 4,096 -> 99.6 %.
    chunk = model.max_tokens_within(
        step_budget_ms * MIXED_STEP_FACTOR,
        seqs,
        seqs * mean_decode_ctx,
        chunk_context=lengths.prompt_p95 * (1.0 + hit) / 2.0,
    )
    tokens = max(TOKENS_QUANTUM, (seqs + chunk) // TOKENS_QUANTUM * TOKENS_QUANTUM)
    # TTFT: the p95 prompt must prefill in the steps that fit half the TTFT target; where
    # that needs a bigger budget than ITL allows, TTFT wins (rounded up, not down).
    steps_allowed = max(1, math.floor(sla.ttft_p95_ms * 0.5 / step_budget_ms))
    ttft_tokens = math.ceil(lengths.prompt_p95 * (1.0 - hit) / steps_allowed)
    if ttft_tokens > tokens:
        tokens = math.ceil(ttft_tokens / TOKENS_QUANTUM) * TOKENS_QUANTUM
    return clamp_knobs(Knobs(max_num_seqs=seqs, max_num_batched_tokens=tokens), bounds)


def kv_bound_seqs(lengths: Lengths, profile: Profile) -> int:
    """The most sequences the KV cache holds at their mean full context (prompt + output
    mean, tokens), KV_RESERVE_FRAC of it: the knobs' KV bound. Example (default profile,
    conversation means 1155/211): 464,688 x 0.9 / 1,366 -> 306."""
    mean_ctx = max(1.0, lengths.prompt_mean + lengths.output_mean)
    return int(profile.kv_capacity_tokens * KV_RESERVE_FRAC / mean_ctx)


def throughput_knobs(slo: Knobs, lengths: Lengths, profile: Profile, bounds: KnobBounds) -> Knobs:
    """Knobs for the most requests a second at these lengths, from the SLO knobs `slo`:
    as many sequences as the KV cache holds at their mean full context (10 % reserve;
    a decode step's fixed cost spread over more tokens), at least `slo`'s, and the token
    budget grown by the sequences added, so a step keeps `slo`'s room for a prefill
    chunk. For a fleet at its max replicas that cannot serve the load (the module doc).
    Example (default profile, conversation means 1155/211): KV for 306 sequences ->
    304; SLO knobs 136 / 2,304 -> 304 / 2,560."""
    seqs = max(slo.max_num_seqs, kv_bound_seqs(lengths, profile) // SEQS_QUANTUM * SEQS_QUANTUM)
    added = seqs - slo.max_num_seqs
    tokens = slo.max_num_batched_tokens + math.ceil(added / TOKENS_QUANTUM) * TOKENS_QUANTUM
    return clamp_knobs(Knobs(max_num_seqs=seqs, max_num_batched_tokens=tokens), bounds)


def per_request_work_ms(lengths: Lengths, profile: Profile) -> float:
    """GPU time one average request adds to the steps it shares, ms (see module doc)."""
    m = _step_model(profile)
    ctx = lengths.prompt_mean + lengths.output_mean / 2.0
    lin = lengths.prompt_mean
    return (
        lengths.output_mean * (m.per_token + m.per_seq + m.per_kv * ctx)
        + lin * m.per_token
        + m.attn * lin * lin / 2.0
    )
