"""Decision and state types of the decider.

`decide(observation, state, now)` returns a `Decision` and a new `ModelState`. Both are
frozen dataclasses: the state is never a dict and never mutated, so a decision can be
replayed from (observation, state, now). Times are seconds on the loop's monotonic
clock; durations are compared as timestamps (`now - since >= window`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum

from estimators.smoothing import HoltState


class Reason(StrEnum):
    """Reason code of one stage's outcome. Each stage returns exactly one."""

    # raw recommendation
    CAPACITY = "CAPACITY"  # from demand / per-replica capacity
    SLA_FEEDBACK = "SLA_FEEDBACK"  # capacity corrected by the observed SLA (either way)
    IDLE = "IDLE"  # no demand: recommend min (zero only after the idle period)
    SCALE_TO_ZERO = "SCALE_TO_ZERO"
    SCALE_FROM_ZERO = "SCALE_FROM_ZERO"  # demand at zero replicas, no lengths yet: one
    BURST_MEMORY = "BURST_MEMORY"  # sized for a recent panic-level burst (decaying)
    SHORT_WINDOW = "SHORT_WINDOW"  # a rise the short window confirmed (two ticks, or a queue)
    QUEUE_GROWTH = "QUEUE_GROWTH"  # slots busy, the queue growing: served + its growth
    SLA_INFEASIBLE = "SLA_INFEASIBLE"  # a replica unloaded gives > 2/3 of a target: relaxed
    # deadband
    WITHIN_TOLERANCE = "WITHIN_TOLERANCE"
    OUTSIDE_TOLERANCE = "OUTSIDE_TOLERANCE"
    # stabilization
    STABLE = "STABLE"
    SCALE_DOWN_STABILIZED = "SCALE_DOWN_STABILIZED"
    SCALE_UP_STABILIZED = "SCALE_UP_STABILIZED"
    # rate limits
    NOT_LIMITED = "NOT_LIMITED"
    SCALE_UP_LIMITED = "SCALE_UP_LIMITED"
    SCALE_DOWN_LIMITED = "SCALE_DOWN_LIMITED"
    # cooldown
    NO_COOLDOWN = "NO_COOLDOWN"
    SCALE_DOWN_COOLDOWN = "SCALE_DOWN_COOLDOWN"
    # clamp
    WITHIN_BOUNDS = "WITHIN_BOUNDS"
    CLAMPED_MIN = "CLAMPED_MIN"
    CLAMPED_MAX = "CLAMPED_MAX"
    # panic
    PANIC = "PANIC"
    PANIC_HOLD = "PANIC_HOLD"
    NO_PANIC = "NO_PANIC"
    # composite scale-out rules (controller/rules.py)
    RULE_SCALE_OUT = "RULE_SCALE_OUT"  # a rule's floor raised the replicas
    RULES_NOT_BINDING = "RULES_NOT_BINDING"  # rules evaluated; none raised the replicas
    # missing data
    NO_DATA_HOLD = "NO_DATA_HOLD"
    NO_DATA_FALLBACK = "NO_DATA_FALLBACK"
    # knobs
    KNOBS_UNCHANGED = "KNOBS_UNCHANGED"
    KNOBS_CHANGED = "KNOBS_CHANGED"
    KNOBS_PENDING = "KNOBS_PENDING"  # a better value is waiting to be sustained
    KNOBS_NOT_MATERIAL = "KNOBS_NOT_MATERIAL"
    KNOBS_NO_DATA = "KNOBS_NO_DATA"
    KNOBS_STATIC = "KNOBS_STATIC"
    # tokens stream slower than the ITL target at the fewest sequences the knobs may have
    KNOBS_SLA_INFEASIBLE = "KNOBS_SLA_INFEASIBLE"
    # the fleet is at its max replicas and short: the knobs in force serve throughput
    KNOBS_THROUGHPUT = "KNOBS_THROUGHPUT"


