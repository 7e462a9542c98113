"""`governor simulate` and `governor demo`: the fleet simulator's command line.

Registered into the `governor` CLI by `service.cli` (the service sits above the
simulator in the layering).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from controller.config import ScalingPolicy
from simulator.autoscalers import POLICY_NAMES, Autoscaler, Governor
from simulator.calibrate import add_calibrate
from simulator.cli_args import (
    add_plant_args,
    add_policy_args,
    non_negative,
    policy_or_say,
    positive,
    say_policy,
    scenario_from_args,
)
from simulator.oracle import scenario_oracle
from simulator.outputs import output_problem, write_output
from simulator.report import decision_record, document, plot, table
from simulator.scenario import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    PolicyResult,
    Scenario,
    run_policy,
    slo_met,
)
from simulator.traces import MAX_RATE_MULTIPLIER

EXIT_USAGE = 2


def _seed(text: str) -> int:
    """--seed: a whole number >= 0 (the trace generators and the fleet's random
    generators refuse a negative one; it was blamed on --trace, or taken for azure
    traces)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seed must be a whole number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"--seed must be >= 0, got {text!r}")
    return v


def _rate_scale(name: str):
    """A rate multiplier in (0, MAX_RATE_MULTIPLIER] (simulator.traces says why)."""
    above_zero = positive(float, name)

    def conv(text: str) -> float:
        v = above_zero(text)
        if v > MAX_RATE_MULTIPLIER:
            raise argparse.ArgumentTypeError(
                f"{name} must be <= {MAX_RATE_MULTIPLIER:g}, got {text!r}: the scaled trace is "
                "built whole in memory (a higher rate: a synthetic trace's own rate parameters)"
            )
        return v

    return conv


RATE_SCALE_HELP = (
    f"(0, {MAX_RATE_MULTIPLIER:g}]: the trace is scaled whole in memory before --duration "
    "cuts it (x100 makes azure:conv 1.9 million requests)"
)


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICY_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(bad) or '(none)'}; choose from {', '.join(POLICY_NAMES)}"
        )
    return names


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, or forced)."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label, self.enabled, self.start = label, enabled, time.perf_counter()

    def __call__(self, frac: float) -> None:
        if not self.enabled:
            return
        width = 30
        done = int(width * min(1.0, frac))
        el = time.perf_counter() - self.start
        sys.stderr.write(
            f"\r{self.label:<10} [{'#' * done}{'.' * (width - done)}] {100 * frac:5.1f}% {el:5.1f}s"
        )
        if frac >= 1.0:
            sys.stderr.write("\n")
        sys.stderr.flush()


def add_simulate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="replay a trace on the simulated fleet under several autoscalers"
    )
    p.add_argument(
        "--trace", default="azure:conv", help="trace file, azure:conv|azure:code, or synthetic:NAME"
    )
    p.add_argument(
        "--rate-scale",
        type=_rate_scale("--rate-scale"),
        default=1.0,
        help=f"rate multiplier K: K times the requests over the same span, in {RATE_SCALE_HELP}",
    )
    p.add_argument(
        "--policies",
        type=_policies,
        default=list(POLICY_NAMES),
        help=f"comma-separated, from {','.join(POLICY_NAMES)}",
    )
    p.add_argument(
        "--duration",
        type=positive(float, "--duration"),
        default=None,
        help="seconds of trace to replay",
    )
    p.add_argument("--sla-ttft-p95-ms", type=positive(float, "--sla-ttft-p95-ms"), default=500.0)
    p.add_argument("--sla-itl-p95-ms", type=positive(float, "--sla-itl-p95-ms"), default=50.0)
    p.add_argument("--seed", type=_seed, default=0, help="random seed, >= 0")
    p.add_argument(
        "--start-replicas",
        type=positive(int, "--start-replicas"),
        default=None,
        help="replicas serving at t = 0 (default: the model's min replicas)",
    )
    p.add_argument(
        "--min-replicas", type=positive(int, "--min-replicas"), default=DEFAULT_MIN_REPLICAS
    )
    p.add_argument(
        "--max-replicas", type=positive(int, "--max-replicas"), default=DEFAULT_MAX_REPLICAS
    )
    add_plant_args(p)
    p.add_argument(
        "--static-replicas",
        type=positive(int, "--static-replicas"),
        default=None,
        help="replicas of the static policy (default: the oracle's peak)",
    )
    p.add_argument("--hpa-sync-s", type=positive(float, "--hpa-sync-s"), default=15.0)
    p.add_argument("--no-oracle", action="store_true", help="skip the oracle (faster)")
    p.add_argument("--json", dest="json_out", default=None, help="write the results JSON here")
    p.add_argument("--plot", dest="plot_out", default=None, help="write the PNG plot here")
    p.add_argument(
        "--decisions",
        dest="decisions_out",
        default=None,
        help="write the governor's decision at each tick here, one JSON object a line "
        "(replicas, knobs, the numbers behind them, each stage's reason, the explain text)",
    )
    add_policy_args(p)
    _add_matrix_args(p)
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    p.set_defaults(func=cmd_simulate, parser=p)


