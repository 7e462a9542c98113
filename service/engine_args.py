"""`governor engine-args`: the vLLM batching flags for an engine's start command.

It asks the governor's read-only BatchingService for the model's knobs and prints them
as vLLM flags (`--live`: the ceilings, the scheduler plugin, the middleware and the
governor's address instead). It exits 0 whatever the governor does (an engine must
never fail to start because of the governor) and falls back to the configured default
knobs; only a usage error of its own flags exits 2 (nothing printed on stdout), the
fallback knobs included (`fallback_problems`), checked at every start. Registered by
`service.admin_cli`, whose connection options (server, deadline, TLS) it shares.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

import grpc

from controller.config import ConfigError, KnobBounds, load_config
from controller.types import Knobs, live_engine_args
from service.admin_cli import (
    EXIT_OK,
    EXIT_USAGE,
    connection_problem,
    open_channel,
    positive_count,
)

ENGINE_ARGS_TIMEOUT_S = 3.0


def _warn(message: str) -> None:
    print(f"governor engine-args: warning: {message}", file=sys.stderr)


def _config_knobs(args: argparse.Namespace) -> KnobBounds | None:
    """The knob bounds and defaults of `--model` in `--config`: None without --config,
    and None with a warning when the file cannot be used or does not name the model."""
    if not args.config:
        return None
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        _warn(str(exc))
        return None
    try:
        return cfg.model(args.model).knobs
    except KeyError:
        names = ", ".join(m.name for m in cfg.models)
        _warn(
            f"{args.config}: model {args.model!r} is not in it (its models: {names}); "
            "its knob defaults and bounds are not used"
        )
        return None


LIVE_ONLY = (
    "plugin_dir",
    "default_max_num_seqs_ceiling",
    "default_max_num_batched_tokens_ceiling",
    "max_num_seqs_ceiling",
    "max_num_batched_tokens_ceiling",
)
"""The `engine-args` flags (argparse dests) only `--live` reads."""


def fallback_problems(args: argparse.Namespace, kb: KnobBounds | None) -> list[str]:
    """What makes the fallback knobs unusable: a --default-* flag outside the model's
    knob bounds (when --config names the model; without it the bounds are unknown: a
    model may raise them up to INT32_MAX, and the chart passes a model's defaults
    without its bounds), or a token budget below max_num_seqs, which vLLM refuses (the
    two flags, or one flag against the default it does not override; with --live, a
    pair of ceiling flags), and flags only --live reads given without it. Empty when the
    flags are sound or not given."""
    seqs, tokens = args.default_max_num_seqs, args.default_max_num_batched_tokens
    of = f"of {args.model!r} in {args.config}"
    problems = []
    if kb is not None:
        for flag, value, lo, hi in (
            ("--default-max-num-seqs", seqs, kb.max_num_seqs_min, kb.max_num_seqs_max),
            (
                "--default-max-num-batched-tokens",
                tokens,
                kb.max_num_batched_tokens_min,
                kb.max_num_batched_tokens_max,
            ),
        ):
            if value is not None and not lo <= value <= hi:
                problems.append(f"{flag} {value} is outside [{lo}, {hi}], the knob bounds {of}")

    def default(what: str, value: int) -> str:
        return (
            f"the built-in default {what} {value}"
            if kb is None
            else f"the default {what} {value} {of}"
        )

    base = kb or KnobBounds()
    s = base.default_max_num_seqs if seqs is None else seqs
    t = base.default_max_num_batched_tokens if tokens is None else tokens
    if (seqs is not None or tokens is not None) and t < s:
        hint = ""
        if seqs is None:
            pair = f"--default-max-num-batched-tokens {t} is below {default('max_num_seqs', s)}"
        elif tokens is None:
            pair = f"--default-max-num-seqs {s} is above {default('token budget', t)}"
            hint = f"; give --default-max-num-batched-tokens >= {s} too"
        else:
            pair = f"--default-max-num-batched-tokens {t} is below --default-max-num-seqs {s}"
        problems.append(f"{pair}: vLLM refuses a token budget below max_num_seqs{hint}")
    live_only = [
        "--" + dest.replace("_", "-")
        for dest in LIVE_ONLY
        if getattr(args, dest, None) not in (None, False)
    ]
    if live_only and not args.live:
        problems.append(
            f"{', '.join(live_only)}: read only with --live (an engine that follows the "
            "governor live); without it they would be ignored"
        )
    for kind in ("", "default-"):  # --live: a pair of ceiling flags given together
        cs = getattr(args, f"{kind.replace('-', '_')}max_num_seqs_ceiling", None)
        ct = getattr(args, f"{kind.replace('-', '_')}max_num_batched_tokens_ceiling", None)
        if cs is not None and ct is not None and ct < cs:
            problems.append(
                f"--{kind}max-num-batched-tokens-ceiling {ct} is below "
                f"--{kind}max-num-seqs-ceiling {cs}: vLLM refuses a token budget below "
                "max_num_seqs"
            )
    return problems


def _default_knobs(args: argparse.Namespace, kb: KnobBounds | None) -> tuple[Knobs, str]:
    """The configured defaults: the flags, else `kb` (--config's model), else KnobBounds'
    (checked first by `fallback_problems`)."""
    base = kb or KnobBounds()
    seqs, tokens = base.default_max_num_seqs, base.default_max_num_batched_tokens
    where = "built-in defaults" if kb is None else f"defaults of {args.model!r} in {args.config}"
    if args.default_max_num_seqs is not None:
        seqs, where = args.default_max_num_seqs, "command-line defaults"
    if args.default_max_num_batched_tokens is not None:
        tokens, where = args.default_max_num_batched_tokens, "command-line defaults"
    return Knobs(seqs, tokens), where


def _ceiling_knobs(args: argparse.Namespace, resp: Any, kb: KnobBounds | None) -> tuple[Knobs, str]:
    """The ceilings a live engine starts with: the override flags, else the server's
    answer, else the --default-*-ceiling flags, else `kb` (--config's model's knob
    bounds), else KnobBounds' built-in maxima."""
    base = KnobBounds()
    seqs, tokens = base.max_num_seqs_max, base.max_num_batched_tokens_max
    where = "built-in knob bounds"
    served = (resp.max_num_seqs_ceiling, resp.max_num_batched_tokens_ceiling) if resp else (0, 0)
    if min(served) > 0:
        seqs, tokens = served
        where = f"bounds served by {args.server}"
    elif kb is not None:
        seqs, tokens = kb.max_num_seqs_max, kb.max_num_batched_tokens_max
        where = f"bounds of {args.model!r} in {args.config}"
    if min(served) <= 0 and args.default_max_num_seqs_ceiling is not None:
        seqs, where = args.default_max_num_seqs_ceiling, "command-line default ceilings"
    if min(served) <= 0 and args.default_max_num_batched_tokens_ceiling is not None:
        tokens, where = args.default_max_num_batched_tokens_ceiling, "command-line default ceilings"
    if args.max_num_seqs_ceiling is not None:
        seqs, where = args.max_num_seqs_ceiling, "command-line ceilings"
    if args.max_num_batched_tokens_ceiling is not None:
        tokens, where = args.max_num_batched_tokens_ceiling, "command-line ceilings"
    if tokens < seqs:  # from two sources (a flag and the server's or the config's bounds)
        print(
            f"governor engine-args: warning: token ceiling {tokens} is below the "
            f"max_num_seqs ceiling {seqs} (vLLM refuses that); raised to {seqs}",
            file=sys.stderr,
        )
    return Knobs(seqs, max(tokens, seqs)), where


def _copy_plugin(target: str) -> None:
    """Copy the engine plugin's packages (governor_engine, governor_api: pure Python; they
    need only grpcio and protobuf, which vLLM ships) into `target`, for an engine
    container that puts `target` on its PYTHONPATH. A failure is a warning: the engine
    then starts without the plugin's packages and vLLM names the missing module."""
    import importlib
    import shutil
    from pathlib import Path

    try:
        for name in ("governor_engine", "governor_api"):
            src = Path(importlib.import_module(name).__file__ or "").parent
            dst = Path(target) / name
            tmp = Path(target) / f".{name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            shutil.rmtree(dst, ignore_errors=True)
            tmp.rename(dst)
    except Exception as exc:
        print(
            f"governor engine-args: warning: plugin not copied to {target}: {exc}",
            file=sys.stderr,
        )


def _cmd_engine_args(args: argparse.Namespace) -> int:
    """Print the vLLM flags; exit 0 whatever the governor does (fall back to the
    defaults), 2 with nothing printed when the fallback flags are unusable (checked
    first, so a wrong flag shows at every start, not only once the governor is down)."""
    from governor_api import governor_v1_pb2 as pb
    from governor_api import governor_v1_pb2_grpc

    if problem := connection_problem(args):
        print(f"governor engine-args: {problem}", file=sys.stderr)
        return EXIT_USAGE
    kb = _config_knobs(args)
    if problems := fallback_problems(args, kb):
        for problem in problems:
            print(f"governor engine-args: {problem}", file=sys.stderr)
        return EXIT_USAGE
    knobs: Knobs | None = None
    resp: Any = None
    try:
        with open_channel(args) as channel:
            stub = governor_v1_pb2_grpc.BatchingServiceStub(channel)
            resp = stub.GetBatchingConfig(
                pb.GetBatchingConfigRequest(model=args.model, engine_id=args.engine_id),
                timeout=args.timeout_s,
            )
        if resp.max_num_seqs > 0 and resp.max_num_batched_tokens > 0:
            knobs = Knobs(resp.max_num_seqs, resp.max_num_batched_tokens)
        else:
            raise ValueError(f"server sent non-positive knobs: {resp}")
    except Exception as exc:  # anything at all: fall back, never fail the engine
        resp = None
        knobs, where = _default_knobs(args, kb)
        reason = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else exc
        print(
            f"governor engine-args: warning: no answer from {args.server} for model "
            f"{args.model!r} ({reason}); using {where}",
            file=sys.stderr,
        )
    if args.live:
        if args.plugin_dir:
            _copy_plugin(args.plugin_dir)
        ceiling, where = _ceiling_knobs(args, resp, kb)
        if resp is None:
            print(f"governor engine-args: ceilings from {where}", file=sys.stderr)
        print(" ".join(live_engine_args(ceiling, args.server, args.model)))
    else:
        print(" ".join(knobs.engine_args()))
    return EXIT_OK


def add_engine_args(sub: Any, connection: argparse.ArgumentParser) -> None:
    """Add `engine-args` with the `connection` options (no admin token, no output format:
    the engines' API is read-only and the output is the engine's flags)."""
    p = sub.add_parser(
        "engine-args",
        parents=[connection],
        help="print vLLM batching flags for an engine's start command (exit 0 unless its "
        "own flags are invalid)",
    )
    p.add_argument("--model", required=True)
    p.add_argument("--engine-id", default=os.environ.get("POD_NAME") or socket.gethostname())
    p.add_argument("--config", help="config file whose model defaults to fall back to")
    p.add_argument(
        "--default-max-num-seqs",
        type=positive_count,
        help="the fallback max_num_seqs (within --config's bounds for the model, if given)",
    )
    p.add_argument(
        "--default-max-num-batched-tokens",
        type=positive_count,
        help="the fallback token budget: at least the fallback max_num_seqs (vLLM refuses less)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="flags of an engine that follows the governor live: the ceilings (the "
        "largest knobs the governor may choose), the governor_engine scheduler plugin and "
        "X-Latency-Dist middleware, and the governor's address",
    )
    p.add_argument(
        "--plugin-dir",
        metavar="DIR",
        help="with --live: also copy the plugin's Python packages here (put DIR on the "
        "engine's PYTHONPATH)",
    )
    p.add_argument(
        "--default-max-num-seqs-ceiling",
        type=positive_count,
        help="with --live: the ceiling when the governor cannot be reached",
    )
    p.add_argument(
        "--default-max-num-batched-tokens-ceiling",
        type=positive_count,
        help="with --live: the ceiling when the governor cannot be reached",
    )
    p.add_argument("--max-num-seqs-ceiling", type=positive_count, help="with --live: override")
    p.add_argument(
        "--max-num-batched-tokens-ceiling", type=positive_count, help="with --live: override"
    )
    p.set_defaults(func=_cmd_engine_args, timeout_s=ENGINE_ARGS_TIMEOUT_S)