@dataclass(frozen=True, slots=True)
class Knobs:
    """Engine batching knobs (vLLM flag names)."""

    max_num_seqs: int
    max_num_batched_tokens: int

    def differs_by(self, other: Knobs, frac: float) -> bool:
        """Whether these knobs differ from `other` by at least `frac` of `other` in either
        knob (e.g. 0.25: 160 seqs vs 128 differs, 150 does not). Equal knobs never differ
        (at `frac` 0 every change is material, and no non-change is one)."""
        return self != other and (
            abs(self.max_num_seqs - other.max_num_seqs) >= frac * other.max_num_seqs
            or abs(self.max_num_batched_tokens - other.max_num_batched_tokens)
            >= frac * other.max_num_batched_tokens
        )

    def within(self, floor: Knobs, ceiling: Knobs) -> Knobs:
        """These knobs moved inside [`floor`, `ceiling`] (sequences, tokens), the token
        budget at least max_num_seqs (vLLM refuses a budget below max_num_seqs).
        Example: 512 / 300 within 8 / 256 .. 1024 / 65536 -> 512 / 512."""
        # ... and so at most the token ceiling (the config keeps that >= the seqs floor)
        seqs = min(
            max(self.max_num_seqs, floor.max_num_seqs),
            ceiling.max_num_seqs,
            ceiling.max_num_batched_tokens,
        )
        tokens = min(
            max(self.max_num_batched_tokens, floor.max_num_batched_tokens, seqs),
            ceiling.max_num_batched_tokens,
        )
        return Knobs(max_num_seqs=seqs, max_num_batched_tokens=tokens)

    def engine_args(self) -> list[str]:
        """The vLLM command-line flags for these knobs."""
        return [
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
        ]


LIVE_SCHEDULER_CLS = "governor_engine.scheduler.GovernedScheduler"
"""vLLM `--scheduler-cls` of the engine plugin that follows the knobs live."""
LIVE_MIDDLEWARE = "governor_engine.middleware.LatencyDistMiddleware"
"""vLLM `--middleware` that adds the `X-Latency-Dist` header."""


def live_engine_args(ceiling: Knobs, server: str, model: str) -> list[str]:
    """The vLLM flags of an engine that follows the governor live: the ceilings (the
    largest knobs the governor may choose), the scheduler plugin, the header middleware,
    and the governor's address and model for both (`--additional-config`, JSON without
    spaces, so the flags survive a shell's word splitting)."""
    extra = json.dumps({"governor_server": server, "governor_model": model}, separators=(",", ":"))
    return [
        *ceiling.engine_args(),
        "--scheduler-cls",
        LIVE_SCHEDULER_CLS,
        "--middleware",
        LIVE_MIDDLEWARE,
        "--additional-config",
        extra,
    ]


@dataclass(frozen=True, slots=True)
class Lengths:
    """Request length statistics, tokens; and `prefix_hit_frac`, the share of prompt
    tokens the engines find in their prefix cache (0-1: not computed, so not priced as
    prefill work; their context still counts)."""

    prompt_mean: float
    prompt_p95: float
    output_mean: float
    output_p95: float
    prefix_hit_frac: float = 0.0


