"""What the decider learns from the SLA's own signals, online: whether a window violated
the SLA or met it with margin, and the corrections and times that evidence sets.

controller.plant learns how fast the engines are from their step times, before the SLA
is violated; this module holds what only the SLA's outcome shows:

- **capacity correction** (`next_correction`, in [CORRECTION_MIN, `correction_ceiling`]):
  shrinks while the observed SLA is violated on a whole fleet that was believed big
  enough, recovers while it is met with margin on a loaded fleet, and past 1 (the
  model shown pessimistic) spends the target utilization's headroom, slowly. It
  catches what the step-time model cannot see (e.g. a burstier arrival process than
  assumed, or a router that spreads long prompts better than it prices). It judges
  only a fleet seen whole (every replica asked for ready) for a window.
- **knob correction** (`next_knob_correction`): the ITL step budget the `slo` knobs are
  sized for, shrunk while tokens stream slower than the SLA allows at the sequence cap.
- **cold start** (`next_cold_start`): the time from asking for replicas to seeing them
  all ready, sampled when a fleet seen short turns whole; it sets the dead time after
  a scale-up (no speed or correction learned from the window that holds it).
- **evidence** (`sla_evidence`, `streaming_evidence`): a window's violation judged past
  chance (VIOLATION_Z), so a handful of slow requests in a small window is not one.
"""

from __future__ import annotations

import math

from controller.config import SLA
from controller.types import ModelState
from estimators.types import Observation

CORRECTION_MIN = 0.4
CORRECTION_DECAY_PER_S = 0.005  # while violated: x exp(-0.005 dt); 60 s -> x0.74
CORRECTION_RECOVERY_PER_S = 0.0005  # while healthy: +0.0005 per s; 10 min -> +0.3
# Past 1 the evidence is weaker: a fleet loaded to 80 % of what the corrected model
# says it serves at the target, met with margin, claims more than the model; so it rises
# at a quarter of the recovery's pace (10 healthy minutes: +0.075; the whole headroom of
# a 0.85 target, +0.18, in about 24). Measured (docs/decider-history.md, "The model shown
# pessimistic"): at the full pace the conversation trace gained a flap at seeds 1, 2
# and 3 (a fleet shrunk on a correction of 1.18 met a rise of 7 % and came back within
# 4 minutes), at half of it at seed 1; at a quarter and an eighth at none of them.
CORRECTION_GAIN_PER_S = CORRECTION_RECOVERY_PER_S / 4.0
CORRECTION_MAX = 2.0
"""The largest correction whatever the target utilization (the model at most twice
pessimistic); `correction_ceiling` is usually lower."""
COLD_START_WEIGHT = 0.5  # a new ask-to-ready sample's weight against the learned cold start
LOADED_FRAC = 0.8  # demand >= 80 % of the corrected fleet capacity counts as "loaded"
HEALTHY_FRAC = 0.7  # observed p95 below 70 % of its threshold counts as "met with margin"
# ITL: the SLA is on each request's streaming speed (its mean inter-token latency, as
# `governor simulate` scores it), while vLLM's histogram counts every token gap. The
# slo knobs let a step that carries a prefill chunk take up to MIXED_STEP_FACTOR x the
# target, so a request's mean stays within the target while up to ~10 % of its gaps are
# slow ones (0.9 x 0.7 + 0.1 x 2 = 0.83 of the target): the token-level evidence of a
# violation is fewer than min(goal, 90 %) of gaps within the target, or a p95 past 2x
# the target.
ITL_SLOW_GAPS_FRAC = 0.10
# A per-request attainment below its goal is evidence only past chance: its misses over
# the allowed ones by this many binomial standard deviations of the window's requests.
# At a 99 % goal a window of 60 requests (long-context's minute) allows 0.6 misses, and
# one slow request, 98.3 %, comes by chance in 45 % of such windows: start 4 read those
# as violations and cut the correction to 0.70 for the whole half hour (2.62x the
# oracle's GPU-hours, 1.91x judged past chance). 1.64 and 2.33 met the same matrix
# goals; 3.09 lost diurnal on the slower plant its 99 %.
VIOLATION_Z = 2.0


