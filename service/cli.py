"""The `governor` command line. Subcommands are added by the modules that own them."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from controller.config import ConfigError, GovernorConfig, load_config, read_config_text
from controller.targets import TargetsDoc, build_config, config_to_targets
from service import admin_cli
from simulator import cli as simulator_cli

EXIT_USAGE = 2


def _check_targets(cfg: GovernorConfig, path: str) -> TargetsDoc:
    """The targets document at `path` (a store's `targets.yaml`: `models:`, optional
    `paused:`), validated as `governor run` applies stored targets: each entry, then the
    set against `cfg`'s global settings (service.store.parse_targets_yaml, build_config).
    ConfigError (source `path`) naming each problem."""
    from service.store import TargetsInvalidError, parse_targets_yaml

    try:
        text = read_config_text(Path(path))
    except OSError as exc:
        raise ConfigError([f"cannot read file: {exc.strerror or exc}"], path) from None
    except ValueError as exc:
        raise ConfigError([str(exc)], path) from None
    try:
        doc = parse_targets_yaml(text, path, "")
    except TargetsInvalidError as exc:
        raise ConfigError(exc.problems, path) from None
    build_config(cfg, doc, path)
    return doc


def _cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file)
        build_config(cfg, config_to_targets(cfg), args.file)  # profiles load, as at start
        targets = _check_targets(cfg, args.targets) if args.targets else None
    except ConfigError as exc:
        print(f"FAILED: {exc.source}", file=sys.stderr)
        for p in exc.problems:
            print(f"  - {p}", file=sys.stderr)
        return EXIT_USAGE
    print(f"SUCCESS: {args.file} is valid: {len(cfg.models)} model(s)")
    if targets is not None:
        paused = f", paused: {', '.join(targets.paused)}" if targets.paused else ""
        print(f"SUCCESS: {args.targets} is valid with it: {len(targets.models)} model(s){paused}")
    for m in cfg.models:
        s = m.sla
        e2e = f" e2e_p99={s.e2e_p99_ms:g}ms" if s.e2e_p99_ms else ""
        e2e += f" e2e_p95={s.e2e_p95_ms:g}ms" if s.e2e_p95_ms else ""
        print(
            f"  {m.name}  ({m.namespace}/{m.deployment})  ttft_p95={s.ttft_p95_ms:g}ms "
            f"itl_p95={s.itl_p95_ms:g}ms{e2e}  replicas=[{m.replicas.min_replicas},"
            f"{m.replicas.max_replicas}]  batching={m.batching_policy}"
        )
        for r in m.scale_out_rules:
            conds = (" AND " if r.join == "all" else " OR ").join(
                f"{c.signal} {c.op} {c.threshold:g} for {c.for_s:g}s" for c in r.conditions
            )
            a = r.action
            act = f"+{a.add_replicas}" if a.add_replicas is not None else f"min {a.min_replicas}"
            print(f"    rule {r.name}: {conds} -> {act} replica(s)")
    if cfg.prometheus.ingress_rate_query is None:
        for m in cfg.models:
            if m.replicas.min_replicas == 0:
                print(
                    f"  WARNING: {m.name}: min_replicas 0 is held at 1 by `governor run`: "
                    "at zero replicas no engine reports demand; set "
                    "prometheus.ingress_rate_query (the gateway's request rate) to scale "
                    "to and from zero"
                )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="governor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("check-config", help="validate a config file and print its models")
    p.add_argument("file", help="YAML config file")
    p.add_argument(
        "--targets",
        metavar="FILE",
        help="also validate a targets document (the store's targets.yaml: models:, "
        "optional paused:) with the file's global settings, as `governor run` applies it",
    )
    p.set_defaults(func=_cmd_check_config)
    admin_cli.register(sub)
    simulator_cli.register(sub)
    return parser


def blank_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The arguments of the chosen (sub)command given as an empty or blank string, each
    named as its flag (or positional name). Every path, name, address and trace of the
    command line is text that means something; `--json ''` or `--targets ''` had read as
    "not given" and silently skipped the output or the check they ask for. A default
    (from the environment, say) is the command's own to judge."""
    blank: list[str] = []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if isinstance(action, argparse._SubParsersAction):
            # `target set` names itself "target set" in `command` (set_defaults)
            chosen = action.choices.get(str(value).split(" ")[0])
            if chosen is not None:
                blank += blank_arguments(chosen, args)
            continue
        values = value if isinstance(value, list) else [value]
        if value != action.default and any(isinstance(v, str) and not v.strip() for v in values):
            blank.append(action.option_strings[0] if action.option_strings else action.dest)
    return blank


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if blank := blank_arguments(parser, args):
        for name in blank:
            print(
                f"governor {args.command}: {name}: empty (give a value, or leave it out)",
                file=sys.stderr,
            )
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (`governor status | head -2`): no traceback, and the
        # interpreter's own flush of stdout at exit must not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except MemoryError:
        print(f"governor {args.command}: out of memory", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
