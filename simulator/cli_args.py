"""Argument types of the simulator's command line, the plant flags `governor
simulate` and `governor demo` share (simulator.plant: what the simulated engines do,
apart from what the decider believes), the flags that give the governor an
operator's own scaling policy (`--policy-from FILE`), and what both commands make of
their flags before a run: the trace (`trace_of`) and the scenario, its governor config
validated (`scenario_from_args`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from controller.config import (
    SLA,
    ConfigError,
    ScalingPolicy,
    format_validation_error,
    load_config,
    scrape_problems,
)
from simulator.fleet import ROLLOUTS, ROUTERS
from simulator.plant import Plant
from simulator.scenario import DEFAULT_SCRAPE_INTERVAL_S, Scenario, policy_changes
from simulator.traces import Trace, load_trace


def positive(kind: type, name: str):
    """An argparse type: `kind` (int or float) parsed from the text, finite and > 0; the
    error names the flag `name`."""

    def conv(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not (isinstance(v, int) or math.isfinite(v)) or v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be > 0, got {text!r}")
        return v

    return conv


def below_one(name: str):
    """An argparse type: a float in [0, 1); the error names the flag `name`."""
    at_least_zero = non_negative(name)

    def conv(text: str) -> float:
        v = at_least_zero(text)
        if v >= 1.0:
            raise argparse.ArgumentTypeError(f"{name} must be below 1, got {text!r}")
        return v

    return conv


def non_negative(name: str):
    """An argparse type: a finite float >= 0; the error names the flag `name`."""

    def conv(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(v) or v < 0:
            raise argparse.ArgumentTypeError(f"{name} must be >= 0, got {text!r}")
        return v

    return conv


def speed_change(text: str) -> tuple[float, float]:
    """An argparse type for --plant-speed-change: 'AT_S:F', AT_S >= 0 and F > 0."""
    at, sep, factor = text.partition(":")
    try:
        pair = (float(at), float(factor)) if sep else None
    except ValueError:
        pair = None
    if pair is None or not all(math.isfinite(v) for v in pair) or pair[0] < 0 or pair[1] <= 0:
        raise argparse.ArgumentTypeError(
            f"--plant-speed-change must be AT_S:F with AT_S >= 0 and F > 0, got {text!r}"
        )
    return pair


def add_plant_args(p: argparse.ArgumentParser) -> None:
    """The plant and metric-source flags shared by `simulate` and `demo`."""
    p.add_argument(
        "--plant-speed",
        type=positive(float, "--plant-speed"),
        default=1.0,
        help="simulated step times x F (1.3 = GPU 30%% slower than the profile the "
        "decider believes; the decider keeps its profile)",
    )
    p.add_argument(
        "--plant-speed-change",
        type=speed_change,
        default=None,
        metavar="AT_S:F",
        help="from AT_S seconds on, the simulated step times are F x the profile's (a GPU "
        "that throttles or a node pool swapped mid-run; before, --plant-speed's); the "
        "decider is not told",
    )
    p.add_argument(
        "--plant-overhead-ms",
        type=non_negative("--plant-overhead-ms"),
        default=None,
        help="per-request server overhead before the first token, ms "
        "(default: the profile's calibrated value)",
    )
    p.add_argument(
        "--plant-cold-start-x",
        type=positive(float, "--plant-cold-start-x"),
        default=1.0,
        help="actual cold start = X x the configured one",
    )
    p.add_argument(
        "--live-knobs",
        action="store_true",
        help="the engines follow knob changes live (the scheduler plugin, the chart's "
        "default) instead of at start only; the governor is told so (policy.knobs_live)",
    )
    p.add_argument(
        "--plant-router",
        choices=ROUTERS,
        default=ROUTERS[0],
        help="how the cluster spreads requests over the replicas: a gateway's "
        "least-outstanding balancing (default) or kube-proxy's random endpoint; the "
        "decider is not told",
    )
    p.add_argument(
        "--plant-rollout",
        choices=ROLLOUTS,
        default=ROLLOUTS[0],
        help="how a knob roll-out replaces the replicas (engines without live knobs): "
        "'surge' (default) as a Deployment with maxSurge 1, maxUnavailable 0, or "
        "'unavailable' with maxSurge 0, maxUnavailable 1 (one replica fewer ready during "
        "each restart; a roll-out waits, as the roll-out actuator holds it, until the rest "
        "serve the load); the decider is not told the strategy",
    )
    p.add_argument(
        "--plant-prefix-hit",
        type=below_one("--plant-prefix-hit"),
        default=0.0,
        metavar="F",
        help="the share of each prompt the engines find in their prefix cache, in [0, 1) "
        "(whole 16-token blocks, not computed; default 0); the decider reads it from the "
        "engines' prefix-cache counters",
    )
    p.add_argument(
        "--scrape-interval-s",
        type=positive(float, "--scrape-interval-s"),
        default=DEFAULT_SCRAPE_INTERVAL_S,
        help="resolution of the simulated metric source, seconds",
    )


def plant_from_args(args: argparse.Namespace) -> Plant:
    """The Plant the flags of `add_plant_args` describe."""
    return Plant(
        speed=args.plant_speed,
        overhead_ms=args.plant_overhead_ms,
        cold_start_factor=args.plant_cold_start_x,
        live_knobs=args.live_knobs,
        router=args.plant_router,
        rollout=args.plant_rollout,
        prefix_hit_frac=args.plant_prefix_hit,
        speed_change=args.plant_speed_change,
    )


def add_policy_args(p: argparse.ArgumentParser) -> None:
    """`--policy-from FILE` and `--policy-model NAME`: the governor's scaling policy
    from an operator's config file (`policy_from_args`)."""
    p.add_argument(
        "--policy-from",
        default=None,
        metavar="FILE",
        help="run the governor with the scaling policy of FILE, a config file of `governor "
        "run` (validated as it validates it; environment overrides not applied): its "
        "global `policy`, with the overrides of the model --policy-model names (or of its "
        "only model). Only the policy is taken: the SLA, replica bounds, plant and scrape "
        "interval stay the flags' (or, in a matrix, each cell's). Default: the built-in "
        "defaults",
    )
    p.add_argument(
        "--policy-model",
        default=None,
        metavar="NAME",
        help="with --policy-from: the model of FILE whose per-model policy overrides apply "
        "(needed when FILE has several)",
    )


