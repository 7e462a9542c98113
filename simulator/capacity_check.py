"""The decider's capacity model (controller.capacity) against the simulated plant.

`python -m simulator.capacity_check [--out docs/capacity.md]` (or `governor calibrate
--capacity`) measures, for the request lengths of each trace of the robustness matrix and
a few fleet sizes, the per-replica arrival rate (req/s) at which warm replicas of the
plant still meet the SLA for `attainment_goal_frac` of the requests (99 %), and prints it
beside what the model says, as the markdown table of `docs/capacity.md`.

The decider sizes fleets with the model times `target_utilization_frac` (0.85): where the
model is more than 1 / 0.85 = 1.18x the plant, the sized fleet misses the goal on a
steady load; where it is well under the plant, the fleet holds replicas it does not
need. Neither shows on the trace the model was tuned on, which is why this table spans
every matrix trace.

Each measurement: Poisson arrivals over `DURATION_S` (lengths drawn with replacement
from the trace, the trace's SLA), a fleet of N replicas already serving the knobs the
governor picks for the trace's lengths (`simulator.scenario.governor_knobs_for`), the
profile's request overhead, routed by the fleet's least-outstanding router (`--router
random`: kube-proxy's random endpoint, which the model does not assume; that table is
printed, not committed); attainment
is the mean over `SEEDS` runs. The 99 % rate is bisected (`STEPS` halvings of
[LOW, HIGH] x the model's rate); a rate at the top of that bracket is printed with ">=".
Plant speed 1.0: this is the model's error, not the plant's drift (controller.plant).

A second table (`Split`, from the bisection's runs at the plant's 99 % rate) says which target the
model misreads there: the share of requests over each target and each target's goal
quantile, the plant's against the model's (`operating_point`). A row whose rate the
model gets right can rest on a TTFT it reads optimistic and an ITL it reads
pessimistic (docs/decider-history.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

import numpy as np

from controller.capacity import binding_limit, capacity_rps, operating_point
from controller.config import SLA, ScalingPolicy
from controller.types import Knobs, Lengths
from estimators.stepmodel import Profile, load_profile
from simulator.fleet import ROUTERS, Fleet
from simulator.matrix import TRACES, MatrixTrace
from simulator.outputs import output_problem, write_output
from simulator.pool import process_pool
from simulator.requests import RequestRecords
from simulator.scenario import Scenario, governor_knobs_for, slo_met, trace_lengths
from simulator.traces import Trace, load_trace

SIZES = (1, 2, 4, 8)
"""Fleet sizes measured (replicas)."""
DURATION_S = 600.0
"""Seconds of arrivals per run, at least: longer where the fleet would see fewer than
MIN_REQUESTS at the model's rate (long-context: hours), so that the 1 % the goal allows
is tens of requests, not a handful."""
MIN_REQUESTS = 10_000
SEEDS = (1, 2)
"""Arrival seeds per rate; their attainments are averaged."""
LOW, HIGH, STEPS = 0.25, 2.5, 7
"""The bisection bracket (x the model's rate) and its halvings."""
TRACE_SEED = 0
"""Seed of the matrix traces the lengths come from (MatrixSpec's default)."""


@dataclass(frozen=True)
class Split:
    """Where the plant misses at one rate, and what the model says there: the share of
    requests over each target (TTFT, mean ITL; a request may be over both), and the
    goal quantile (p99 at a 99 % goal) of each, the plant's and the model's (ms; the
    model's None where it has no operating point, a replica it says cannot keep up).
    A model quantile over the plant's is pessimistic on that target."""

    ttft_miss: float
    itl_miss: float
    ttft_q_ms: float
    itl_q_ms: float
    model_ttft_q_ms: float | None
    model_itl_q_ms: float | None


@dataclass(frozen=True)
class Row:
    """One (trace, fleet size): the model's and the plant's 99 % rates (req/s per
    replica), the target that bounds the model's (controller.capacity.binding_limit),
    the knobs, the plant's attainment at the rate the decider sizes for, and `split`:
    each target's share of the plant's misses at its 99 % rate, against the model's
    quantiles there (which of the model's two targets is off, and which way)."""

    trace: str
    replicas: int
    knobs: Knobs
    model_rps: float
    model_limit: str
    plant_rps: float
    plant_at_top: bool
    sized_rps: float
    sized_attainment: float
    split: Split | None = None

    @property
    def ratio(self) -> float:
        """Model / plant (> 1: the model is optimistic)."""
        return self.model_rps / self.plant_rps


def bootstrap_poisson(base: Trace, rate_rps: float, duration_s: float, seed: int) -> Trace:
    """Poisson arrivals at `rate_rps` over `duration_s` with (prompt, output) pairs drawn
    with replacement from `base`."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate_rps * duration_s))
    t = np.sort(rng.random(n) * duration_s)
    idx = rng.integers(0, len(base), n)
    return Trace.from_arrays(
        t, base.prompt_tokens[idx], base.output_tokens[idx], "bootstrap", rebase=False
    )


@dataclass(frozen=True)
class _Setup:
    """One (trace, fleet size): its lengths, SLA, knobs, the model's rate (req/s per
    replica) and the seconds of arrivals per run."""

    base: Trace
    lengths: Lengths
    sla: SLA
    profile: Profile
    knobs: Knobs
    replicas: int
    model_rps: float
    duration_s: float
    router: str = ROUTERS[0]

    def runs(self, per_replica_rps: float) -> list[RequestRecords]:
        """The request records of the warm fleet at this per-replica rate, one per seed
        of SEEDS."""
        out = []
        for seed in SEEDS:
            trace = bootstrap_poisson(
                self.base, per_replica_rps * self.replicas, self.duration_s, seed
            )
            fleet = Fleet(
                self.profile,
                knobs=self.knobs,
                initial_replicas=self.replicas,
                seed=0,
                overhead_s=self.profile.request_overhead_ms / 1000.0,
                router=self.router,
            )
            fleet.submit_trace(trace, offset_s=0.0)
            fleet.run()
            out.append(fleet.records())
        return out

    def attainment(self, per_replica_rps: float) -> float:
        """Mean attainment over SEEDS of the warm fleet at this per-replica rate."""
        return self.attainment_of(self.runs(per_replica_rps))

    def attainment_of(self, recs: list[RequestRecords]) -> float:
        """Mean attainment over the runs `recs` (`runs`)."""
        return float(np.mean([slo_met(r, self.sla).mean() for r in recs]))

    def split(self, per_replica_rps: float, recs: list[RequestRecords] | None = None) -> Split:
        """Each target's misses and goal quantile at this per-replica rate, the plant's
        (over every seed's requests, `recs` when already run there; an unfinished
        request counts as over both) and the model's (`Split`)."""
        if recs is None:
            recs = self.runs(per_replica_rps)
        ttft = np.concatenate([np.where(r.done, r.ttft_s, np.inf) for r in recs]) * 1000.0
        itl = np.concatenate([np.where(r.done, r.mean_itl_s, np.inf) for r in recs]) * 1000.0
        streams = ~np.isnan(itl)  # a one-token output has no ITL
        q = 100.0 * self.sla.attainment_goal_frac
        op = operating_point(
            per_replica_rps, self.knobs, self.lengths, self.sla, self.profile, self.replicas
        )
        return Split(
            ttft_miss=float(np.mean(ttft > self.sla.ttft_p95_ms)),
            itl_miss=float(np.mean(streams & (itl > self.sla.itl_p95_ms))),
            ttft_q_ms=float(np.percentile(ttft, q)),
            itl_q_ms=float(np.percentile(itl[streams], q)),
            model_ttft_q_ms=None if op is None else op.ttft_q_ms,
            model_itl_q_ms=None if op is None else op.itl_q_ms,
        )


