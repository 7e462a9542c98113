"""`governor` subcommands of the service: `run`, `engine-args`, and the operator CLI
(`target set|get|list|delete`, `status`, `explain`, `pause`, `resume`) over the admin
gRPC API. `register(subparsers)` adds them to `service.cli`'s parser.

Exit status: 0 success; 2 bad input (invalid values, unknown model, conflicting change,
missing or refused credentials): a message naming what is wrong, and nothing changed; 1
the server could not be reached or failed.

Credentials: admin commands send `authorization: Bearer <token>` with the token read
from `--token-file` (default `$GOVERNOR_ADMIN_TOKEN_FILE`); the token never appears in
output. TLS: `--tls` (system roots), `--tls-ca-file` (a private CA), and for mTLS
`--tls-cert-file`/`--tls-key-file`; `--tls-server-name` when the address is not the
certificate's name (e.g. through `kubectl port-forward`).

`engine-args` (service.engine_args, sharing the connection options) is the exception:
it exits 0 whatever the governor does (an engine must never fail to start because of the
governor) and falls back to the configured default knobs; only a usage error of its own
flags exits 2 (nothing printed on stdout).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import yaml

from controller.config import INT32_MAX, load_yaml, read_config_text
from controller.types import prefix_hits_line
from service.listeners import parse_listen

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_SERVER = "localhost:50051"
ADMIN_TIMEOUT_S = 10.0
TOKEN_FILE_ENV = "GOVERNOR_ADMIN_TOKEN_FILE"
SERVER_ENV = "GOVERNOR_SERVER"

# gRPC codes that mean "your request is wrong" (exit 2), not "the service failed" (exit 1).
_USER_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
}


class CliError(Exception):
    """A CLI failure with its exit status."""

    def __init__(
        self, message: str, code: int = EXIT_USAGE, status: grpc.StatusCode | None = None
    ) -> None:
        self.message = message
        self.code = code
        self.status = status
        super().__init__(message)


def connection_problem(args: argparse.Namespace) -> str | None:
    """What contradicts itself in the connection options: `--tls-server-name` without
    TLS (it was ignored, and the call, the admin token with it, went in plaintext to a
    caller who believed it checked). None when they are sound."""
    tls = getattr(args, "tls", False) or any(
        getattr(args, flag, None) for flag in ("tls_ca_file", "tls_cert_file", "tls_key_file")
    )
    if getattr(args, "tls_server_name", None) and not tls:
        return (
            "--tls-server-name needs TLS (--tls, --tls-ca-file or $GOVERNOR_TLS_CA_FILE): "
            "without it the call is plaintext and no certificate name is checked"
        )
    return None


def open_channel(args: argparse.Namespace) -> grpc.Channel:
    """A channel to `args.server`: TLS when asked for (see module doc), else plaintext.
    CliError (exit 2) naming a bad TLS file, or a TLS option given without TLS
    (`connection_problem`)."""
    from service.security import SecurityConfigError, channel_credentials

    if problem := connection_problem(args):
        raise CliError(problem)
    ca = getattr(args, "tls_ca_file", None)
    cert = getattr(args, "tls_cert_file", None)
    key = getattr(args, "tls_key_file", None)
    if not (getattr(args, "tls", False) or ca or cert or key):
        return grpc.insecure_channel(args.server)
    try:
        creds = channel_credentials(ca, cert, key)
    except SecurityConfigError as exc:
        raise CliError(str(exc)) from None
    options = []
    if getattr(args, "tls_server_name", None):
        options.append(("grpc.ssl_target_name_override", args.tls_server_name))
    return grpc.secure_channel(args.server, creds, options=options)


def _credentials(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The call metadata carrying the admin token (empty without a token file)."""
    from service.security import SecurityConfigError, read_token

    path = getattr(args, "token_file", None)
    if not path:
        return ()
    try:
        token = read_token(path)
    except SecurityConfigError as exc:
        raise CliError(f"--token-file: {exc}") from None
    return (("authorization", "Bearer " + token.decode()),)