def sla_evidence(obs: Observation, sla: SLA, requests: float | None = None) -> tuple[bool, bool]:
    """(violated, healthy) from the observed SLA signals; `requests`: how many requests
    the per-request attainments (TTFT, TPOT) count (the arrival rate x the window; None:
    judged as if unbounded).

    Violated: an attainment below its goal (TTFT: `sla.attainment_goal_frac`; ITL token
    gaps: min(goal, 90 %)), past chance for the per-request ones (`VIOLATION_Z`), or,
    without an exact attainment, a p95 past its threshold (ITL token gaps: 2x).
    Healthy: every signal known and within half the allowed misses (or its p95 within
    70 % of the threshold). Example: 60 requests at 98.3 % against 99 % are 1 miss where
    0.6 are allowed, sd 0.77: chance, not evidence; 2,400 requests at 98 % are 48 misses
    where 24 are allowed, sd 4.9: a violation."""
    goal = sla.attainment_goal_frac
    ttft = _evidence(
        obs.ttft_attainment_frac, obs.ttft_p95_ms, sla.ttft_p95_ms, goal, 1.0, requests
    )
    itl = _evidence(*_streaming_signal(obs, sla, requests))
    return ttft[0] or itl[0], ttft[1] and itl[1]


def streaming_evidence(
    obs: Observation, sla: SLA, requests: float | None = None
) -> tuple[bool, bool]:
    """(violated, healthy) of the ITL half of `sla_evidence` (the batch a replica runs
    sets it, where the queue sets TTFT)."""
    return _evidence(*_streaming_signal(obs, sla, requests))


def streaming_violated(obs: Observation, sla: SLA, requests: float | None = None) -> bool:
    """Whether tokens stream slower than the SLA allows (`streaming_evidence`)."""
    return streaming_evidence(obs, sla, requests)[0]


_Signal = tuple[float | None, float | None, float, float, float, float | None]
"""(attainment, p95 ms, threshold ms, attainment goal, p95 factor, requests counted)."""


def _streaming_signal(obs: Observation, sla: SLA, requests: float | None) -> _Signal:
    """The ITL evidence `_evidence` judges: the per-request TPOT
    (`vllm:request_time_per_output_token_seconds`) where the engine exposes it, judged
    like the SLA itself (each request's streaming speed against the target, the
    attainment goal, no slow-gap allowance); else the per-token histogram with its
    allowance (see ITL_SLOW_GAPS_FRAC)."""
    from controller.batching import MIXED_STEP_FACTOR

    goal = sla.attainment_goal_frac
    if obs.tpot_attainment_frac is not None or obs.tpot_p95_ms is not None:
        return (obs.tpot_attainment_frac, obs.tpot_p95_ms, sla.itl_p95_ms, goal, 1.0, requests)
    itl_goal = min(goal, 1.0 - ITL_SLOW_GAPS_FRAC)
    # Token gaps: many per request, not counted as requests.
    return (
        obs.itl_attainment_frac,
        obs.itl_p95_ms,
        sla.itl_p95_ms,
        itl_goal,
        MIXED_STEP_FACTOR,
        None,
    )


def _evidence(
    att: float | None,
    p95: float | None,
    target: float,
    goal: float,
    factor: float,
    n: float | None,
) -> tuple[bool, bool]:
    """(violated, healthy) of one SLA signal (`sla_evidence`); neither known: not
    violated, not healthy."""
    if att is not None:
        violated = att < goal and (n is None or _past_chance(att, goal, n))
        return violated, att >= 1.0 - (1.0 - goal) / 2.0  # half the allowed misses
    if p95 is not None:
        return p95 > target * factor, p95 <= HEALTHY_FRAC * target * factor
    return False, False