def _setup(
    tr: MatrixTrace, replicas: int, profile: Profile | None = None, router: str = ROUTERS[0]
) -> _Setup:
    profile = profile or load_profile()
    base = load_trace(
        tr.spec, rate_multiplier=tr.rate_scale, duration_s=tr.duration_s, seed=TRACE_SEED
    )
    sla = SLA(ttft_p95_ms=tr.ttft_ms, itl_p95_ms=tr.itl_ms)
    knobs = governor_knobs_for(base, Scenario(trace=base, sla=sla, profile=profile))
    lengths = trace_lengths(base)
    model = capacity_rps(knobs, lengths, sla, profile, 1.0, replicas)
    duration = max(DURATION_S, MIN_REQUESTS / (model * replicas))
    return _Setup(base, lengths, sla, profile, knobs, replicas, model, duration, router)


def measure(
    tr: MatrixTrace, replicas: int, profile: Profile | None = None, router: str = ROUTERS[0]
) -> Row:
    """The row of one trace's lengths at one fleet size behind `router` (module doc)."""
    s = _setup(tr, replicas, profile, router)
    model = s.model_rps
    lo, hi = LOW * model, HIGH * model
    at_lo = None  # the runs at `lo`, kept for its split
    for _ in range(STEPS):
        mid = (lo + hi) / 2.0
        recs = s.runs(mid)
        if s.attainment_of(recs) >= s.sla.attainment_goal_frac:
            lo, at_lo = mid, recs
        else:
            hi = mid
    sized = model * ScalingPolicy().target_utilization_frac
    return Row(
        trace=tr.key,
        replicas=replicas,
        knobs=s.knobs,
        model_rps=model,
        plant_rps=lo,
        plant_at_top=hi >= HIGH * model * (1.0 - 1e-9),
        sized_rps=sized,
        sized_attainment=s.attainment(sized),
        model_limit=binding_limit(s.knobs, s.lengths, s.sla, s.profile, replicas),
        split=s.split(lo, at_lo),
    )


def _job(args: tuple[MatrixTrace, int, str]) -> Row:
    tr, n, router = args
    return measure(tr, n, router=router)