def _add_matrix_args(p: argparse.ArgumentParser) -> None:
    """The flags of `simulate --matrix[-quick|-combined]` (simulator.matrix)."""
    p.add_argument(
        "--matrix",
        action="store_true",
        help="the robustness matrix: every policy over conv x16, code x4, long-context and "
        "diurnal under the default and one-factor-changed conditions (see simulator.matrix)",
    )
    p.add_argument("--matrix-quick", action="store_true", help="a small, fast matrix (smoke run)")
    p.add_argument(
        "--matrix-combined",
        action="store_true",
        help="the matrix's traces under several factors changed at once (slower or faster "
        "plant, 30 s scrape, 2x cold start; simulator.matrix.COMBINED_CONDITIONS)",
    )
    p.add_argument(
        "--matrix-traces",
        default=None,
        help="comma-separated trace keys of the matrix to run (default: all), "
        "e.g. 'long-context,diurnal'",
    )
    p.add_argument(
        "--workers",
        type=positive(int, "--workers"),
        default=2,
        help="worker processes for the matrix cells",
    )
    p.add_argument(
        "--matrix-base",
        default=None,
        metavar="FILE",
        help="with a matrix flag: rerun the governor's cells only and take every other "
        "cell, the oracles and the bounds from FILE, a matrix JSON of this simulator and "
        "spec (for iterating on the decider; no plots)",
    )
    p.add_argument(
        "--matrix-plots",
        default=None,
        metavar="DIR",
        help="with a matrix flag: a PNG per row with a goal missed, written to DIR",
    )


MATRIX_MODES = ("matrix", "matrix_quick", "matrix_combined")
"""The flags (argparse dests) that make `simulate` run a matrix; at most one is given."""


def _matrix_modes(args: argparse.Namespace) -> list[str]:
    """The matrix flags given, as `--flag` names (empty: a single run)."""
    return ["--" + m.replace("_", "-") for m in MATRIX_MODES if getattr(args, m)]