def _stubs(args: argparse.Namespace) -> tuple[grpc.Channel, Any]:
    from governor_api import governor_v1_pb2_grpc

    channel = open_channel(args)
    return channel, governor_v1_pb2_grpc.AdminServiceStub(channel)


def _rpc(args: argparse.Namespace, method: str, request: Any) -> Any:
    """Call an admin rpc with the command's deadline and credentials; RpcError ->
    CliError."""
    metadata = _credentials(args)
    channel, stub = _stubs(args)
    try:
        return getattr(stub, method)(request, timeout=args.timeout_s, metadata=metadata)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        if code == grpc.StatusCode.UNAUTHENTICATED and not metadata:
            detail += f" (no token given: --token-file FILE or ${TOKEN_FILE_ENV})"
        if code in _USER_ERRORS:
            raise CliError(f"{detail}", EXIT_USAGE, code) from None
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise CliError(
                f"cannot reach the governor at {args.server} ({code.name}: {detail})", EXIT_FAILED
            ) from None
        raise CliError(f"{code.name}: {detail}", EXIT_FAILED) from None
    finally:
        channel.close()


def _print_json(message: Any) -> None:
    from service.convert import message_to_json

    print(message_to_json(message))


# ====================================================================== target
_FLAG_PATHS: dict[str, tuple[str, ...]] = {
    "deployment": ("deployment",),
    "namespace": ("namespace",),
    "ttft_p95_ms": ("sla", "ttft_p95_ms"),
    "itl_p95_ms": ("sla", "itl_p95_ms"),
    "e2e_p99_ms": ("sla", "e2e_p99_ms"),
    "attainment_goal_frac": ("sla", "attainment_goal_frac"),
    "min_replicas": ("replicas", "min_replicas"),
    "max_replicas": ("replicas", "max_replicas"),
    "max_num_seqs_min": ("knobs", "max_num_seqs_min"),
    "max_num_seqs_max": ("knobs", "max_num_seqs_max"),
    "max_num_batched_tokens_min": ("knobs", "max_num_batched_tokens_min"),
    "max_num_batched_tokens_max": ("knobs", "max_num_batched_tokens_max"),
    "default_max_num_seqs": ("knobs", "default_max_num_seqs"),
    "default_max_num_batched_tokens": ("knobs", "default_max_num_batched_tokens"),
    "batching_policy": ("batching_policy",),
    "cold_start_s": ("cold_start_s",),
    "profile": ("profile",),
    "fallback_replicas": ("fallback_replicas",),
}
_FLOAT_FLAGS = {"ttft_p95_ms", "itl_p95_ms", "e2e_p99_ms", "attainment_goal_frac", "cold_start_s"}
_STR_FLAGS = {"deployment", "namespace", "batching_policy", "profile"}


def _set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def _policy_overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise CliError(f"--policy: expected KEY=VALUE (got {item!r})")
        if not key:
            raise CliError(f"--policy {item!r}: the key is empty (expected KEY=VALUE)")
        if not value.strip():  # YAML reads nothing as null: "never release" for some keys
            raise CliError(
                f"--policy {key}=: no value (write it; `null` explicitly where the setting "
                "takes null)"
            )
        try:
            out[key] = load_yaml(value)
        except yaml.YAMLError:
            out[key] = value
    return out