@dataclass(frozen=True, slots=True)
class Stage:
    """One post-processing stage's input, output and reason code (replicas)."""

    name: str
    before: int
    after: int
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """What the decider wants for one model at `at_s`.

    `valid` False means "no decision": the actuator must leave the fleet as it is.
    `replicas` is the final desired replica count after every stage; `stages` the trace.
    """

    model: str
    at_s: float
    valid: bool
    replicas: int
    knobs: Knobs
    stages: tuple[Stage, ...]
    knob_reason: Reason
    raw_replicas: float | None = None
    demand_rps: float | None = None
    capacity_rps_per_replica: float | None = None
    panic: bool = False
    plant_speed: float | None = None
    """The engines' learned step-time factor against the profile (> 1: slower)."""
    plant_seq_ratio: float | None = None
    """Learned factor on the profile's per-sequence step costs on top of the speed."""
    plant_cold_start_s: float | None = None
    """The cold start planned with (ask to all ready), s: learned, else configured."""
    plant_overhead_ms: float | None = None
    """The per-request time before the engine core the TTFT bound prices, ms: learned
    (controller.plant.model_overhead), else the profile's."""
    capacity_correction: float | None = None
    """The feedback correction on capacity from the observed SLA, in [0.4, min(2, 1 / the
    target utilization)]: below 1 from violations, past 1 from a loaded fleet met with
    margin."""
    knob_correction: float | None = None
    """The feedback factor on the ITL step budget the `slo` knobs are sized for, from
    tokens streaming too slowly at the sequence cap, in [0.25, 1]."""
    prefix_hit_frac: float | None = None
    """The share of prompt tokens the capacity and speed models priced as prefix-cache
    hits (not prefilled; believed from `vllm:prefix_cache_hits_total`), 0-0.95."""
    capacity_limit: str | None = None
    """The SLA target that bounds `capacity_rps_per_replica` ("ITL", "TTFT", or
    "saturation": the replica cannot keep up first): the one that costs replicas."""
    rollout: bool = False
    """True on the tick a knob change big enough to be worth restarting the running
    replicas is adopted (a rolling restart); smaller changes reach new replicas only."""
    detail: str = ""

    @property
    def reasons(self) -> tuple[Reason, ...]:
        """Reason codes of every stage, in order."""
        return tuple(s.reason for s in self.stages)

    def explain(self) -> str:
        """Multi-line human-readable trace, as `governor explain` prints it."""
        head = (
            f"{self.model} @ {self.at_s:.1f}s: replicas={self.replicas} "
            f"knobs=seqs:{self.knobs.max_num_seqs}/tokens:{self.knobs.max_num_batched_tokens} "
            f"({self.knob_reason}) valid={self.valid}"
        )
        lines = [head]
        if self.demand_rps is not None:
            cap = self.capacity_rps_per_replica
            lines.append(
                f"  demand={self.demand_rps:.3f} req/s  capacity/replica="
                + (f"{cap:.3f} req/s" if cap is not None else "n/a")
                + (f" ({self.capacity_limit}-bound)" if self.capacity_limit else "")
                + (f"  raw={self.raw_replicas:.2f}" if self.raw_replicas is not None else "")
            )
        if self.prefix_hit_frac:
            lines.append(prefix_hits_line(self.prefix_hit_frac))
        if self.plant_speed is not None:
            lines.append(
                f"  plant: step time x{self.plant_speed:.2f} of the profile (learned)"
                + (
                    f", per-sequence cost x{self.plant_seq_ratio:.2f} more"
                    if self.plant_seq_ratio is not None and self.plant_seq_ratio != 1.0
                    else ""
                )
                + (
                    f"  capacity correction x{self.capacity_correction:.2f}"
                    if self.capacity_correction is not None
                    else ""
                )
                + (
                    f"  knob correction x{self.knob_correction:.2f}"
                    if self.knob_correction is not None and self.knob_correction != 1.0
                    else ""
                )
                + (
                    f"  cold start {self.plant_cold_start_s:.0f} s"
                    if self.plant_cold_start_s is not None
                    else ""
                )
                + (
                    f"  overhead {self.plant_overhead_ms:.0f} ms"
                    if self.plant_overhead_ms is not None
                    else ""
                )
            )
        for s in self.stages:
            arrow = f"{s.before} -> {s.after}"
            lines.append(
                f"  {s.name:<10} {arrow:<12} {s.reason}" + (f"  {s.detail}" if s.detail else "")
            )
        if self.rollout:
            lines.append(
                "  rollout: knob change worth a rolling restart; requested (applied by the "
                "Kubernetes actuator: one per model at a time, never in panic, never leaving "
                "fewer replicas ready than raw, rate-limited)"
            )
        if self.detail:
            lines.append(f"  note: {self.detail}")
        return "\n".join(lines)


def prefix_hits_line(frac: float) -> str:
    """The line `explain` and `governor status` print for a priced prefix-cache hit
    share `frac` (0-0.95). Example: 0.6 -> "  prompts: 60% of their tokens ..."."""
    return f"  prompts: {frac:.0%} of their tokens priced as prefix-cache hits (not prefilled)"