def _past_chance(attainment: float, goal: float, requests: float) -> bool:
    """Whether `requests` at `attainment` miss more than `goal` allows by more than
    VIOLATION_Z binomial standard deviations."""
    n = max(requests, 1.0)
    allowed = (1.0 - goal) * n
    return (1.0 - attainment) * n > allowed + VIOLATION_Z * math.sqrt(allowed * goal)


def next_cold_start(
    configured_s: float,
    state: ModelState,
    obs: Observation,
    now_s: float,
    max_gap_s: float = math.inf,
) -> float | None:
    """The learned cold start (s; `state.plant.cold_start_s` before) after a tick that
    sees `obs.ready_replicas` of the `state.replicas` asked for ready. When the fleet
    turns whole after a scale-up (the previous tick had good data and saw the fleet
    short of its size, `state.health`; now every replica asked for is ready), the time
    since that scale-up (the replicas asked last, the slowest to come) is a sample,
    averaged with the belief (weight COLD_START_WEIGHT) and kept within [configured / 4,
    configured x 8]. A fleet never seen short (a replica still draining from a
    scale-down covers the new one) gives no sample, nor one seen whole since the scale-up
    (`DataHealth.whole_at_s`: a replica restarting later is no cold start), nor one whose
    previous good tick is over `max_gap_s` old (a controller restarted mid scale-up: when
    the fleet turned whole within its downtime is unknown). It includes
    the actuator's sync and the scrape that shows the replicas ready: the time until
    the decider sees the capacity. Example: configured 45 s, replicas asked at t = 100 s
    seen all ready at t = 195 s -> 95 s (no belief yet), then a 85 s sample -> 90 s."""
    learned_s = state.plant.cold_start_s
    health, ready, last_up = state.health, obs.ready_replicas, state.windows.last_scale_up_s
    was_short = health.full_since_s is None and health.no_data_ticks == 0
    whole = ready is not None and ready >= state.replicas
    if not (was_short and whole and health.last_good_s is not None) or last_up is None:
        return learned_s
    if now_s - health.last_good_s > max_gap_s:
        return learned_s
    if health.whole_at_s is not None and health.whole_at_s > last_up:
        # Seen whole since the scale-up: the fleet went short for another reason (a
        # replica restarting, a node drained); its return says nothing of a cold start.
        return learned_s
    sample = min(max(now_s - last_up, configured_s / 4.0), configured_s * 8.0)
    if learned_s is None:
        return sample
    return (1.0 - COLD_START_WEIGHT) * learned_s + COLD_START_WEIGHT * sample


KNOB_CORRECTION_MIN = 0.25
"""The smallest knob correction: the slo knobs sized for a quarter of the ITL budget."""
AT_CAP_FRAC = 0.9
"""Engines run at their sequence cap when their running sequences per replica reach
this fraction of `max_num_seqs`: the knobs, not the load, set the batch."""
DECODE_BOUND_FRAC = 0.25
"""A window's steps are decode-bound when the prefill tokens they carry (tokens per
step past one per running sequence) are at most this fraction of the token budget."""


def knob_target_out_of_reach(violated: bool, at_cap: bool, settled: bool, floored: bool) -> bool:
    """Whether the ITL target is out of the `slo` knobs' reach: tokens stream slower
    than the SLA allows (`violated`) on engines at their sequence cap (`at_cap`), knobs
    settled (`settled`), where the knobs in force already run the fewest sequences they
    may (`floored`). No smaller budget changes a knob then: next_knob_correction holds
    there, and the decider reports KNOBS_SLA_INFEASIBLE (one guard for both)."""
    return violated and at_cap and settled and floored


