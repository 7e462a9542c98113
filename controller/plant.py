"""What the decider learns about the engines (the plant), online, from their own metrics.

The profile (estimators.stepmodel) is a belief: the step times of one model on one GPU
as measured somewhere else. A customer's engines can be slower or faster (another
driver, another vLLM version, a noisy neighbour, a CPU build). Three corrections, all
bounded and smoothed:

- **speed** (step-time factor, learned before the SLA is violated): each window's mean
  inter-token latency against what the profile predicts for the batch the engines ran
  (running sequences per replica, at least one, their context, and the prefill tokens
  the arrival rate brings into each step). A factor > 1 means slower engines than the
  profile; the capacity and knob models use the profile's step times x speed. Learned
  only from a window with enough requests, a sequence running and no queue (a
  queued fleet's ITL is set by its knobs, not its speed), as a half-life average of
  log(speed) and within [SPEED_MIN, SPEED_MAX]. A fleet that never drains its queue
  is read from windows queued at the engines' limit too, priced at the tokens their
  steps ran; those only ever jump the belief to a much slower plant (learn_plant).
  Where the per-sequence fit below solves, the speed is the fit's own (its x), so
  speed and ratio describe one line through the windows.
- **per-sequence ratio** (next_seq_ratio): the engines' step growing with the batch
  faster (or slower) than the profile's, learned on engines far off the profile; where
  clean windows read the engines within SEQ_FIT_MIN_SPEED of it, the ratio relaxes
  towards the profile's shape (1) at the speed's half-life.

- **per-request overhead** (next_overhead): the time before the engine core (HTTP,
  rendering and tokenizing the prompt), which the capacity model's TTFT bound spends out
  of the target. The profile's calibrated value is a belief too: a gateway, an auth hop
  or a loaded API server takes several times it, and the violations that would teach
  it come after the SLA is missed (docs/decider-history.md, "An overhead the profile
  does not know": a 200 ms overhead against the believed 29 ms put diurnal under 99 %
  in six of nine matrix rows). vLLM's TTFT runs from the request's arrival at the
  frontend (vLLM 0.32 stamps `arrival_time` before rendering and tokenizing), and so
  does its end-to-end latency, while its queue, prefill and decode times
  (`vllm:request_{queue,prefill,decode}_time_seconds`) run in the engine core; all four
  are recorded as a request finishes. Over one window, mean end-to-end latency less
  the three means is the time outside the engine core (before it, and the last
  token's way back out: a little more than the TTFT pays, on the safe side): one
  sample (overhead_sample), from a window with enough requests, learned as a
  half-life average in ms from the profile's value, within [0, OVERHEAD_MAX_MS]; the
  models use it rounded to OVERHEAD_QUANTUM_MS, and the profile's own within one
  quantum (model_overhead).

What the SLA's own signals teach (the capacity and knob corrections and the cold start)
lives in controller.feedback.

Worked example of one speed sample (window_parts, default profile: floor 6.6, base
2.3, per token 0.0218, fixed 0.7, per sampled sequence 0.015, per KV token 5e-5 ms): 40
sequences per replica on conversation lengths (prompts 1,155 mean / 4,083 p95, outputs
211 mean: 1,260 tokens of context) and 2.6 req/s per replica, budget 8,192. A decode
step is max(2.3 + 0.0218 x 40, 6.6) + 0.7 = 7.3 ms; a step carrying a whole prompt
max(2.3 + 0.0218 x 1,195, 6.6) + 0.7 + its attention (1.31e-6 x 1,155^2 x E[L^2] /
mean^2 / 2) = 32.7 ms; with an observed ITL mean of 15.0 ms, 2.6 x 15.0 / 1000 = 0.039
of the steps carry one, so the rest is 0.961 x 7.3 + 0.039 x 32.7 = 8.29 ms and the
per-sequence part (40 + 0.039) x (0.015 + 5e-5 x 1,260) = 3.12 ms: speed =
15.0 / (8.29 + 3.12) = 1.31.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from controller.capacity import HIT_MAX
from controller.lognormal import square_spread
from controller.types import Lengths, PlantBelief
from estimators.stepmodel import Profile
from estimators.types import Observation

SPEED_MIN = 1.0 / 16.0
SPEED_MAX = 64.0
"""Bounds of the learned speed: the default profile (an H100) on engines up to 64x
slower (vLLM's CPU build serving a tiny model reads 12-25x) or 16x faster."""
SPEED_JUMP_RATIO = 2.0
"""A sample this many times slower than the belief replaces it once confirmed (see
next_speed). At 4 (before), vLLM's CPU build on a quiet machine, 2.5-4.3x the profile,
was learned at the half-life only: x2.6-2.8 after a 4-minute load ladder in three of nine
kept runs, believed 1.4-2.0x the capacity it served (tests/engine/replay.py over the
runs of docs/real-engine-runs.md: 83 of 146 rung readings more than 25 % optimistic at
4, 62 at 2). No simulated plant (0.7-1.3x the profile) confirms a 2x window: every
matrix cell is the same at 2 and 4."""
SPEED_HALF_LIFE_S = 60.0
"""Half-life of the learned speed's average, seconds of evidence."""
MIN_REQUESTS_PER_WINDOW = 30.0
"""A window with fewer arrivals teaches nothing (its means are a handful of requests)."""
MIN_RUNNING = 1.0
"""A window with fewer sequences running in the whole fleet teaches nothing. A fleet
with fewer sequences than replicas runs each alone (the least-outstanding router sends
a request to an idle replica first), so its windows are priced at a batch of one
(window_parts). Per replica (before: at least 1 on average, 2 before that) the code x4
trace, whose fleets run 0-3 sequences over 10-20 replicas between bursts, learned at 9
ticks an hour: 1.09 / 0.97 / 1.11 on plants of 1.0 / 0.7 / 1.3, 1.22 at 2.5, 0.87 at
0.4; priced at one a replica it reads 1.02 / 0.78 / 1.25, 1.52, 0.53
(docs/decider-history.md, "A sequence alone on its replica")."""
MAX_WAITING_PER_REPLICA = 1.0
"""A window with more requests waiting per replica teaches no speed (its ITL is the step
at the batch the knobs cap, and its mean mixes the steps before and after the queue)."""
FIT_MAX_WAITING_PER_REPLICA = math.inf
"""The per-sequence fit (next_seq_ratio) learns from queued windows too: a queued
window's ITL is the step at the batch the engines run at their slot cap, the one the
capacity at the SLA depends on and no window below the cap shows. vLLM's CPU build's
step doubled from 14-22 running sequences to ~30 (tests/engine/data/runs), so a ratio
fitted below the cap believed 1.3-1.45x the capacity measured; with queued windows the
eleven recorded runs replay within 25 % in 9 (8 before), their mean |log| error 0.14
(0.17). The speed keeps MAX_WAITING_PER_REPLICA, and the fit runs only on engines
SEQ_FIT_MIN_SPEED off the profile, so no simulated plant sees the change. (The chunk
steps of a queued window are priced at the arrival rate, over what the engines admit;
short prompts make that a small error.)"""
STEADY_FRAC = 0.25
"""A window whose short-window rate is off its mean by more than this is not steady."""
SPEED_QUANTUM = 0.02
"""The speed the models use is rounded to this (a cached scaled profile per value)."""
SEQ_RATIO_MIN = 0.25
SEQ_RATIO_MAX = 64.0
"""Bounds of the learned per-sequence ratio (next_seq_ratio)."""
SEQ_FIT_MIN_SPEED = 2.0
"""The per-sequence ratio is learned only on engines at least this far off the profile
at a window's batch: so believed (next_seq_ratio: the speed with the per-sequence part at
the learned ratio, against the profile's step), or so read by clean windows for half a
window (clean_off). vLLM's CPU build serving a tiny model reads 2-4.3x on a quiet
2-core machine (about 2x at small batches on the faster ones) and 4-25x on a loaded one; the
simulated plants, the profile's own shape at 0.7-1.3x, are learned within 0.7-1.4x."""
SEQ_FIT_MIN_SPREAD = 0.05
"""1 - cos^2 of the angle between the windows' rest and per-sequence parts that the
per-sequence fit needs (0: every window at one batch shape)."""


def window_parts(
    obs: Observation,
    lengths: Lengths | None,
    profile: Profile,
    window_s: float,
    budget_tokens: int,
    max_waiting_per_replica: float = MAX_WAITING_PER_REPLICA,
    max_chunks: float = math.inf,
    step_priced: bool = False,
) -> tuple[float, float, float] | None:
    """(observed mean ITL, the profile's predicted step split into its per-sequence
    part and the rest, ms) of one window, or None when the window has not enough data
    to say (see the module doc for the model), more than `max_waiting_per_replica`
    requests waiting per replica, or a mean prompt prefilled in more than `max_chunks`
    chunks. `step_priced`: the share of steps that carry a chunk is read from the
    tokens the engines scheduled per step (`Observation.step_tokens_mean`; None
    without it), not from the arrival rate: a queued engine admits what its slots
    free, not what arrives."""
    itl = obs.itl_mean_ms
    n = obs.ready_replicas if obs.ready_replicas is not None else obs.targets_up
    if itl is None or itl <= 0 or lengths is None or n is None or n <= 0:
        return None
    if obs.running is None or obs.waiting is None:
        return None
    if obs.running < MIN_RUNNING or obs.waiting / n > max_waiting_per_replica:
        return None
    # Fewer sequences than replicas: each runs alone on its replica (MIN_RUNNING).
    b = max(1.0, obs.running / n)
    if obs.arrival_rate_rps * window_s < MIN_REQUESTS_PER_WINDOW:
        return None
    short = obs.arrival_rate_short_rps
    unsteady = (
        short is not None and abs(short - obs.arrival_rate_rps) > STEADY_FRAC * obs.arrival_rate_rps
    )
    if unsteady and not step_priced:
        # Not a steady window: tokens were produced mostly while the batch was big, and
        # a window mean of the load says too little about the steps they saw. (Steps
        # priced at their own tokens do not depend on the load.)
        return None
    c = profile.step_time
    ctx = lengths.prompt_mean + lengths.output_mean / 2.0
    lin = lengths.prompt_mean
    # Its prefix-cache hits are not computed (their attention is read: capacity._Model),
    # at the share believed, not rounded down as the capacity prices it: the window that
    # predicted more prefill than the engines ran would read them as faster engines.
    hit = min(lengths.prefix_hit_frac, HIT_MAX)
    computed = lin * (1.0 - hit)
    per_seq = c.per_sampled_seq_ms + c.per_decode_kv_token_ms * ctx
    # A prompt is prefilled in chunks of at most the token budget left by the decodes.
    chunks = max(1, math.ceil(computed / max(1.0, budget_tokens - b)))
    if chunks > max_chunks:
        return None
    # Attention grows with the square of a prompt: E[L^2] for lognormal prompts up to
    # max_model_len (the mean's square alone read the long-context trace's windows as a
    # 4.7x slower plant; its uncapped E[L^2], 1.4x this, as an 11 % faster one: 8 % now).
    spread = square_spread(lengths.prompt_mean, lengths.prompt_p95, profile.max_model_len)
    chunk = computed / chunks
    decode = max(c.base_ms + c.per_token_ms * b, c.floor_ms) + c.fixed_ms
    mixed = (
        max(c.base_ms + c.per_token_ms * (b + chunk), c.floor_ms)
        + c.fixed_ms
        + c.prefill_attention_ms_per_token2 * (1.0 - hit * hit) * lin * lin * spread / 2.0 / chunks
    )
    if step_priced:
        # Fraction of steps that carry a chunk: the prefill tokens of a step (those
        # scheduled past one per running sequence) over a chunk's, at most all.
        if obs.step_tokens_mean is None:
            return None
        f = min(1.0, max(0.0, obs.step_tokens_mean - b) / chunk)
    else:
        # Fraction of steps that carry a chunk: chunks arriving per step (the observed
        # step time x the per-replica arrival rate x chunks per prompt), at most all.
        f = min(1.0, obs.arrival_rate_rps / n * chunks * itl / 1000.0)
    rest = (1.0 - f) * decode + f * mixed
    seqs = (b + f) * per_seq  # b sequences per step, one more in a chunk step
    return itl, seqs, rest


def speed_sample(
    obs: Observation,
    lengths: Lengths | None,
    profile: Profile,
    window_s: float,
    budget_tokens: int,
    seq_ratio: float = 1.0,
) -> float | None:
    """One window's step-time factor (engines' / profile's with its per-sequence part
    x `seq_ratio`), or None when the window has not enough data to say."""
    return window_speed(window_parts(obs, lengths, profile, window_s, budget_tokens), seq_ratio)


def window_speed(parts: tuple[float, float, float] | None, seq_ratio: float) -> float | None:
    """The step-time factor of a window's `parts` (window_parts) with the profile's
    per-sequence part x `seq_ratio`; None without parts or a finite positive answer."""
    if parts is None:
        return None
    itl, seqs, rest = parts
    speed = itl / (rest + seq_ratio * seqs)
    return speed if math.isfinite(speed) and speed > 0 else None


def next_seq_ratio(
    belief: PlantBelief,
    parts: tuple[float, float, float] | None,
    dt_s: float,
    clean: tuple[float, float, float] | None = None,
    now_s: float = 0.0,
    confirm_s: float = 0.0,
) -> PlantBelief:
    """`belief` with its per-sequence ratio after this window (`parts` from
    window_parts; None: unchanged).

    The speed scales every step-time coefficient alike, but engines differ from the
    profile in shape too: vLLM's CPU build serving a tiny model reads ~18x the
    profile's step at 3 running sequences and its steps grow ~10 ms per sequence where
    the profile x 18 grows ~1 ms, so one factor learned at small batches believed it
    serves 3x what it does at the SLA. Each window, queued ones included
    (FIT_MAX_WAITING_PER_REPLICA), says ITL = x rest + y seqs (the profile's step split
    as window_parts does); a least-squares fit of x and y over
    half-life sums gives the ratio r = y / x, which multiplies the profile's
    per-sequence costs on top of the speed. Only where the windows seen span enough
    different batch shapes to tell x from y (their rest/seqs vectors at least
    SEQ_FIT_MIN_SPREAD from collinear): windows at one batch size say nothing about
    the split and leave r where it is. Within [SEQ_RATIO_MIN, SEQ_RATIO_MAX], and only
    on engines at least SEQ_FIT_MIN_SPEED off the profile at this window's batch
    (other hardware): so believed, or so read by this tick's `clean` window
    (`clean_off`). Where it solves, the speed is the fit's too: the least-squares x
    of ITL = x (rest + r seqs) at the bounded r (x itself where r = y / x). The speed's
    own half-life average of samples priced with r drifted apart from the fit (a
    stall's jump decaying at 60 s, or the small batches' reading) and the step believed
    at the slot cap was neither's: over the recorded real-engine runs the learned
    capacity read within 25 % of the measured in 29-30 of 48 at each tick phase,
    37-39 with the fit's speed (`python -m tests.engine.recorded phases`).

    Where the fit is shut and this tick's `clean` window reads the engines within
    SEQ_FIT_MIN_SPEED of the profile too, the ratio relaxes towards 1 (`_relaxed_ratio`):
    a ratio the fit learned while it was open (from a stall's windows, ci-20261205T1331:
    9.62, the step at the slot cap believed 2x the engines', 0.70x the measured
    capacity; 0.89-0.90x relaxed at every tick phase) is not what windows within the
    gate show. Without a clean window the ratio stays where it is.
    """
    belief, seen = clean_off(belief, clean, now_s, confirm_s)
    if parts is None or dt_s <= 0 or belief.speed_jump is not None:
        return belief
    reading = window_speed(clean, 1.0)  # the clean window at the profile's own shape
    within = reading is not None and _within(reading)
    itl, seqs, rest = parts
    # How far off the profile the belief puts this window's step: the speed with the
    # per-sequence part at the learned ratio (the speed alone, priced with a large
    # ratio, reads low: 1.77 at a ratio of 22.9 on the real engine, which switched the
    # fit off and left the ratio at 22.9 for the rest of the run, 0.93x; x1.62 at 39.4,
    # 0.48x).
    off = belief.speed * (rest + belief.seq_ratio * seqs) / (rest + seqs)
    if seen is not None:
        off = max(off, seen) if seen > 1.0 else min(off, seen)
    if _within(off):
        # Engines within 2x of the profile run the hardware it was measured on, shape
        # included: there the fit only learns the step model's own approximations (the
        # simulated plant, whose shape is the profile's, read r from 0.25 to 19 over one
        # conversation hour and cost 1.6x the GPU-hours; its learned speeds stay within
        # 0.7-1.4 in every matrix cell, so the fit never runs there).
        if within:
            return _relaxed_ratio(belief, parts, dt_s)
        return belief
    keep = 0.5 ** (dt_s / SPEED_HALF_LIFE_S)
    new = (rest * rest, rest * seqs, seqs * seqs, itl * rest, itl * seqs)
    fit = tuple(keep * old + (1.0 - keep) * v for old, v in zip(belief.seq_fit, new, strict=True))
    rr, rs, ss, ir, is_ = fit
    det = rr * ss - rs * rs
    if rr > 0 and ss > 0 and det > 0 and det >= SEQ_FIT_MIN_SPREAD * rr * ss:
        x = (ir * ss - is_ * rs) / det
        y = (is_ * rr - ir * rs) / det
        if x > 0 and y > 0:
            r = min(SEQ_RATIO_MAX, max(SEQ_RATIO_MIN, y / x))
            # The speed of the same fit: the least-squares x of ITL = x (rest + r seqs),
            # the fit's own x where r is within its bounds (module doc).
            speed = _bounded_speed((ir + r * is_) / (rr + 2.0 * r * rs + r * r * ss))
            return replace(belief, speed=speed, seq_ratio=r, seq_fit=fit)  # type: ignore[arg-type]
    return replace(belief, seq_fit=fit)  # type: ignore[arg-type]


def _within(off: float) -> bool:
    """Whether a step `off` x the profile's is within SEQ_FIT_MIN_SPEED of it."""
    return 1.0 / SEQ_FIT_MIN_SPEED < off < SEQ_FIT_MIN_SPEED


def _relaxed_ratio(
    belief: PlantBelief, parts: tuple[float, float, float], dt_s: float
) -> PlantBelief:
    """`belief` with its per-sequence ratio moved towards 1 (the profile's shape) by
    `dt_s` seconds at SPEED_HALF_LIFE_S (learn_speed's log-space average, towards a
    sample of 1), and its speed moved so that the step believed at this window's batch
    is unchanged."""
    if belief.seq_ratio == 1.0:
        return belief
    _, seqs, rest = parts
    r = learn_speed(belief.seq_ratio, 1.0, dt_s)
    if abs(r - 1.0) < 0.01:
        r = 1.0
    speed = _bounded_speed(belief.speed * (rest + belief.seq_ratio * seqs) / (rest + r * seqs))
    return replace(belief, speed=speed, seq_ratio=r)


def rescaled_fit(belief: PlantBelief, speed: float) -> PlantBelief:
    """`belief` at `speed`, its per-sequence fit's ITL sums scaled alike (a jump to a
    slower plant is a jump of the fit too: the fit sets the speed once it solves,
    next_seq_ratio, and from sums of the windows before the jump it would take it
    back). Example: speed 2 -> 6 scales the sums' ITL x rest and ITL x seqs by 3."""
    k = speed / belief.speed
    rr, rs, ss, ir, is_ = belief.seq_fit
    return replace(belief, speed=speed, seq_fit=(rr, rs, ss, k * ir, k * is_))


def clean_off(
    belief: PlantBelief,
    clean: tuple[float, float, float] | None,
    now_s: float,
    confirm_s: float,
) -> tuple[PlantBelief, float | None]:
    """(`belief` with its streak of clean windows off the profile updated, how far off
    the profile `clean` reads the engines if that counts, else None).

    A clean window (window_parts with no queue past MAX_WAITING_PER_REPLICA and its
    mean prompt in one chunk, so its chunk steps are priced at what the engines admit)
    reads the engines' step against the profile's at its own batch, the shape
    included: ITL / (rest + seqs). The learned speed is a half-life average over
    batches, and on engines whose steps grow faster with the batch than the profile's
    it stays under SEQ_FIT_MIN_SPEED while the windows at large batches read far past
    it: vLLM's CPU build on a faster machine read 11-16 ms at 1-8 running sequences
    (about 2x the profile) and 23-34 ms at 15-29, the speed reached x1.92, the fit
    never ran, and the capacity at the slot cap was learned 1.63x the one measured
    (ci-20261204T1025; 1.05x with this reading). One window is one window's word: it
    counts once every clean window for `confirm_s` seconds has read at least
    SEQ_FIT_MIN_SPEED off (`PlantBelief.seq_off_since_s`, as a speed jump is
    confirmed). A single simulated conversation window read 2.5x, the queue drained
    within it, and taken alone it set a ratio of 5.8 for the rest of the hour (2.1x the
    GPU-hours at a 5 s scrape). Long prompts never count: the model prices their chunk
    steps roughly (attention over a lognormal spread, chunks at the arrival rate), and
    the simulated long-context windows, unqueued, read 2.4-3.1x for up to 30 s on a
    plant of the profile's own shape.
    Example: clean windows reading 3.0 at t = 100 and 3.2 at t = 105, confirm_s 5 ->
    (since 100, 3.2) at t = 105; a window reading 1.5 clears the streak."""
    since = belief.seq_off_since_s
    if clean is None:
        return belief, None
    itl, seqs, rest = clean
    off = itl / (rest + seqs)
    if _within(off):
        return replace(belief, seq_off_since_s=None), None
    if since is None:
        return replace(belief, seq_off_since_s=now_s), (off if confirm_s <= 0 else None)
    return belief, (off if now_s - since >= confirm_s else None)


def median_reads_slower(
    obs: Observation, parts: tuple[float, float, float] | None, belief: PlantBelief
) -> bool:
    """Whether the window's median token gap (priced as window_speed prices its mean)
    reads the engines slower than `belief` (True without a median): only then may it jump
    the belief. A stall of a few seconds takes a window's mean 3-5x and leaves most gaps,
    the median among them, where they were (docs/real-engine-runs.md, session 43)."""
    p50 = obs.itl_dist.p50_ms if obs.itl_dist is not None else None
    if parts is None or p50 is None:
        return True
    median = window_speed((p50, parts[1], parts[2]), belief.seq_ratio)
    return median is None or median > belief.speed


def _bounded_speed(sample: float) -> float:
    """A speed sample within [SPEED_MIN, SPEED_MAX]."""
    return min(SPEED_MAX, max(SPEED_MIN, sample))


def _jumps(belief: PlantBelief, sample: float, allowed: bool) -> bool:
    """Whether `sample` (bounded) is past SPEED_JUMP_RATIO x slower than the belief, on
    a window that may jump it (`allowed`: past the last scale-up's dead time)."""
    return allowed and _bounded_speed(sample) > SPEED_JUMP_RATIO * belief.speed


def learn_speed(
    previous: float,
    sample: float | None,
    dt_s: float,
    half_life_s: float = SPEED_HALF_LIFE_S,
) -> float:
    """The learned speed after `dt_s` seconds of evidence `sample` (None: unchanged):
    a half-life average in log space, within [SPEED_MIN, SPEED_MAX]. Example: 1.0 and
    a sample of 1.3 over 5 s with a 60 s half-life -> 1.0 x 1.3 ** 0.056 = 1.015. (A
    much slower sample is jumped to instead, once confirmed: `next_speed`.)"""
    if sample is None or dt_s <= 0:
        return previous
    s = _bounded_speed(sample)
    keep = 0.5 ** (dt_s / half_life_s)
    return math.exp(keep * math.log(previous) + (1.0 - keep) * math.log(s))


def next_speed(
    belief: PlantBelief,
    sample: float | None,
    dt_s: float,
    now_s: float,
    confirm_s: float,
    allowed: bool = True,
) -> PlantBelief:
    """`belief` with its speed after this tick's `sample` (the caller sets the rest).

    Engines far slower than the profile run on other hardware, and averaging towards
    them at the half-life (`learn_speed`) would take minutes during which every replica
    is believed to serve several times what it does: a sample more than
    SPEED_JUMP_RATIO x slower than the belief is taken as it is, once confirmed. Only
    towards slower: a faster reading is learned at the half-life (believing engines
    slower than they are costs replicas, believing them faster costs the SLA).

    Confirmed, because a sample that far off is one window's word
    against everything learned so far: one contended window (a noisy neighbour, the
    tokens of a burst that has just drained read against the gauges after it) read
    55x on the real engine and 5.1x on the code trace at a 30 s scrape, and taking it
    priced every replica near zero and panicked to the maximum. Such a sample is
    held as pending and not learned from; the belief jumps (to the smallest pending
    sample) only when windows at least `confirm_s` seconds apart (new scrapes, not
    the same data re-read) all read that slow. A sample within the ratio clears the
    pending jump and is learned at the half-life; so is a jump-worthy sample when a
    jump is not `allowed` (a window still holding the overload before a scale-up).
    A pending jump not confirmed within 2 x `confirm_s` expires; a confirmed one scales
    the per-sequence fit with it (`rescaled_fit`). Example: belief 1,
    samples 16 at t = 0 and 20 at t = 5 with confirm_s 5 -> speed 16 at t = 5.
    """
    pending, since = belief.speed_jump, belief.speed_jump_since_s
    if pending is not None and since is not None and now_s - since > 2.0 * confirm_s:
        pending = since = None
    if sample is None or dt_s <= 0:
        return replace(belief, speed_jump=pending, speed_jump_since_s=since)
    s = _bounded_speed(sample)
    if _jumps(belief, s, allowed):
        if pending is None or since is None:
            return replace(belief, speed_jump=s, speed_jump_since_s=now_s)
        low = min(pending, s)
        if now_s - since >= confirm_s:
            jumped = rescaled_fit(belief, low)
            return replace(jumped, speed_jump=None, speed_jump_since_s=None)
        return replace(belief, speed_jump=low, speed_jump_since_s=since)
    speed = learn_speed(belief.speed, s, dt_s)
    return replace(belief, speed=speed, speed_jump=None, speed_jump_since_s=None)


def learn_plant(
    belief: PlantBelief,
    parts: tuple[float, float, float] | None,
    dt_s: float,
    now_s: float,
    confirm_s: float,
    allowed: bool,
    fit_parts: tuple[float, float, float] | None = None,
    clean_parts: tuple[float, float, float] | None = None,
    standing_parts: tuple[float, float, float] | None = None,
) -> PlantBelief:
    """`belief` after one window (`parts` from window_parts, None: nothing learned):
    the speed (next_speed, the sample priced with the learned per-sequence ratio), the
    windows counted, then the per-sequence ratio (next_seq_ratio) from `fit_parts`
    (window_parts up to FIT_MAX_WAITING_PER_REPLICA; None: `parts`), its gate read
    from `clean_parts` too (window_parts with one chunk a prompt; clean_off).

    `standing_parts`: a window queued at the engines' limit (window_parts'
    `step_priced`), the sample only where `parts` has none and only towards a jump
    (SPEED_JUMP_RATIO x slower than the belief, `allowed`, confirmed as any jump): a
    fleet that never drains its queue is learned only so, and a queued window says
    less than an unqueued one: conversation at a 30 s scrape read a plant of the
    profile's own speed 1.6x in its start-up, its queue on one outdated replica (1,024
    slots) of nine while the other eight ran 58 % of theirs, and averaging that in
    cost a flap."""
    sample = window_speed(parts, belief.seq_ratio)
    standing = window_speed(standing_parts, belief.seq_ratio) if sample is None else None
    if standing is not None and _jumps(belief, standing, allowed):
        sample = standing
    learned = next_speed(belief, sample, dt_s, now_s, confirm_s, allowed)
    samples = belief.speed_samples + (1 if sample is not None else 0)
    fit = parts if fit_parts is None else fit_parts
    learned = replace(learned, speed_samples=samples)
    return next_seq_ratio(learned, fit, dt_s, clean_parts, now_s, confirm_s)


OVERHEAD_MAX_MS = 10_000.0
"""Bound of the learned overhead, ms (a frontend that takes longer is broken, not slow)."""
OVERHEAD_QUANTUM_MS = 10.0
"""The overhead the models use is rounded to this, ms; within it of the profile's, the
profile's own (`model_overhead`)."""


def overhead_sample(obs: Observation, window_s: float) -> float | None:
    """One window's per-request time outside the engine core (ms): mean end-to-end
    latency less mean queue, prefill and decode times, within [0, OVERHEAD_MAX_MS];
    None where the window cannot say (fewer than MIN_REQUESTS_PER_WINDOW requests, a
    mean missing or not finite). All four are recorded when a request finishes, so
    they are means over the same requests whatever the load did (the TTFT, recorded
    at the first token, is not: while a queue drained, a slower plant at 29 ms read
    170-180 ms from TTFT less queue and prefill, its requests' first tokens and their
    ends 20 s apart)."""
    means = (
        obs.e2e_mean_ms,
        obs.queue_time_mean_ms,
        obs.prefill_time_mean_ms,
        obs.decode_time_mean_ms,
    )
    if any(v is None or not math.isfinite(v) for v in means):
        return None
    if obs.arrival_rate_rps * window_s < MIN_REQUESTS_PER_WINDOW:
        return None
    e2e, queue, prefill, decode = means  # type: ignore[misc]
    return min(OVERHEAD_MAX_MS, max(0.0, e2e - queue - prefill - decode))


def next_overhead(
    previous_ms: float | None,
    sample_ms: float | None,
    dt_s: float,
    prior_ms: float,
    half_life_s: float = SPEED_HALF_LIFE_S,
) -> float | None:
    """The learned overhead (ms) after `dt_s` seconds of evidence `sample_ms`: a
    half-life average from `previous_ms` (None: nothing learned yet, start from the
    profile's `prior_ms`); unchanged without a sample. Example: a window of 12 req/s
    over 60 s, end-to-end mean 3,412 ms, queue 38, prefill 146, decode 3,000: a sample
    of 228 ms; from nothing learned on a profile of 29 ms, 5 s of it with a 60 s
    half-life -> 29 + (228 - 29) x (1 - 0.5 ** (5 / 60)) = 40.2 ms."""
    if sample_ms is None or dt_s <= 0:
        return previous_ms
    prev = prior_ms if previous_ms is None else previous_ms
    keep = 0.5 ** (dt_s / half_life_s)
    return keep * prev + (1.0 - keep) * sample_ms


def model_overhead(learned_ms: float | None, prior_ms: float) -> float:
    """The overhead the models price (ms): the profile's `prior_ms` where nothing is
    learned or the learned value is within OVERHEAD_QUANTUM_MS of it, else the learned
    one rounded to the quantum. Example: learned 40.2, prior 29 -> 40.0; learned 35,
    prior 29 -> 29."""
    if learned_ms is None or abs(learned_ms - prior_ms) < OVERHEAD_QUANTUM_MS:
        return prior_ms
    return round(learned_ms / OVERHEAD_QUANTUM_MS) * OVERHEAD_QUANTUM_MS


def model_speed(speed: float) -> float:
    """The learned speed as the models use it: rounded to SPEED_QUANTUM, and 1 within
    one quantum of 1 (a profile that is right stays exactly itself)."""
    q = round(speed / SPEED_QUANTUM) * SPEED_QUANTUM
    return 1.0 if abs(q - 1.0) < SPEED_QUANTUM - 1e-9 else round(q, 6)


def believed_profile(profile: Profile, belief: PlantBelief) -> Profile:
    """`profile` as the models use it under `belief`: x its learned speed and
    per-sequence ratio, each as `model_speed` rounds it (`scaled_profile`), with the
    learned overhead as `model_overhead` rounds it."""
    scaled = scaled_profile(profile, model_speed(belief.speed), model_speed(belief.seq_ratio))
    overhead = model_overhead(belief.overhead_ms, profile.request_overhead_ms)
    if overhead == scaled.request_overhead_ms:
        return scaled
    return _kept(
        (id(scaled), overhead),
        scaled,
        lambda: scaled.model_copy(update={"request_overhead_ms": overhead}),
    )


def scaled_profile(profile: Profile, speed: float, seq_ratio: float = 1.0) -> Profile:
    """`profile` with every step-time coefficient x `speed` and the per-sequence ones
    x `seq_ratio` more (the same object at 1, 1; the same object for the same profile
    object and factors, kept by identity: hashing a profile walks all its fields, ~4 us,
    and this runs up to three times per model per tick)."""
    if speed == 1.0 and seq_ratio == 1.0:
        return profile
    return _kept(
        (id(profile), speed, seq_ratio), profile, lambda: _scaled(profile, speed, seq_ratio)
    )


_KEPT_MAX = 256
_KEPT: dict[tuple[object, ...], tuple[Profile, Profile]] = {}
"""Profiles derived from another (scaled, or with another overhead), by (id of the base,
what changed), each with its base: a key whose id was reused by a new profile misses."""


def _kept(key: tuple[object, ...], base: Profile, build: Callable[[], Profile]) -> Profile:
    """The profile `build` derives from `base`, kept under `key` (`_KEPT`)."""
    hit = _KEPT.get(key)
    if hit is not None and hit[0] is base:
        return hit[1]
    if len(_KEPT) >= _KEPT_MAX:
        _KEPT.clear()
    out = build()
    _KEPT[key] = (base, out)
    return out


def _scaled(profile: Profile, speed: float, seq_ratio: float = 1.0) -> Profile:
    c = profile.step_time
    scaled = c.model_copy(
        update={
            "floor_ms": c.floor_ms * speed,
            "base_ms": c.base_ms * speed,
            "per_token_ms": c.per_token_ms * speed,
            "fixed_ms": c.fixed_ms * speed,
            "per_sampled_seq_ms": c.per_sampled_seq_ms * speed * seq_ratio,
            "per_decode_kv_token_ms": c.per_decode_kv_token_ms * speed * seq_ratio,
            "prefill_attention_ms_per_token2": c.prefill_attention_ms_per_token2 * speed,
        }
    )
    return profile.model_copy(update={"step_time": scaled})