DECISION_NUMBERS = (
    "demand_rps",
    "capacity_rps_per_replica",
    "raw_replicas",
    "plant_speed",
    "capacity_correction",
    "plant_seq_ratio",
    "plant_cold_start_s",
    "knob_correction",
    "prefix_hit_frac",
    "plant_overhead_ms",
)
"""The `Decision` fields that are optional numbers (None: not computed), as the admin
API (service.convert) and `governor simulate --decisions` (simulator.report) export them."""


@dataclass(frozen=True, slots=True)
class Hysteresis:
    """Memory of the post-processing stages (controller.stages).

    `recommendations`: (time, replicas) of recent post-deadband recommendations, for the
    stabilization windows. `actions`: (time, replica delta) of recent output changes, for
    the rate limits. Both are pruned to the longest window that reads them.
    """

    recommendations: tuple[tuple[float, int], ...] = ()
    actions: tuple[tuple[float, int], ...] = ()
    last_scale_up_s: float | None = None
    panic_until_s: float | None = None
    idle_since_s: float | None = None
    """Start of the current idle stretch (no demand, no requests), for scale to zero."""


@dataclass(frozen=True, slots=True)
class LengthRises:
    """Since when each reading of longer requests has read past the belief on every good
    tick (s; None: not on the last one; controller.knobstep): the prompt and output
    histograms' window means (past SHIFT_RISE x the smoothed means) and the outputs in
    flight (past INFLIGHT_RISE x the believed output mean)."""

    prompt_since_s: float | None = None
    output_since_s: float | None = None
    inflight_since_s: float | None = None


@dataclass(frozen=True, slots=True)
class Forecast:
    """What the decider believes about demand: the smoothed arrival rate with its trend,
    the request lengths, and the remembered panic-level burst."""

    load: HoltState | None = None
    lengths: Lengths | None = None
    """Last known request length statistics (tokens), kept through gaps in the data."""
    burst_rps: float | None = None
    """Demand of the last panic-level burst, req/s (decays; see the decider)."""
    burst_at_s: float | None = None
    short_rps: float | None = None
    """The short window's arrival rate on the last tick, req/s (a rise needs two)."""
    short_at_s: float | None = None
    short_waiting: float | None = None
    """The waiting gauge on the tick of `short_rps` (requests; None: not reported)."""
    short_sample_s: float | None = None
    """When the newest sample behind that tick's observation was taken (s, the tick's
    time less the observation's staleness): a gauge moves only between samples."""
    short_noise_z2: float | None = None
    """The short window's spread: a mean (600 s half-life) of its squared z over the
    base (dimensionless; 1 for Poisson arrivals; see controller.demand)."""
    load_marks: tuple[tuple[float, float], ...] = ()
    """(time s, long-window arrival rate req/s), one per window_s (windows that do not
    overlap), over the scale-down window: what the load was when it began."""
    long_noise_z2: float | None = None
    """The long window's spread around the smoothed level: a mean (600 s half-life) of
    its squared z (dimensionless; 1 for Poisson arrivals; see controller.demand)."""
    rises: LengthRises = LengthRises()
    """Since when longer requests have read past the length belief (controller.knobstep)."""


@dataclass(frozen=True, slots=True)
class KnobMemory:
    """A better knob setting waiting to be sustained, and how often knobs changed."""

    candidate: Knobs | None = None
    candidate_since_s: float | None = None
    changes: int = 0
    running: Knobs | None = None
    """Knobs that replicas started before the last change still run (None: every
    replica runs the published knobs): capacity counts them until they are replaced."""
    running_replicas: int = 0
    """How many replicas run `running` (at most the fleet's size)."""
    running_until_s: float | None = None
    """When a rolling restart is expected to have replaced them (None: no roll-out)."""
    changed_at_s: float | None = None
    """When the knobs in force were published (loop's monotonic seconds; None: the
    model's default knobs, never changed)."""

    def largest(self, knobs: Knobs) -> Knobs:
        """The largest of each knob in force: the published `knobs` and those that
        replicas started before the last change still run."""
        old = self.running
        if old is None:
            return knobs
        return Knobs(
            max(knobs.max_num_seqs, old.max_num_seqs),
            max(knobs.max_num_batched_tokens, old.max_num_batched_tokens),
        )