def cmd_matrix(args: argparse.Namespace) -> int:
    """`governor simulate --matrix[-quick|-combined]`: print the table, write the JSON."""
    from simulator.matrix import (
        MatrixSpec,
        MatrixSummary,
        matrix_table,
        rerun_changes,
        rerun_governor,
        run_matrix,
    )
    from simulator.plotdir import check_plots_dir

    kw = {
        "policies": tuple(args.policies),
        "seed": args.seed,
        "max_replicas": args.max_replicas,
        "overhead_ms": args.plant_overhead_ms,
        "workers": args.workers,
        "plots_dir": args.matrix_plots,
    }
    if args.matrix_quick:
        spec = MatrixSpec.quick(**kw)
    elif args.matrix_combined:
        spec = MatrixSpec.combined(**kw)
    else:
        spec = MatrixSpec(**kw)
    if args.matrix_traces:
        keys = [k.strip() for k in args.matrix_traces.split(",") if k.strip()]
        known = [t.key for t in spec.traces]
        bad = [k for k in keys if k not in known]
        if bad or not keys:
            print(
                f"governor simulate: --matrix-traces: unknown {', '.join(bad) or '(none)'}; "
                f"choose from {', '.join(known)}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        spec = dataclasses.replace(spec, traces=tuple(t for t in spec.traces if t.key in keys))
    scrapes = [c.scrape_s for c in spec.conditions]
    if (policy := policy_or_say(args, scrapes, None, "simulate")) is None:
        return EXIT_USAGE
    # Each cell's condition says whether its engines follow knobs live (Scenario).
    policy = policy.model_copy(update={"knobs_live": False})
    spec = dataclasses.replace(spec, governor_policy=policy)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if show else None
    if args.matrix_plots:
        try:  # before any cell runs: a folder of another matrix's plots is refused
            check_plots_dir(args.matrix_plots, spec.traces)
        except ValueError as e:
            print(f"governor simulate: --matrix-plots: {e}", file=sys.stderr)
            return EXIT_USAGE
    if args.matrix_base is None:
        doc = run_matrix(spec, log=log)
    else:
        try:
            if args.matrix_plots:
                raise ValueError("--matrix-plots needs a full run (the base has no oracle series)")
            base = json.loads(Path(args.matrix_base).read_text())
            doc = rerun_governor(spec, base, log)
        except (OSError, ValueError, KeyError) as e:
            print(f"governor simulate: --matrix-base {args.matrix_base}: {e}", file=sys.stderr)
            return EXIT_USAGE
    print(matrix_table(doc))
    say_policy(args, policy)
    s = MatrixSummary.of(doc)
    print(
        "\ncell: SLO attainment / GPU-h x oracle (over the trace) / flaps. "
        f"goals met {s.met}/{s.goals} ({s.out_of_reach} of the misses out of reach: above the "
        f"best possible attainment); wall {doc['wall_s']:.0f} s, cells' CPU {doc['cpu_s']:.0f} s"
    )
    for m in s.missed:
        print(f"missed: {m}")
    if args.matrix_base is not None:
        print(f"\nagainst {args.matrix_base}: " + "\n".join(rerun_changes(base, doc)))
    if args.json_out:
        write_output(args.json_out, json.dumps(doc, indent=2) + "\n")
        print(f"json: {args.json_out}")
    return 0


SINGLE_RUN_FLAGS = (
    "trace",
    "rate_scale",
    "duration",
    "plant_speed",
    "plant_speed_change",
    "plant_cold_start_x",
    "live_knobs",
    "plant_router",
    "plant_rollout",
    "plant_prefix_hit",
    "scrape_interval_s",
    "sla_ttft_p95_ms",
    "sla_itl_p95_ms",
    "start_replicas",
    "min_replicas",
    "static_replicas",
    "hpa_sync_s",
    "no_oracle",
    "plot_out",
    "decisions_out",
)
"""`simulate` flags (argparse dests) of one run that the matrix sets itself, per cell."""
MATRIX_FLAGS = ("matrix_traces", "workers", "matrix_base", "matrix_plots")
"""`simulate` flags only the matrix reads."""


def start_replicas_problem(
    start: int | None, lo: int, hi: int, flags: tuple[str, str] | None = None
) -> str | None:
    """What is wrong with `--start-replicas start` against the replica bounds [lo, hi]
    (`flags`: the flags that set them; None: the scenario's defaults, `demo`'s), the one
    check of `simulate` and `demo`. None when it is within them or not given."""
    if start is None or lo <= start <= hi:
        return None
    if flags is None:
        return f"--start-replicas {start} is outside [{lo}, {hi}], the fleet's replica bounds"
    return f"--start-replicas {start} is outside [{flags[0]} {lo}, {flags[1]} {hi}]"


def usage_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with a `simulate` command line that argparse cannot see: flags
    the chosen mode would ignore (given a value other than their default) and replica
    bounds that contradict each other. Empty when it is sound."""
    parser: argparse.ArgumentParser | None = getattr(args, "parser", None)

    def given(dests: tuple[str, ...]) -> list[str]:
        if parser is None:
            return []
        return [
            "--" + d.removesuffix("_out").replace("_", "-")
            for d in dests
            if getattr(args, d) != parser.get_default(d)
        ]

    problems = []
    modes = _matrix_modes(args)
    if len(modes) > 1:
        problems.append(f"{' and '.join(modes)}: choose one matrix")
    if modes:
        if bad := output_problem("--json", args.json_out):
            problems.append(bad)
        if ignored := given(SINGLE_RUN_FLAGS):
            problems.append(
                f"{', '.join(ignored)}: not read with --matrix (each cell sets its own trace, "
                "plant, scrape and start; see `governor simulate --help`)"
            )
        return problems
    if ignored := given(MATRIX_FLAGS):
        problems.append(
            f"{', '.join(ignored)}: read only with --matrix, --matrix-quick or --matrix-combined"
        )
    lo, hi, start = args.min_replicas, args.max_replicas, args.start_replicas
    problems += [
        x
        for x in (
            output_problem("--json", args.json_out),
            output_problem("--plot", args.plot_out),
            output_problem("--decisions", args.decisions_out),
        )
        if x
    ]
    if args.plot_out and not args.plot_out.lower().endswith(".png"):
        # matplotlib picks the format by the suffix: another one failed after the whole
        # run (`--json` already written), none wrote PATH.png beside the PATH printed
        problems.append(f"--plot {args.plot_out}: name a .png file (the plot is a PNG)")
    if args.decisions_out and Governor.name not in args.policies:
        problems.append(
            f"--decisions: the governor is not among --policies {','.join(args.policies)}"
        )
    if lo > hi:
        problems.append(f"--min-replicas {lo} is above --max-replicas {hi}")
    if bad := start_replicas_problem(start, lo, hi, ("--min-replicas", "--max-replicas")):
        problems.append(bad)
    if args.static_replicas is not None and args.static_replicas > hi:
        problems.append(f"--static-replicas {args.static_replicas} is above --max-replicas {hi}")
    return problems


def cmd_simulate(args: argparse.Namespace) -> int:
    if problems := usage_problems(args):
        for problem in problems:
            print(f"governor simulate: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if _matrix_modes(args):
        return cmd_matrix(args)
    made = scenario_from_args(
        args,
        "simulate",
        (args.sla_ttft_p95_ms, args.sla_itl_p95_ms),
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        static_replicas=args.static_replicas,
        hpa_sync_s=args.hpa_sync_s,
    )
    if made is None:
        return EXIT_USAGE
    sc, policy = made
    show = sys.stderr.isatty() if args.progress is None else args.progress
    orc = None
    if not args.no_oracle:
        t0 = time.perf_counter()
        orc = scenario_oracle(sc)
        if show:
            print(f"oracle     done in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if sc.static_replicas is None and orc is not None:
        sc = Scenario(**{**sc.__dict__, "static_replicas": max(1, max(orc.replicas, default=1))})
    results: dict[str, PolicyResult] = {}
    decisions: list[str] = []
    for name in args.policies:
        on_tick = (
            _decision_lines(decisions) if args.decisions_out and name == Governor.name else None
        )
        results[name] = run_policy(name, sc, progress=Progress(name, show), on_tick=on_tick)
    doc = document(sc, results, orc)
    print(table(doc))
    say_policy(args, policy)
    if args.json_out:
        write_output(args.json_out, json.dumps(doc, indent=2) + "\n")
        print(f"json: {args.json_out}")
    if args.decisions_out:
        write_output(args.decisions_out, "".join(line + "\n" for line in decisions))
        print(f"decisions: {args.decisions_out} ({len(decisions)} ticks)")
    if args.plot_out:
        print(f"plot: {plot(sc, results, orc, args.plot_out)}")
    return 0


def _decision_lines(into: list[str]) -> Callable[[float, Autoscaler], None]:
    """An `on_tick` for `run_policy` that appends each new decision of the policy to
    `into` as a JSON line (`decision_record`); a tick that decides nothing (no data)
    adds none."""

    def on_tick(t_s: float, policy: Autoscaler) -> None:
        d = policy.decision()
        if d is not None and d.at_s == t_s:
            into.append(json.dumps(decision_record(d)))

    return on_tick


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="run the controller on the embedded simulated fleet (live view)"
    )
    p.add_argument("--trace", default="azure:conv")
    p.add_argument(
        "--rate-scale",
        type=_rate_scale("--rate-scale"),
        default=16.0,
        help=f"rate multiplier K (default 16), in {RATE_SCALE_HELP}",
    )
    p.add_argument(
        "--duration",
        type=positive(float, "--duration"),
        default=1200.0,
        help="seconds of trace to replay (default 20 minutes)",
    )
    p.add_argument(
        "--speed",
        type=non_negative("--speed"),
        default=60.0,
        help="simulated seconds per real second in the live view (0 = as fast as possible)",
    )
    p.add_argument(
        "--baselines",
        type=_policies,
        default=["hpa-gpu", "keda", "kpa"],
        help="policies to compare against after the live run",
    )
    p.add_argument(
        "--start-replicas",
        type=positive(int, "--start-replicas"),
        default=6,
        help="replicas serving when the replay starts, within the fleet's bounds "
        f"[{DEFAULT_MIN_REPLICAS}, {DEFAULT_MAX_REPLICAS}] (default 6: what the service runs at "
        "the trace's first minutes, ~70 req/s; the matrix covers starting from one)",
    )
    p.add_argument(
        "--drain-tail-s",
        type=non_negative("--drain-tail-s"),
        default=60.0,
        help="seconds after the last arrival that are scored (its requests finish); the "
        "settling tail after that is shown, not scored",
    )
    p.add_argument("--out", default="out/demo", help="folder for the plot and JSON")
    p.add_argument("--seed", type=_seed, default=0, help="random seed, >= 0")
    p.add_argument(
        "--settle-max-s",
        type=non_negative("--settle-max-s"),
        default=1800.0,
        help="after the trace, run on until the fleet has settled (no scale-down pending), "
        "at most this long",
    )
    add_plant_args(p)
    add_policy_args(p)
    p.set_defaults(func=cmd_demo)


def _live_line(t_s: float, fleet, policy, sc: Scenario) -> str:
    import numpy as np

    rec = fleet.records()
    arr = sc.trace.arrival_s
    lo, hi = np.searchsorted(arr, [t_s - 60.0, t_s])
    load = (hi - lo) / 60.0
    seen = rec.arrival_s <= t_s - 30.0
    done = rec.done & seen
    ok_frac = None
    if seen.any():
        ok_frac = (slo_met(rec, sc.sla) & done).sum() / seen.sum()
    ready, total = fleet.ready_replicas, fleet.total_replicas
    bar = "#" * ready + "+" * (total - ready)
    k = fleet.knobs
    att = "  -   " if ok_frac is None else f"{100 * ok_frac:5.1f}%"
    m, s = divmod(int(t_s), 60)
    return (
        f"t={m:3d}:{s:02d}  load {load:6.1f} req/s  replicas {ready:2d}/{total:<2d} {bar:<14}"
        f" knobs seqs={k.max_num_seqs:<4d} tokens={k.max_num_batched_tokens:<5d}  SLO so far {att}"
    )


def demo_goals(doc: dict) -> str:
    """The smooth-trace goals, met or missed, for the governor's row of `doc`, judged as
    the matrix judges them (simulator.matrix): GPU-hours over the trace's minutes, the
    drain tail left out (the whole run's ratio read 1.36 where the matrix's read 1.16
    on one diurnal slice: the same goal met and missed)."""
    from simulator.matrix import SMOOTH_ATTAINMENT_GOAL, SMOOTH_ORACLE_RATIO_GOAL

    g = doc["policies"]["governor"]
    ratio = g.get("oracle_ratio_trace")
    checks = (
        (
            f"SLO attainment >= {SMOOTH_ATTAINMENT_GOAL:.0%}",
            g["slo_attainment"] >= SMOOTH_ATTAINMENT_GOAL,
        ),
        (
            f"GPU-h <= {SMOOTH_ORACLE_RATIO_GOAL:g}x oracle",
            ratio is not None and ratio <= SMOOTH_ORACLE_RATIO_GOAL,
        ),
        ("0 flaps", g["flaps"] == 0),
    )
    return "goals: " + "; ".join(f"{name} {'met' if ok else 'MISSED'}" for name, ok in checks)


def _demo_scenario(args: argparse.Namespace) -> tuple[Scenario, ScalingPolicy] | None:
    """The demo's scenario and the governor's policy from its flags; None after
    printing what is wrong with them (nothing run or written)."""
    problems = [
        p
        for p in (
            output_problem("--out", args.out, folder=True),
            start_replicas_problem(args.start_replicas, DEFAULT_MIN_REPLICAS, DEFAULT_MAX_REPLICAS),
        )
        if p
    ]
    for problem in problems:
        print(f"governor demo: {problem}", file=sys.stderr)
    if problems:
        return None
    return scenario_from_args(args, "demo", (500.0, 50.0), drain_tail_s=args.drain_tail_s)


def cmd_demo(args: argparse.Namespace) -> int:
    if (made := _demo_scenario(args)) is None:
        return EXIT_USAGE
    sc, policy = made
    trace = sc.trace
    sla = sc.sla
    print(
        f"llm-governor demo: {trace.name}, {len(trace):,} requests over "
        f"{trace.span_s / 60:.0f} min; "
        f"SLA TTFT p95 {sla.ttft_p95_ms:g} ms, ITL p95 {sla.itl_p95_ms:g} ms"
    )
    print(
        "the real control loop decides every 5 s; the HPA applies it every 15 s; "
        "'#' ready replica, '+' starting or draining\n"
    )
    wall0 = time.perf_counter()
    last_print = [-60.0]

    def on_sync(t_s: float, fleet, policy) -> None:
        if t_s - last_print[0] < 60.0:
            return
        last_print[0] = t_s
        if args.speed > 0:
            lag = t_s / args.speed - (time.perf_counter() - wall0)
            if lag > 0:
                time.sleep(lag)  # pacing of the live view only
        print(_live_line(t_s, fleet, policy, sc), flush=True)

    gov = run_policy("governor", sc, on_sync=on_sync, settle_max_s=args.settle_max_s)
    results = {"governor": gov}
    if gov.settled_s is not None:
        m, sec = divmod(int(gov.settled_s), 60)
        print(
            f"settled at t={m}:{sec:02d} with {gov.settled_replicas} replica(s), "
            "no scale-down pending"
        )
    elif args.settle_max_s > 0:
        print(f"not settled {args.settle_max_s:g} s after the scored window")
    print(f"\ncomparing with {', '.join(args.baselines)} and the oracle ...", flush=True)
    orc = scenario_oracle(sc)
    if "static" in args.baselines:
        sc = Scenario(**{**sc.__dict__, "static_replicas": max(1, max(orc.replicas, default=1))})
    for name in args.baselines:
        if name != "governor":
            results[name] = run_policy(name, sc)
    doc = document(sc, results, orc)
    print()
    print(table(doc))
    say_policy(args, policy)
    print(demo_goals(doc))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(doc, indent=2) + "\n")
    png = plot(sc, results, orc, out / "demo.png")
    print(f"\nplot: {png}\njson: {out / 'demo.json'}\n(took {time.perf_counter() - wall0:.0f} s)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    add_simulate(sub)
    add_demo(sub)
    add_calibrate(sub)