def policy_from_args(
    args: argparse.Namespace, scrapes_s: Iterable[float], live_knobs: bool | None = None
) -> ScalingPolicy:
    """The governor's scaling policy `--policy-from` / `--policy-model` ask for (the
    defaults without a file). `scrapes_s`: the metric source's scrape intervals it will
    run under (s; its rate window and staleness limit must span two of each); `live_knobs`:
    whether the simulated engines follow knobs live (None: each run says, as the matrix's
    cells do), which a file that sets `knobs_live` itself must agree with.

    Raises ValueError with every problem, each naming the flag and what is wrong:
    an unreadable or invalid file, a model it lacks, several models and none named."""
    path, name = args.policy_from, args.policy_model
    if path is None:
        if name is not None:
            raise ValueError(f"--policy-model {name}: read only with --policy-from")
        policy = ScalingPolicy()
        if problems := [
            f"--scrape-interval-s {s:g} is too slow for the governor's default policy: {p}"
            for s in sorted(set(scrapes_s))
            for p in scrape_problems(policy, s)
        ]:
            raise ValueError("; ".join(problems))
        return policy
    try:
        cfg = load_config(path, environ={})
    except ConfigError as exc:
        raise ValueError(f"--policy-from {exc}") from None
    names = [m.name for m in cfg.models]
    if name is None and len(names) > 1:
        raise ValueError(
            f"--policy-from {path} has {len(names)} models ({', '.join(names)}): name the one "
            "whose policy overrides apply with --policy-model"
        )
    try:
        model = cfg.model(name if name is not None else names[0])
    except KeyError:
        raise ValueError(
            f"--policy-model {name}: {path} has no such model (it has {', '.join(names)})"
        ) from None
    policy = cfg.policy_for(model)
    problems = [
        f"--policy-from {path} with a {s:g} s scrape: {p}"
        for s in sorted(set(scrapes_s))
        for p in scrape_problems(policy, s)
    ]
    knobs_set = "knobs_live" in cfg.policy.model_fields_set or "knobs_live" in model.policy
    if live_knobs is not None and knobs_set and policy.knobs_live != live_knobs:
        problems.append(
            f"--policy-from {path} sets policy.knobs_live: {str(policy.knobs_live).lower()}, "
            f"but the simulated engines {'do' if live_knobs else 'do not'} follow knobs live "
            f"({'drop' if live_knobs else 'give'} --live-knobs, or remove the field)"
        )
    if problems:
        raise ValueError("; ".join(problems))
    return policy