@dataclass(frozen=True, slots=True)
class DataHealth:
    """Consecutive ticks without usable data, and the first and last good tick."""

    no_data_ticks: int = 0
    last_good_s: float | None = None
    first_good_s: float | None = None
    """Time of the first decision on good data (the start of this model's history)."""
    full_since_s: float | None = None
    """Since when the fleet has been seen whole on good data (ready replicas >= those
    asked for, or readiness not reported); None: seen short of its size on the latest
    tick, or no good data yet."""
    calm_since_s: float | None = None
    """Since when the fleet has been seen whole with the queue it had when it turned
    whole drained (at most one waiting request per ready replica; a queue that builds
    later does not reset it). The SLA judges the capacity model only a window after
    this: a queue left from a stretch the fleet was short for (a start-up ramp, a slow
    cold start) drains with violations that say nothing of the capacity model, while
    one that builds on a whole fleet is what the model is judged on."""
    whole_at_s: float | None = None
    """The last good tick that saw the fleet whole (None: none yet). A fleet seen short
    and then whole again samples the cold start only if it was not seen whole since the
    last scale-up (controller.feedback.next_cold_start): a replica that restarts an hour
    later is not a cold start of an hour."""

    @staticmethod
    def whole(ready: int | None, asked: int) -> bool:
        """Whether a fleet with `ready` replicas ready is the `asked` one: readiness not
        reported counts as whole."""
        return ready is None or ready >= asked

    def calm_for(self, now_s: float, span_s: float) -> bool:
        """Whether the fleet has been calm (`calm_since_s`) for at least `span_s`
        seconds at `now_s`."""
        return self.calm_since_s is not None and now_s - self.calm_since_s >= span_s

    def after_good(
        self, now_s: float, ready: int | None, asked: int, waiting: float | None = None
    ) -> DataHealth:
        """The health after a tick on good data at `now_s` (s) that found `ready` of the
        `asked` replicas ready and `waiting` requests queued. The fleet is whole when the
        ready replicas cover what was asked for (readiness not reported counts as whole);
        a fleet short of its size resets `full_since_s` and `calm_since_s`, and a whole
        one is calm from the first tick its queue is down to one per ready replica
        (not reported counts as none). Seen, not assumed: a cold start slower than
        configured keeps the SLA from judging the capacity model on samples from before
        the new replicas served."""
        whole = DataHealth.whole(ready, asked)
        drained = waiting is None or waiting <= max(1, asked if ready is None else ready)
        calm = self.calm_since_s if self.calm_since_s is not None or not drained else now_s
        first = self.first_good_s if self.first_good_s is not None else now_s
        return DataHealth(
            0,
            now_s,
            first,
            (now_s if self.full_since_s is None else self.full_since_s) if whole else None,
            calm if whole else None,
            now_s if whole else self.whole_at_s,
        )


@dataclass(frozen=True, slots=True)
class PlantBelief:
    """What the decider has learned about the engines, as factors on its profile."""

    capacity_correction: float = 1.0
    """Feedback factor on the per-replica capacity from the observed SLA
    (controller.feedback.next_correction)."""
    knob_correction: float = 1.0
    """Feedback factor on the ITL step budget the `slo` knobs are sized for, from tokens
    streaming slower than the SLA allows at the engines' sequence cap
    (controller.feedback.next_knob_correction)."""
    speed: float = 1.0
    """Learned step-time factor of the engines against the profile (> 1: slower)."""
    speed_samples: int = 0
    """Windows the speed was learned from."""
    speed_jump: float | None = None
    """A jump to a much slower speed seen but not yet confirmed (controller.plant)."""
    speed_jump_since_s: float | None = None
    """When that jump was first seen (loop's monotonic seconds)."""
    seq_ratio: float = 1.0
    """Learned extra factor on the profile's per-sequence step costs (controller.plant)."""
    seq_fit: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    """Half-life sums of the per-sequence ratio's least-squares fit (ms^2)."""
    seq_off_since_s: float | None = None
    """Since when every clean window (controller.plant.clean_off) has read the
    engines SEQ_FIT_MIN_SPEED off the profile (loop's monotonic seconds; None: the
    last one did not)."""
    cold_start_s: float | None = None
    """Learned time from asking for replicas to seeing them all ready, s (None: none
    seen yet; the configured cold start is used). controller.feedback.next_cold_start."""
    overhead_ms: float | None = None
    """Learned per-request time before the engine core, ms (None: none learned yet; the
    profile's is used). controller.plant.next_overhead."""