def _build_target(args: argparse.Namespace, current: dict[str, Any] | None) -> dict[str, Any]:
    """The target to send: the current one (if any), then --file, then the flags."""
    data: dict[str, Any] = dict(current or {})
    if args.file:
        try:
            loaded = load_yaml(read_config_text(Path(args.file)))
        except OSError as exc:
            raise CliError(f"--file {args.file}: cannot read: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise CliError(f"--file {args.file}: {exc}") from None
        except yaml.YAMLError as exc:
            raise CliError(f"--file {args.file}: not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise CliError(f"--file {args.file}: must be a mapping of target fields")
        if "name" in loaded and loaded["name"] != args.model:
            raise CliError(
                f"--file {args.file} is the target of {loaded['name']!r}, not of "
                f"{args.model!r}: give the same name (a rename is a delete and a set)"
            )
        data = loaded
    data["name"] = args.model
    for flag, path in _FLAG_PATHS.items():
        value = getattr(args, flag)
        if value is not None:
            _set_path(data, path, value)
    if args.policy:
        policy = dict(data.get("policy") or {})
        policy.update(_policy_overrides(args.policy))
        data["policy"] = policy
    return data


def _cmd_target_set(args: argparse.Namespace) -> int:
    from controller.targets import TargetError, validate_target
    from governor_api import governor_v1_pb2 as pb
    from service.convert import target_from_pb, target_to_pb

    current: dict[str, Any] | None = None
    revision: str | None = None
    try:
        got = _rpc(args, "GetTarget", pb.GetTargetRequest(model=args.model))
        current = target_from_pb(got.target)
        revision = got.revision
    except CliError as exc:
        if exc.status != grpc.StatusCode.NOT_FOUND:
            raise
    data = _build_target(args, current)
    if current is None and not args.deployment and "deployment" not in data:
        raise CliError(f"model {args.model!r} is new: give --deployment (and its SLA)")
    try:
        model = validate_target(data)  # the server's rules and messages: fail before sending
    except TargetError as exc:
        raise CliError(str(exc)) from None
    request = pb.SetTargetRequest(target=target_to_pb(model), dry_run=args.dry_run)
    if revision is not None and not args.force:
        request.expected_revision = revision
    resp = _rpc(args, "SetTarget", request)
    if args.output == "json":
        _print_json(resp)
        return EXIT_OK
    verb = "valid (dry run, nothing changed)" if args.dry_run else "set"
    print(f"target {args.model!r} {verb}; targets revision {resp.revision}")
    return EXIT_OK


def _target_yaml(target: Any) -> str:
    from service.convert import target_from_pb

    return yaml.safe_dump(target_from_pb(target), sort_keys=False).rstrip()


def _cmd_target_get(args: argparse.Namespace) -> int:
    from governor_api import governor_v1_pb2 as pb

    resp = _rpc(args, "GetTarget", pb.GetTargetRequest(model=args.model))
    if args.output == "json":
        _print_json(resp)
        return EXIT_OK
    print(_target_yaml(resp.target))
    print(f"# revision {resp.revision}" + ("  (paused: shadow mode)" if resp.paused else ""))
    return EXIT_OK


def _cmd_target_list(args: argparse.Namespace) -> int:
    from governor_api import governor_v1_pb2 as pb

    resp = _rpc(args, "ListTargets", pb.ListTargetsRequest())
    if args.output == "json":
        _print_json(resp)
        return EXIT_OK
    head = f"{'MODEL':<32} {'DEPLOYMENT':<36} {'TTFT p95':>9} {'ITL p95':>8} {'REPLICAS':>9}"
    print(f"{head}  PAUSED")
    for t in resp.targets:
        m = t.target
        print(
            f"{m.name:<32} {m.namespace + '/' + m.deployment:<36} "
            f"{m.sla.ttft_p95_ms:>7g}ms {m.sla.itl_p95_ms:>6g}ms "
            f"{f'{m.replicas.min_replicas}-{m.replicas.max_replicas}':>9}  "
            f"{'yes' if t.paused else 'no'}"
        )
    print(f"# revision {resp.revision}")
    return EXIT_OK


def _cmd_target_delete(args: argparse.Namespace) -> int:
    from governor_api import governor_v1_pb2 as pb

    resp = _rpc(args, "DeleteTarget", pb.DeleteTargetRequest(model=args.model))
    if args.output == "json":
        _print_json(resp)
        return EXIT_OK
    print(f"target {args.model!r} deleted; targets revision {resp.revision}")
    return EXIT_OK


# ====================================================================== status / explain
def _fmt_q(q: Any) -> str:
    parts = [
        f"{name}={getattr(q, name + '_ms'):.0f}ms"
        for name in ("p50", "p90", "p95", "p99")
        if q.HasField(name + "_ms")
    ]
    return " ".join(parts) or "n/a"


def _cmd_status(args: argparse.Namespace) -> int:
    from governor_api import governor_v1_pb2 as pb

    resp = _rpc(args, "GetStatus", pb.GetStatusRequest(models=args.models))
    if args.output == "json":
        _print_json(resp)
        return EXIT_OK
    role = "leader" if resp.leader else f"follower (leader: {resp.leader_identity or '?'})"
    print(
        f"instance {resp.instance}: {role}; store {resp.store}; "
        f"targets revision {resp.targets_revision}"
    )
    if resp.targets_problem:
        print(f"  REFUSED stored targets (kept the last valid ones): {resp.targets_problem}")
    for m in resp.models:
        p = m.published
        replicas = str(p.replicas) if p.has_replicas else "none yet"
        print(
            f"{m.model}{'  [paused: shadow mode]' if m.paused else ''}\n"
            f"  published: replicas={replicas} max_num_seqs={p.max_num_seqs} "
            f"max_num_batched_tokens={p.max_num_batched_tokens} generation={p.generation} "
            f"({p.reason}, {p.origin}) engines={p.engines_seen}"
        )
        o = m.observation
        if o.present:
            print(
                f"  observed: {o.arrival_rate_rps:.2f} req/s, staleness {o.staleness_s:.1f}s\n"
                f"    ttft {_fmt_q(o.ttft)}\n    itl  {_fmt_q(o.itl)}\n    e2e  {_fmt_q(o.e2e)}"
            )
        else:
            why = o.no_data if len(o.no_data) <= 300 else o.no_data[:297] + "..."
            print(f"  observed: no data ({why})")
        if m.HasField("decision"):
            d = m.decision
            print(
                f"  decision: valid={d.valid} replicas={d.replicas} "
                f"stages={' '.join(d.stage_reasons)}"
                + (f" capacity={d.capacity_limit}-bound" if d.capacity_limit else "")
            )
            if d.HasField("plant_speed"):
                corr = d.capacity_correction if d.HasField("capacity_correction") else 1.0
                seq = d.plant_seq_ratio if d.HasField("plant_seq_ratio") else 1.0
                cold = (
                    f", cold start {d.plant_cold_start_s:.0f} s"
                    if d.HasField("plant_cold_start_s")
                    else ""
                ) + (
                    f", overhead {d.plant_overhead_ms:.0f} ms"
                    if d.HasField("plant_overhead_ms")
                    else ""
                )
                knob = d.knob_correction if d.HasField("knob_correction") else 1.0
                print(
                    f"  plant (learned): step time x{d.plant_speed:.2f} of the profile, "
                    f"per-sequence cost x{seq:.2f} more, capacity correction x{corr:.2f}, "
                    f"knob correction x{knob:.2f}" + cold
                )
            if d.prefix_hit_frac:
                print(prefix_hits_line(d.prefix_hit_frac))
        if m.actuation:
            print(f"  actuation: {m.actuation}")
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    from governor_api import governor_v1_pb2 as pb

    resp = _rpc(args, "Explain", pb.ExplainRequest(model=args.model, last=args.last))
    if args.output == "json":
        _print_json(resp)
        return EXIT_OK
    if not resp.decisions:
        print(f"{args.model}: no decisions yet")
    for d in resp.decisions:
        print(d.text)
    return EXIT_OK


def _cmd_pause(args: argparse.Namespace) -> int:
    from governor_api import governor_v1_pb2 as pb

    method = "PauseActuation" if args.command == "pause" else "ResumeActuation"
    resp = _rpc(args, method, pb.PauseRequest(model=args.model))
    if args.output == "json":
        _print_json(resp)
        return EXIT_OK
    state = "paused (shadow mode: decide and log, no actuation)" if resp.paused else "actuating"
    print(f"{resp.model}: {state}")
    return EXIT_OK


# ====================================================================== registration
def _positive_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds (got {text!r})") from None
    if not 0 < value <= 300:
        raise argparse.ArgumentTypeError(f"must be in (0, 300] seconds (got {text})")
    return value


def _count(text: str, least: int = 0) -> int:
    """A whole number in [least, INT32_MAX] (what the API's count fields carry)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number (got {text!r})") from None
    if not least <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be in [{least}, {INT32_MAX}] (got {value})")
    return value


def positive_count(text: str) -> int:
    """A whole number in [1, INT32_MAX] (argparse type)."""
    return _count(text, least=1)


def _wrap(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except CliError as exc:
            print(f"governor {args.command}: {exc.message}", file=sys.stderr)
            return exc.code

    return run


def register(sub: Any) -> None:
    """Add `run`, `engine-args`, `target`, `status`, `explain`, `pause`, `resume`."""
    from service.engine_args import add_engine_args
    from service.run import add_run_arguments, run_service

    p = sub.add_parser("run", help="run the governor service (gRPC API, KEDA scaler, /metrics)")
    add_run_arguments(p)
    p.set_defaults(func=run_service)
    connection = _connection_parser()
    client = _client_parser(connection)
    add_engine_args(sub, connection)
    _register_target(sub, client)
    p = sub.add_parser("status", parents=[client], help="observations, decisions, latencies")
    p.add_argument("models", nargs="*")
    p.set_defaults(func=_wrap(_cmd_status))
    p = sub.add_parser("explain", parents=[client], help="stage trace of the last decisions")
    p.add_argument("model")
    p.add_argument("--last", type=_count, default=1, help="how many decisions (0: all kept)")
    p.set_defaults(func=_wrap(_cmd_explain))
    for name, text in (
        ("pause", "shadow mode: decide and log, stop actuating"),
        ("resume", "actuate again"),
    ):
        p = sub.add_parser(name, parents=[client], help=text)
        p.add_argument("model")
        p.set_defaults(func=_wrap(_cmd_pause))


GRPC_TARGET_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")
"""gRPC name schemes `--server` passes through (gRPC's naming doc); the addresses of
`dns:`, `ipv4:` and `ipv6:` are checked as HOST:PORT like a plain address."""


def _server_address(text: str) -> str:
    """--server (and $GOVERNOR_SERVER, its default): HOST:PORT with a port in 1-65535
    (IPv6 as [::1]:PORT), or a gRPC target with one of `GRPC_TARGET_SCHEMES`.
    ArgumentTypeError (exit 2) naming the problem: gRPC takes a port past 65535 modulo
    65536 (127.0.0.1:116087 reached port 50551, the admin token with it), an empty
    address reached gRPC's resolver, which printed its own errors."""
    value = text.strip()
    if not value:
        raise argparse.ArgumentTypeError("must be HOST:PORT, not empty")
    scheme = next((s for s in GRPC_TARGET_SCHEMES if value.startswith(s)), None)
    if scheme in ("unix:", "unix-abstract:", "vsock:"):
        if value == scheme:
            raise argparse.ArgumentTypeError(f"{value!r} names no address after the scheme")
        return value
    addresses = [value]
    if scheme == "dns:":  # dns:[//authority/]HOST:PORT
        rest = value.removeprefix("dns:")
        addresses = [rest.split("/", 3)[-1] if rest.startswith("//") else rest]
    elif scheme is not None:  # ipv4:ADDR:PORT[,ADDR:PORT...], ipv6: alike
        addresses = value.removeprefix(scheme).split(",")
    for address in addresses:
        try:
            parse_listen(address, "address", lowest_port=1)
        except ValueError as exc:
            env = " (the value of $GOVERNOR_SERVER)" if text == os.environ.get(SERVER_ENV) else ""
            raise argparse.ArgumentTypeError(f"{exc}{env}") from None
    return value


def _connection_parser() -> argparse.ArgumentParser:
    """The options every command that calls the governor shares: server, deadline, TLS.
    `engine-args` takes only these (the engines' read-only API needs no admin token, and
    its output is the engine's flags)."""
    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--server",
        type=_server_address,
        default=os.environ.get(SERVER_ENV) or DEFAULT_SERVER,
        metavar="HOST:PORT",
        help="the governor's gRPC address, port 1-65535, or a gRPC target ("
        + ", ".join(s + "..." for s in GRPC_TARGET_SCHEMES)
        + f"); default ${SERVER_ENV} or {DEFAULT_SERVER}",
    )
    client.add_argument(
        "--timeout-s", type=_positive_timeout, default=ADMIN_TIMEOUT_S, help="call deadline"
    )
    client.add_argument("--tls", action="store_true", help="use TLS (system root CAs)")
    client.add_argument(
        "--tls-ca-file",
        default=os.environ.get("GOVERNOR_TLS_CA_FILE") or None,
        metavar="PEM",
        help="use TLS, trusting this CA (default $GOVERNOR_TLS_CA_FILE)",
    )
    client.add_argument("--tls-cert-file", metavar="PEM", help="client certificate (mTLS)")
    client.add_argument("--tls-key-file", metavar="PEM", help="client key (mTLS)")
    client.add_argument(
        "--tls-server-name", metavar="NAME", help="expected name in the server's certificate"
    )
    return client


def _client_parser(connection: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The admin commands' options: the connection's, plus output format and the admin
    token."""
    client = argparse.ArgumentParser(add_help=False, parents=[connection])
    client.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="json: the API's messages, zero values included",
    )
    client.add_argument(
        "--token-file",
        default=os.environ.get(TOKEN_FILE_ENV) or None,
        metavar="FILE",
        help=f"admin bearer token file (default ${TOKEN_FILE_ENV})",
    )
    return client


def _register_target(sub: Any, client: argparse.ArgumentParser) -> None:
    """`target set|get|list|delete`."""
    p = sub.add_parser("target", help="set, get, list or delete a model's SLA target")
    tsub = p.add_subparsers(dest="target_command", required=True, metavar="ACTION")
    s = tsub.add_parser("set", parents=[client], help="create or update a model's target")
    s.add_argument("model")
    s.add_argument("--file", help="YAML mapping with the whole target (flags override it)")
    for flag in _FLAG_PATHS:
        kind: Any = float if flag in _FLOAT_FLAGS else (str if flag in _STR_FLAGS else int)
        s.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=kind)
    s.add_argument(
        "--policy", action="append", default=[], metavar="KEY=VALUE", help="policy override"
    )
    s.add_argument("--dry-run", action="store_true", help="validate only")
    s.add_argument(
        "--force", action="store_true", help="overwrite even if the targets changed meanwhile"
    )
    s.set_defaults(func=_wrap(_cmd_target_set), command="target set")
    g = tsub.add_parser("get", parents=[client], help="print a model's target")
    g.add_argument("model")
    g.set_defaults(func=_wrap(_cmd_target_get), command="target get")
    ls = tsub.add_parser("list", parents=[client], help="list every target")
    ls.set_defaults(func=_wrap(_cmd_target_list), command="target list")
    d = tsub.add_parser("delete", parents=[client], help="delete a model's target")
    d.add_argument("model")
    d.set_defaults(func=_wrap(_cmd_target_delete), command="target delete")
