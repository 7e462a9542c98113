"""Argument types of the simulator's command line, and the plant flags `governor
simulate` and `governor demo` share (simulator.plant: what the simulated engines do,
apart from what the decider believes)."""

from __future__ import annotations

import argparse
import math

from simulator.fleet import ROLLOUTS, ROUTERS
from simulator.plant import Plant
from simulator.scenario import DEFAULT_SCRAPE_INTERVAL_S


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
    )