@dataclass(frozen=True, slots=True)
class RuleState:
    """One composite scale-out rule's memory (controller/rules.py): when each condition
    started to hold (None: it does not), the replica floor the rule holds (None: none)
    and when it last fired; times are the loop's monotonic seconds."""

    name: str
    since_s: tuple[float | None, ...]
    floor: int | None = None
    fired_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class RuleMemory:
    """The scale-out rules' memory, one `RuleState` per configured rule."""

    states: tuple[RuleState, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelState:
    """Everything the decider remembers about one model between ticks: the replicas and
    knobs it asked for last, and one small frozen record per concern."""

    replicas: int
    knobs: Knobs
    windows: Hysteresis = Hysteresis()
    forecast: Forecast = Forecast()
    knob_memory: KnobMemory = KnobMemory()
    health: DataHealth = DataHealth()
    plant: PlantBelief = PlantBelief()
    rules: RuleMemory = RuleMemory()


@dataclass(frozen=True, slots=True)
class SavedState:
    """`ModelState` in its saved form (state document format v1): one flat record.

    Every field keeps the name it had in the flat state of earlier versions, so saved
    documents stay readable in both directions; fields added later have defaults.
    """

    replicas: int
    knobs: Knobs
    last_scale_up_s: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()
    actions: tuple[tuple[float, int], ...] = ()
    panic_until_s: float | None = None
    idle_since_s: float | None = None
    no_data_ticks: int = 0
    last_good_s: float | None = None
    burst_rps: float | None = None
    burst_at_s: float | None = None
    first_good_s: float | None = None
    load: HoltState | None = None
    capacity_correction: float = 1.0
    knob_candidate: Knobs | None = None
    knob_candidate_since_s: float | None = None
    knob_changes: int = 0
    lengths: Lengths | None = None
    rules: tuple[RuleState, ...] = ()
    knob_running: Knobs | None = None
    knob_running_replicas: int = 0
    knob_running_until_s: float | None = None
    short_rps: float | None = None
    short_at_s: float | None = None
    short_waiting: float | None = None
    short_sample_s: float | None = None
    short_noise_z2: float | None = None
    load_marks: tuple[tuple[float, float], ...] = ()
    long_noise_z2: float | None = None
    inflight_since_s: float | None = None
    prompt_rise_since_s: float | None = None
    output_rise_since_s: float | None = None
    plant_speed: float = 1.0
    plant_speed_samples: int = 0
    plant_speed_jump: float | None = None
    plant_speed_jump_since_s: float | None = None
    plant_seq_ratio: float = 1.0
    plant_seq_fit: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    plant_seq_off_since_s: float | None = None
    fleet_full_since_s: float | None = None
    plant_cold_start_s: float | None = None
    plant_overhead_ms: float | None = None
    fleet_calm_since_s: float | None = None
    fleet_whole_at_s: float | None = None
    plant_knob_correction: float = 1.0
    knob_changed_at_s: float | None = None

    @classmethod
    def of(cls, s: ModelState) -> SavedState:
        """The saved form of `s`."""
        w, f, k, h = s.windows, s.forecast, s.knob_memory, s.health
        return cls(
            replicas=s.replicas,
            knobs=s.knobs,
            last_scale_up_s=w.last_scale_up_s,
            recommendations=w.recommendations,
            actions=w.actions,
            panic_until_s=w.panic_until_s,
            idle_since_s=w.idle_since_s,
            no_data_ticks=h.no_data_ticks,
            last_good_s=h.last_good_s,
            burst_rps=f.burst_rps,
            burst_at_s=f.burst_at_s,
            first_good_s=h.first_good_s,
            fleet_full_since_s=h.full_since_s,
            fleet_calm_since_s=h.calm_since_s,
            fleet_whole_at_s=h.whole_at_s,
            load=f.load,
            capacity_correction=s.plant.capacity_correction,
            knob_candidate=k.candidate,
            knob_candidate_since_s=k.candidate_since_s,
            knob_changes=k.changes,
            lengths=f.lengths,
            rules=s.rules.states,
            knob_running=k.running,
            knob_running_replicas=k.running_replicas,
            knob_running_until_s=k.running_until_s,
            knob_changed_at_s=k.changed_at_s,
            short_rps=f.short_rps,
            short_at_s=f.short_at_s,
            short_waiting=f.short_waiting,
            short_sample_s=f.short_sample_s,
            short_noise_z2=f.short_noise_z2,
            load_marks=f.load_marks,
            long_noise_z2=f.long_noise_z2,
            inflight_since_s=f.rises.inflight_since_s,
            prompt_rise_since_s=f.rises.prompt_since_s,
            output_rise_since_s=f.rises.output_since_s,
            plant_speed=s.plant.speed,
            plant_speed_samples=s.plant.speed_samples,
            plant_speed_jump=s.plant.speed_jump,
            plant_speed_jump_since_s=s.plant.speed_jump_since_s,
            plant_seq_ratio=s.plant.seq_ratio,
            plant_seq_fit=s.plant.seq_fit,
            plant_seq_off_since_s=s.plant.seq_off_since_s,
            plant_cold_start_s=s.plant.cold_start_s,
            plant_overhead_ms=s.plant.overhead_ms,
            plant_knob_correction=s.plant.knob_correction,
        )

    def state(self) -> ModelState:
        """The `ModelState` this saved form describes."""
        return ModelState(
            replicas=self.replicas,
            knobs=self.knobs,
            windows=Hysteresis(
                recommendations=self.recommendations,
                actions=self.actions,
                last_scale_up_s=self.last_scale_up_s,
                panic_until_s=self.panic_until_s,
                idle_since_s=self.idle_since_s,
            ),
            forecast=Forecast(
                load=self.load,
                lengths=self.lengths,
                burst_rps=self.burst_rps,
                burst_at_s=self.burst_at_s,
                short_rps=self.short_rps,
                short_at_s=self.short_at_s,
                short_waiting=self.short_waiting,
                short_sample_s=self.short_sample_s,
                short_noise_z2=self.short_noise_z2,
                load_marks=self.load_marks,
                long_noise_z2=self.long_noise_z2,
                rises=LengthRises(
                    prompt_since_s=self.prompt_rise_since_s,
                    output_since_s=self.output_rise_since_s,
                    inflight_since_s=self.inflight_since_s,
                ),
            ),
            knob_memory=KnobMemory(
                candidate=self.knob_candidate,
                candidate_since_s=self.knob_candidate_since_s,
                changes=self.knob_changes,
                running=self.knob_running,
                running_replicas=self.knob_running_replicas,
                running_until_s=self.knob_running_until_s,
                changed_at_s=self.knob_changed_at_s,
            ),
            health=DataHealth(
                no_data_ticks=self.no_data_ticks,
                last_good_s=self.last_good_s,
                first_good_s=self.first_good_s,
                full_since_s=self.fleet_full_since_s,
                calm_since_s=self.fleet_calm_since_s,
                whole_at_s=self.fleet_whole_at_s,
            ),
            plant=PlantBelief(
                capacity_correction=self.capacity_correction,
                knob_correction=self.plant_knob_correction,
                speed=self.plant_speed,
                speed_samples=self.plant_speed_samples,
                speed_jump=self.plant_speed_jump,
                speed_jump_since_s=self.plant_speed_jump_since_s,
                seq_ratio=self.plant_seq_ratio,
                seq_fit=self.plant_seq_fit,
                seq_off_since_s=self.plant_seq_off_since_s,
                cold_start_s=self.plant_cold_start_s,
                overhead_ms=self.plant_overhead_ms,
            ),
            rules=RuleMemory(states=self.rules),
        )