def check(
    traces: tuple[MatrixTrace, ...] = TRACES,
    sizes: tuple[int, ...] = SIZES,
    workers: int = 2,
    router: str = ROUTERS[0],
) -> list[Row]:
    """Every (trace, size) row, in that order, measured in `workers` processes behind
    `router`."""
    jobs = [(tr, n, router) for tr in traces for n in sizes]
    with process_pool(workers) as pool:
        return list(pool.map(_job, jobs))


def report(rows: list[Row], router: str = ROUTERS[0]) -> str:
    """The markdown of `docs/capacity.md` (rows measured behind the default router), or
    of the same table behind another `router` (its title says which)."""
    util = ScalingPolicy().target_utilization_frac
    title = "# The capacity model against the plant"
    if router != ROUTERS[0]:
        title += f" behind {router} routing (`--router {router}`; not committed)"
    lines = [
        title,
        "",
        "Regenerate with `python -m simulator.capacity_check --out docs/capacity.md` "
        "(or `governor calibrate --capacity`); how each number is measured is in "
        "`simulator/capacity_check.py`.",
        "",
        "Per-replica arrival rate (req/s) at which N warm replicas meet the SLA for 99 % of "
        "the requests: the model's (controller.capacity) and the plant's (Poisson "
        "arrivals with the trace's lengths, the knobs the governor picks for them). "
        f"The decider sizes for the model x {util:g}; the last column is the plant's "
        f"attainment at that rate, which misses the goal where the model is more than "
        f"{1 / util:.2f}x the plant. The model's limit is the target its rate is bound by "
        "(controller.capacity.binding_limit): ITL, TTFT, or saturation.",
        "",
        "| trace | replicas | knobs (seqs / tokens) | model | model's limit | plant "
        f"| model / plant | plant at model x {util:g} |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        top = ">= " if r.plant_at_top else ""
        flag = " (misses)" if r.sized_attainment < 0.99 else ""
        lines.append(
            f"| {r.trace} | {r.replicas} | {r.knobs.max_num_seqs} / "
            f"{r.knobs.max_num_batched_tokens} | {r.model_rps:.3g} | {r.model_limit} | "
            f"{top}{r.plant_rps:.3g} | "
            f"{r.ratio:.2f} | {100 * r.sized_attainment:.2f} %{flag} |"
        )
    worst = max(rows, key=lambda r: r.ratio)
    best = min(rows, key=lambda r: r.ratio)
    lines += [
        "",
        f"Most optimistic: {worst.trace} on {worst.replicas} ({worst.ratio:.2f}x the plant). "
        f"Most pessimistic: {best.trace} on {best.replicas} ({best.ratio:.2f}x).",
        "",
        *_split_table([r for r in rows if r.split is not None]),
    ]
    return "\n".join(lines)


def _split_table(rows: list[Row]) -> list[str]:
    """The second table of `report`: each row's `Split` at the plant's rate."""
    if not rows:
        return []
    lines = [
        "Where the model is off: at the plant's rate above, the share of requests over "
        "each target (TTFT, mean ITL), and each target's goal quantile (p99), the model's "
        "against the plant's, ms (model / plant in brackets: under 1 the model is "
        "optimistic on that target, over 1 pessimistic; `-` where the model says a "
        "replica cannot keep up). A rate within the table above can still rest on two "
        "errors that cancel.",
        "",
        "| trace | replicas | plant | misses: TTFT / ITL | TTFT p99: model / plant "
        "| ITL p99: model / plant |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        sp = r.split
        assert sp is not None
        lines.append(
            f"| {r.trace} | {r.replicas} | {r.plant_rps:.3g} | {100 * sp.ttft_miss:.2f} % / "
            f"{100 * sp.itl_miss:.2f} % | {_pair(sp.model_ttft_q_ms, sp.ttft_q_ms)} | "
            f"{_pair(sp.model_itl_q_ms, sp.itl_q_ms)} |"
        )
    return [*lines, ""]


def _pair(model: float | None, plant: float) -> str:
    """`model / plant (ratio)`, ms (`_ms`); `-` for the model when None."""
    if model is None or not math.isfinite(model):
        return f"- / {_ms(plant)}"
    ratio = f" ({model / plant:.2f})" if plant > 0 and math.isfinite(plant) else ""
    return f"{_ms(model)} / {_ms(plant)}{ratio}"


def _ms(v: float) -> str:
    """Milliseconds at 3 significant digits, whole ones from 1,000. Example: 10,612.4 ->
    10,612; 43.82 -> 43.8."""
    return f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.capacity_check",
        description="the decider's capacity model vs the simulated plant, per matrix trace",
    )
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument(
        "--router",
        choices=ROUTERS,
        default=ROUTERS[0],
        help="how the plant spreads requests over the replicas (default: least-outstanding, "
        "what the model's pooling assumes and docs/capacity.md shows)",
    )
    args = parser.parse_args(argv)
    if bad := output_problem("--out", args.out):
        print(f"capacity_check: {bad}", file=sys.stderr)
        return 2
    if args.workers < 1:
        print(f"capacity_check: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    text = report(check(workers=args.workers, router=args.router), args.router)
    print(text)
    if args.out:
        write_output(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
