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
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

from controller.capacity import binding_limit, capacity_rps
from controller.config import SLA, ScalingPolicy
from controller.types import Knobs, Lengths
from estimators.stepmodel import Profile, load_profile
from simulator.fleet import ROUTERS, Fleet
from simulator.matrix import TRACES, MatrixTrace
from simulator.outputs import output_problem, write_output
from simulator.pool import process_pool
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
class Row:
    """One (trace, fleet size): the model's and the plant's 99 % rates (req/s per
    replica), the target that bounds the model's (controller.capacity.binding_limit),
    the knobs, and the plant's attainment at the rate the decider sizes for."""

    trace: str
    replicas: int
    knobs: Knobs
    model_rps: float
    model_limit: str
    plant_rps: float
    plant_at_top: bool
    sized_rps: float
    sized_attainment: float

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

    def attainment(self, per_replica_rps: float) -> float:
        """Mean attainment over SEEDS of the warm fleet at this per-replica rate."""
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
            out.append(float(slo_met(fleet.records(), self.sla).mean()))
        return float(np.mean(out))


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
    for _ in range(STEPS):
        mid = (lo + hi) / 2.0
        if s.attainment(mid) >= s.sla.attainment_goal_frac:
            lo = mid
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
    ]
    return "\n".join(lines)


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