def next_knob_correction(
    k: float,
    dt_s: float,
    violated: bool,
    healthy: bool,
    at_cap: bool,
    settled: bool,
    floored: bool,
) -> float:
    """The knob correction after `dt_s` seconds.

    The slo knobs come from the profile's step times x the learned speed; engines whose
    steps grow with the batch in another shape than the profile's (vLLM's CPU build:
    its step doubles from 1 to 32 sequences where an H100's grows 7 %) stream slower
    at the cap than the model says, and a queued fleet teaches no speed. So where
    tokens stream slower than the SLA allows (`violated`) on engines at their sequence
    cap (`at_cap`) with knobs in force for a whole window and none pending (`settled`),
    the ITL budget the knobs are sized for shrinks as the capacity correction does
    (x0.74 a minute), until the knobs it gives differ from those in force; it recovers
    (+0.3 in 10 minutes) while streaming is healthy at the cap. Else unchanged.

    Not below what the knobs in force need: where they already run the fewest
    sequences the knobs may have (`floored`: batching.fewest_seqs), a smaller budget
    changes no knob, and a correction run down to its floor meanwhile would keep the
    knobs there for up to 25 minutes after the target is relaxed or the engines got
    faster (the recovery's pace; a fleet grown for 8 sequences a replica may not run at
    its cap again to recover at all). Example: vLLM's CPU build at an ITL target of
    10 ms (no cap meets it for 95 % of requests): 32 -> 8 sequences at x0.91 within
    70 s, held there, not run down to 0.25 (docs/real-engine-runs.md)."""
    if knob_target_out_of_reach(violated, at_cap, settled, floored):
        return k
    if violated and at_cap and settled:
        return max(KNOB_CORRECTION_MIN, k * math.exp(-CORRECTION_DECAY_PER_S * dt_s))
    if healthy and not violated and at_cap:
        return min(1.0, k + CORRECTION_RECOVERY_PER_S * dt_s)
    return k


def correction_ceiling(target_utilization_frac: float) -> float:
    """The largest capacity correction: 1 / the target utilization (at most
    CORRECTION_MAX). A fleet sized at the target on a corrected capacity then runs at
    most at what the uncorrected model says it serves at the SLA: evidence of a
    pessimistic model spends the headroom, never more. Example: target 0.85 -> 1.18."""
    return min(CORRECTION_MAX, 1.0 / target_utilization_frac)


def next_correction(
    c: float,
    dt_s: float,
    violated: bool,
    healthy: bool,
    judge: bool,
    loaded: bool,
    ceiling: float,
    complete: bool,
) -> float:
    """The capacity correction after `dt_s` seconds, within [CORRECTION_MIN, `ceiling`]
    (`correction_ceiling`; a correction over a lowered ceiling is brought to it at once):
    shrinks while `violated` on a fleet the decider may `judge` (x0.74 a minute),
    recovers while `healthy` and `loaded` (+0.03 a minute up to 1), and past 1 grows
    (+0.0075 a minute) only where it could also shrink, on a fleet the decider may
    `judge` whose data is `complete` (no engine target down, the queue gauge present):
    growth lowers replicas, so it takes at least the evidence a cut does. Else
    unchanged. Example: 1.0 after 20 healthy, loaded minutes -> 1.15; then one violated
    minute -> 0.85.

    A window of few requests reads healthy often by chance (60 at a true 1 % miss rate,
    the SLA's edge: no miss in 55 % of them), where a violation needs 3 misses (2 %).
    Integrated, that drift is +0.55 x 0.0075 - 0.02 x 0.29 = -0.002 a minute there:
    the correction settles where the fleet runs at the SLA's edge, not past it."""
    c = min(c, ceiling)
    if violated and judge:
        return max(CORRECTION_MIN, c * math.exp(-CORRECTION_DECAY_PER_S * dt_s))
    if healthy and not violated and loaded:
        if c < 1.0:
            return min(1.0, c + CORRECTION_RECOVERY_PER_S * dt_s)
        if judge and complete:
            return min(ceiling, c + CORRECTION_GAIN_PER_S * dt_s)
    return c