def policy_or_say(
    args: argparse.Namespace, scrapes_s: list[float], live_knobs: bool | None, command: str
) -> ScalingPolicy | None:
    """The governor's policy (`policy_from_args`), or None after printing why not as
    `governor COMMAND: ...`."""
    try:
        return policy_from_args(args, scrapes_s, live_knobs)
    except ValueError as exc:
        print(f"governor {command}: {exc}", file=sys.stderr)
        return None


CONFIG_FLAGS = {
    "ttft_p95_ms": "--sla-ttft-p95-ms",
    "itl_p95_ms": "--sla-itl-p95-ms",
    "min_replicas": "--min-replicas",
    "max_replicas": "--max-replicas",
    "scrape_interval_s": "--scrape-interval-s",
}
"""The flag that sets each field of the governor's config a scenario builds."""


def scenario_from_args(
    args: argparse.Namespace, command: str, sla_ms: tuple[float, float], **fields: Any
) -> tuple[Scenario, ScalingPolicy] | None:
    """The scenario `governor COMMAND`'s flags describe and the governor's policy: the
    policy (`policy_or_say`), the trace (`trace_of`), the plant, start, seed and scrape
    of the shared flags, the SLA `sla_ms` (TTFT p95, ITL p95, ms) and the command's own
    Scenario `fields`; its governor config validated as `governor run` validates a file
    (the SLA's and the replica bounds' limits). None after printing each problem as
    `governor COMMAND: --flag: ...`."""
    policy = policy_or_say(args, [args.scrape_interval_s], args.live_knobs, command)
    trace = None if policy is None else trace_of(args, command)
    if policy is None or trace is None:
        return None
    try:
        sc = Scenario(
            trace=trace,
            sla=SLA(ttft_p95_ms=sla_ms[0], itl_p95_ms=sla_ms[1]),
            start_replicas=args.start_replicas,
            seed=args.seed,
            scrape_interval_s=args.scrape_interval_s,
            governor_policy=policy,
            plant=plant_from_args(args),
            **fields,
        )
        sc.governor_config()
    except ValidationError as exc:
        for line in format_validation_error(exc):
            field, sep, rest = line.partition(": ")
            flag = CONFIG_FLAGS.get(field.rsplit(".", 1)[-1]) if sep else None
            print(f"governor {command}: {f'{flag}: {rest}' if flag else line}", file=sys.stderr)
        return None
    return sc, policy


def trace_of(args: argparse.Namespace, command: str) -> Trace | None:
    """The trace `args` ask for (--trace, --rate-scale, --duration, --seed); None after
    printing why it cannot be had (a bad spec, no memory for the scaled trace, or no
    request in it: nothing to replay and no oracle)."""
    try:
        trace = load_trace(
            args.trace, rate_multiplier=args.rate_scale, duration_s=args.duration, seed=args.seed
        )
    except (OSError, ValueError) as exc:
        print(f"governor {command}: --trace {args.trace}: {exc}", file=sys.stderr)
    except MemoryError:
        print(
            f"governor {command}: --trace {args.trace} at --rate-scale {args.rate_scale:g}: out "
            "of memory building the scaled trace (it is scaled whole before --duration cuts "
            "it): lower --rate-scale",
            file=sys.stderr,
        )
    else:
        if len(trace):
            return trace
        print(f"governor {command}: --trace {args.trace}: no requests", file=sys.stderr)
    return None


def say_policy(args: argparse.Namespace, policy: ScalingPolicy) -> None:
    """Under a result table: the policy fields the governor ran with off the defaults."""
    if args.policy_from is None:
        return
    changed = policy_changes(policy)
    fields = ", ".join(f"{k}={json.dumps(v)}" for k, v in changed.items()) or "none"
    print(f"governor policy from {args.policy_from}: fields off the defaults: {fields}")
