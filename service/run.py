"""`governor run`: arguments, validation and wiring of one governor instance.

`run_service(args)` checks every flag first (exit 2 naming the bad one, nothing
started), then builds the metric source (Prometheus, or the simulated fleet), the store,
the leader elector and the actuators, and serves until SIGTERM/SIGINT.

`WallClockSource` (service.promclock): the loop measures windows on the monotonic
clock; Prometheus is queried at Prometheus's own current time (its offset from the
host's wall clock measured by asking it), so a skewed or stepped host clock never reads
old data as fresh.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from controller.actuation import Actuator
from controller.config import (
    INT32_MAX,
    MAX_SCRAPE_INTERVAL_S,
    ConfigError,
    GovernorConfig,
    PrometheusSettings,
    load_config,
)
from controller.loop import SystemClock
from controller.types import Knobs
from service.core import MAX_MODELS, ServiceCore
from service.demo import demo_config, simulated_fleet_factory
from service.errors import SimulatorUnavailableError
from service.leader import AlwaysLeader, Elector
from service.promclock import WallClockSource
from service.security import (
    AdminToken,
    SecurityConfigError,
    TlsFiles,
    default_streams_per_client,
    server_credentials,
)
from service.server import (
    DEFAULT_GRPC_LISTEN,
    DEFAULT_METRICS_LISTEN,
    MAX_CONCURRENT_RPCS,
    MAX_WATCH_STREAMS,
    SERVING_MODES,
    SHUTDOWN_GRACE_S,
    TICK_NICE,
    GovernorServer,
    parse_listen,
    serve,
)
from service.store import FileStore, MemoryStore, Store, StoreError
from service.streams import canonical_ip

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from estimators.prometheus import PrometheusSource

ADMIN_TOKEN_ENV = "GOVERNOR_ADMIN_TOKEN_FILE"


MAX_SIM_RATE_SCALE = 100.0
"""The largest `--sim-rate-scale`: simulator.traces.MAX_RATE_MULTIPLIER (the trace is
scaled whole in memory; x3,000 ran out of memory with a traceback)."""
MAX_SIM_SPEED = 100.0
"""The fastest `--sim-speed`: the simulator runs a conversation x16 fleet at ~350x real
time per CPU second, and at 10**6 one tick held a core for minutes, past SIGTERM."""


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _pod_namespace(default: str = "default") -> str:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    with contextlib.suppress(OSError):
        return path.read_text().strip() or default
    return os.environ.get("POD_NAMESPACE", default)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The `governor run` options (registered by service.admin_cli)."""
    p.add_argument("--config", help="YAML config file (required unless --simulated-fleet)")
    p.add_argument(
        "--simulated-fleet",
        metavar="TRACE",
        help="run against the embedded simulated fleet in real time: a trace path, "
        "azure:conv|azure:code or synthetic:NAME (serves one model `demo` unless --config "
        "names others)",
    )
    p.add_argument(
        "--sim-rate-scale",
        type=float,
        default=1.0,
        metavar="K",
        help="with --simulated-fleet: K times the trace's requests over the same span, "
        f"K in (0, {MAX_SIM_RATE_SCALE:g}] (the trace is scaled whole in memory: x100 makes "
        "azure:conv 1.9 million requests)",
    )
    p.add_argument(
        "--sim-speed",
        type=float,
        default=1.0,
        metavar="X",
        help="with --simulated-fleet: simulated seconds per real second",
    )
    _add_store_arguments(p)
    _add_server_arguments(p)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _add_store_arguments(p: argparse.ArgumentParser) -> None:
    """Persistence, leader election and scaling options of `governor run`."""
    p.add_argument(
        "--store",
        choices=("auto", "file", "configmap", "memory"),
        default="auto",
        help="where targets and state persist (auto: configmap in-cluster, else file)",
    )
    p.add_argument("--state-file", default="governor-state.json", help="for --store file")
    p.add_argument("--configmap", default="governor-targets", help="for --store configmap")
    p.add_argument("--namespace", default=None, help="of the ConfigMap and Lease (default: pod's)")
    p.add_argument(
        "--leader-election",
        choices=("auto", "on", "off"),
        default="auto",
        help="Kubernetes Lease election (auto: on with --store configmap)",
    )
    p.add_argument("--lease", default="llm-governor-leader", help="Lease name")
    p.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="this instance's identity (default: $POD_NAME or the host name)",
    )
    p.add_argument(
        "--scale-via",
        choices=("keda", "kubernetes"),
        default="keda",
        help="keda: serve the external scaler only; kubernetes: also patch Deployments' "
        "scale subresource (clusters without KEDA)",
    )
    p.add_argument(
        "--hpa-conflict-check",
        choices=("on", "off"),
        default="on",
        help="with --scale-via kubernetes: list the HorizontalPodAutoscalers of each "
        "model's namespace and refuse to scale a Deployment one also scales (off: for a "
        "service account that may not list them)",
    )
    p.add_argument(
        "--knob-rollouts",
        choices=("auto", "on", "off"),
        default="auto",
        help="roll out knob changes worth a restart by patching the engine Deployment's "
        "pod-template annotation (actuators/rollout.py); auto: on inside a cluster",
    )
    p.add_argument(
        "--drain-scale-in",
        choices=("auto", "on", "off"),
        default="auto",
        help="before a scale-down, set pod-deletion-cost from each pod's running requests "
        "(actuators/drain.py); auto: on inside a cluster",
    )


def _add_server_arguments(p: argparse.ArgumentParser) -> None:
    """Listeners, limits and security options of `governor run`."""
    p.add_argument("--grpc-listen", default=DEFAULT_GRPC_LISTEN, metavar="HOST:PORT")
    p.add_argument("--metrics-listen", default=DEFAULT_METRICS_LISTEN, metavar="HOST:PORT")
    p.add_argument("--shutdown-grace-s", type=float, default=SHUTDOWN_GRACE_S)
    p.add_argument(
        "--serving",
        choices=SERVING_MODES,
        default="process",
        help="process: serve the engines', KEDA's and admin listeners from a process of "
        "their own that mirrors the decisions, so calls never wait on a tick (restarted "
        "if it dies); inline: serve them from the ticking process (debugging)",
    )
    p.add_argument(
        "--tick-nice",
        type=int,
        default=None,
        metavar="N",
        help=f"the tick thread's nice above the rest of the process, 0-19 (default "
        f"{TICK_NICE} with the serving process, 0 inline): on a busy node the serving "
        "process gets the CPU first, but admin calls, the Lease renewals and /metrics "
        "share the ticking interpreter and wait on a tick descheduled while it holds "
        "the interpreter lock",
    )
    p.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=MAX_CONCURRENT_RPCS,
        help=f"RPCs served at once, watch streams included (default {MAX_CONCURRENT_RPCS}, "
        "at least 2: one for a stream, one for unary calls)",
    )
    p.add_argument(
        "--max-watch-streams",
        type=int,
        default=None,
        help=f"open WatchBatchingConfig + StreamIsActive streams at most (default "
        f"{MAX_WATCH_STREAMS}, at most half of --max-concurrent-rpcs)",
    )
    p.add_argument(
        "--max-watch-streams-per-client",
        type=int,
        default=None,
        help="open watch streams (as --max-watch-streams counts them) from one client host "
        "at most, so one client cannot take them all (default: half of "
        "--max-watch-streams; KEDA holds one per external-push ScaledObject from one host)",
    )
    p.add_argument(
        "--max-models",
        type=int,
        default=MAX_MODELS,
        help="models the target set may hold after an admin addition",
    )
    p.add_argument(
        "--admin-token-file",
        default=os.environ.get(ADMIN_TOKEN_ENV) or None,
        metavar="FILE",
        help="file holding the admin API's bearer token, e.g. a mounted Secret key "
        f"(default ${ADMIN_TOKEN_ENV}); without it the admin API is disabled",
    )
    p.add_argument(
        "--admin-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve the admin API on this listener only (e.g. 127.0.0.1:50052); "
        "--grpc-listen then serves the engines' and KEDA's read-only APIs alone",
    )
    p.add_argument(
        "--insecure-admin",
        action="store_true",
        help="serve the admin API without a token (development only; needs a loopback "
        "--grpc-listen)",
    )
    p.add_argument("--tls-cert-file", metavar="PEM", help="serve gRPC over TLS: certificate")
    p.add_argument("--tls-key-file", metavar="PEM", help="the certificate's private key")
    p.add_argument(
        "--tls-client-ca-file",
        metavar="PEM",
        help="require client certificates signed by this CA (mTLS)",
    )


class _RunError(Exception):
    """`governor run` cannot go on: `message` for stderr, `code` the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _listens(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """(flag, HOST:PORT) of each listener `governor run` opens."""
    listens = (("--grpc-listen", args.grpc_listen), ("--metrics-listen", args.metrics_listen))
    if args.admin_listen is not None:
        listens += (("--admin-listen", args.admin_listen),)
    return listens


_ANY_HOST = frozenset({"0.0.0.0", "::", ""})
"""Hosts that listen on every address of the machine (IPv4, IPv6, gRPC's empty host)."""

_LOCALHOST = frozenset({"127.0.0.1", "::1"})
"""What `localhost` binds: gRPC resolves it to both loopbacks and listens on each (the
metrics server on the first), so it takes the port on 127.0.0.1 and on ::1."""


def _host_addresses(host: str) -> frozenset[str]:
    """The addresses a listener on `host` takes, in one spelling: an IP address in its
    canonical form (IPv4-mapped IPv6 as IPv4), `localhost` (any case, trailing dot) as
    127.0.0.1 and ::1, any other name as itself, lower-cased."""
    name = host.lower()
    if name in ("localhost", "localhost."):
        return _LOCALHOST
    return frozenset({canonical_ip(name) or name})


def _hosts_overlap(a: str, b: str) -> bool:
    """Whether listeners on hosts `a` and `b` at one port collide: the same address in
    any spelling (localhost is 127.0.0.1 and ::1), or either one every address
    (0.0.0.0:P takes P on 127.0.0.1 too)."""
    at, bt = _host_addresses(a), _host_addresses(b)
    return bool(at & bt) or bool((at | bt) & _ANY_HOST)


def _overlap_message(flag_a: str, value_a: str, flag_b: str, value_b: str) -> str:
    if value_a == value_b:
        return f"{flag_a} and {flag_b} are both {value_a}: give each its own port"
    return (
        f"{flag_a} {value_a} and {flag_b} {value_b} overlap (a host of 0.0.0.0, :: or "
        "none listens on every address, that port included; localhost is 127.0.0.1 and "
        "::1; one address may be spelt in more than one way): give each its own port"
    )


def _check_flags(args: argparse.Namespace) -> None:
    """Check the numeric, address and identity flags; _RunError (exit 2) naming the bad one.
    Fills the default of `--max-watch-streams`."""
    bound: list[tuple[str, str, str, int]] = []  # (flag, value, host, port) so far
    for flag, value in _listens(args):
        try:
            host, port = parse_listen(value, flag)
        except ValueError as exc:
            raise _RunError(str(exc), 2) from None
        for other_flag, other_value, other_host, other_port in bound:
            if port and port == other_port and _hosts_overlap(host, other_host):
                raise _RunError(_overlap_message(other_flag, other_value, flag, value), 2)
        bound.append((flag, value, host, port))
    if not args.identity.strip():
        raise _RunError(
            f"--identity must not be empty or blank (got {args.identity!r}): it names this "
            "instance in the leader Lease and in status",
            2,
        )
    if not math.isfinite(args.shutdown_grace_s) or args.shutdown_grace_s <= 0:
        raise _RunError(f"--shutdown-grace-s must be > 0 (got {args.shutdown_grace_s})", 2)
    if args.tick_nice is not None and not 0 <= args.tick_nice <= 19:
        raise _RunError(
            f"--tick-nice must be within [0, 19] (got {args.tick_nice}): an increment of "
            "the tick thread's nice; raising a thread's priority needs privileges",
            2,
        )
    # gRPC's limiter takes a C int: past it the server failed to build after the store
    # was opened, exit 1 with a traceback (or "did not start" in process mode).
    for flag, value in (
        ("--max-concurrent-rpcs", args.max_concurrent_rpcs),
        ("--max-watch-streams", args.max_watch_streams),
        ("--max-watch-streams-per-client", args.max_watch_streams_per_client),
        ("--max-models", args.max_models),
    ):
        if value is not None and not 1 <= value <= INT32_MAX:
            raise _RunError(f"{flag} must be within [1, {INT32_MAX}] (got {value})", 2)
    if args.max_concurrent_rpcs < 2:
        raise _RunError(
            f"--max-concurrent-rpcs must be >= 2 (got {args.max_concurrent_rpcs}): a watch "
            "stream holds a slot for as long as it is open, and unary calls (engines' "
            "GetBatchingConfig, KEDA, admin, health) need another",
            2,
        )
    if args.max_watch_streams is None:  # half the slots, so unary calls keep the rest
        args.max_watch_streams = min(MAX_WATCH_STREAMS, args.max_concurrent_rpcs // 2)
    if not 1 <= args.max_watch_streams < args.max_concurrent_rpcs:
        raise _RunError(
            f"--max-watch-streams must be >= 1 and below --max-concurrent-rpcs "
            f"({args.max_concurrent_rpcs}), so streams cannot take every slot "
            f"(got {args.max_watch_streams})",
            2,
        )
    if args.max_watch_streams_per_client is None:
        args.max_watch_streams_per_client = default_streams_per_client(args.max_watch_streams)
    if args.max_watch_streams_per_client > args.max_watch_streams:
        raise _RunError(
            f"--max-watch-streams-per-client must be within [1, --max-watch-streams "
            f"({args.max_watch_streams})] (got {args.max_watch_streams_per_client})",
            2,
        )
    for flag, value in (("--sim-rate-scale", args.sim_rate_scale), ("--sim-speed", args.sim_speed)):
        if not math.isfinite(value) or value <= 0:
            raise _RunError(f"{flag} must be > 0 (got {value})", 2)
        if args.simulated_fleet is None and value != 1.0:
            raise _RunError(f"{flag} is read only with --simulated-fleet", 2)
    if args.sim_rate_scale > MAX_SIM_RATE_SCALE:
        raise _RunError(
            f"--sim-rate-scale must be <= {MAX_SIM_RATE_SCALE:g} (got {args.sim_rate_scale:g}): "
            "the trace is scaled whole in memory (a higher rate: a synthetic trace's own rate "
            "parameters)",
            2,
        )
    if args.sim_speed > MAX_SIM_SPEED:
        raise _RunError(
            f"--sim-speed must be <= {MAX_SIM_SPEED:g} (got {args.sim_speed:g}): past it the "
            "simulated fleet cannot keep up with the clock, and a tick would never end",
            2,
        )


def _source(args: argparse.Namespace, config: GovernorConfig) -> tuple[Any, list[Actuator]]:
    """The metric source and the actuators it brings (the simulated fleet resizes
    itself); _RunError (exit 2) when the simulated fleet cannot be built."""
    if args.simulated_fleet is not None:
        try:
            source, fleet = simulated_fleet_factory(
                args.simulated_fleet, config, rate_scale=args.sim_rate_scale, speed=args.sim_speed
            )
        except SimulatorUnavailableError as exc:
            raise _RunError(str(exc), 2) from None
        return source, [fleet]
    # Prometheus evaluates at Unix time (its own clock's); the loop's clock is monotonic.
    return WallClockSource(prometheus_source(config), SystemClock()), []


def prometheus_source(
    config: GovernorConfig,
    reported_s: Callable[[PrometheusSettings], float | None] | None = None,
    client: Any = None,
) -> PrometheusSource:
    """The Prometheus source `governor run` reads for `config`: its rate window and
    staleness limit, and the engines' scrape interval of `checked_scrape_interval_s`
    (`reported_s`: how the engines' scrape interval is asked, default Prometheus's
    targets API), which sets the short window (`short_window_for`) and the gauges'
    two-scrape lookback. `client`: an injected query client (the benchmarks' fake
    Prometheus lists the queries this source sends through one)."""
    from estimators.prometheus import PrometheusSource

    scrape_s = checked_scrape_interval_s(config, reported_s)
    return PrometheusSource(
        config.prometheus,
        window_s=config.policy.window_s,
        short_window_s=short_window_for(config, scrape_s),
        max_staleness_s=config.policy.max_staleness_s,
        scrape_interval_s=scrape_s,
        client=client,
    )


def checked_scrape_interval_s(
    config: GovernorConfig,
    reported_s: Callable[[PrometheusSettings], float | None] | None = None,
) -> float:
    """The engines' scrape interval, seconds: `prometheus.scrape_interval_s`, or the
    interval Prometheus reports for the engine targets when that is longer (logged: a
    lookback of two configured scrapes would read one missed scrape as a dead target,
    and the short window would hold fewer than two samples). `reported_s`: how it is
    asked, default `estimators.scrape` with the settings' query method and TLS check."""
    from estimators.scrape import engine_scrape_interval_s

    def ask_prometheus(p: PrometheusSettings) -> float | None:
        return engine_scrape_interval_s(
            p.url, p.timeout_s, method=p.query_method, verify=not p.disable_ssl
        )

    reported = (reported_s or ask_prometheus)(config.prometheus)
    configured = config.prometheus.scrape_interval_s
    log = structlog.get_logger("governor.run")
    if reported is None:
        log.info(
            "scrape_interval_unchecked",
            configured_s=configured,
            note="Prometheus did not say how often it scrapes the engines (targets API "
            "unreachable or its answer unreadable); prometheus.scrape_interval_s is used",
        )
        return configured
    if reported > MAX_SCRAPE_INTERVAL_S:
        log.error(
            "scrape_interval_unusable",
            configured_s=configured,
            reported_s=reported,
            note=f"Prometheus reports the engines scraped slower than {MAX_SCRAPE_INTERVAL_S:g} "
            "s, past what the governor runs with; prometheus.scrape_interval_s is used",
        )
        return configured
    if reported <= configured:
        return configured
    log.warning(
        "scrape_interval_mismatch",
        configured_s=configured,
        reported_s=reported,
        short_window_s=short_window_for(config, reported),
        note="prometheus.scrape_interval_s is shorter than Prometheus scrapes the engines",
    )
    return reported


def short_window_for(config: GovernorConfig, scrape_s: float) -> float:
    """The short (panic) window, seconds: the config's, raised to two scrapes of
    `scrape_s` when the engines are scraped slower than configured (at most the rate
    window). Example: configured 15 s, engines scraped every 30 s -> 60 s."""
    if scrape_s <= config.prometheus.scrape_interval_s:
        return config.short_window_s
    return min(config.policy.window_s, max(config.short_window_s, 2.0 * scrape_s))


def _persistence(args: argparse.Namespace) -> tuple[Store, Elector, Any]:
    """The store, the leader elector and the Kubernetes client (None when nothing
    needs one); _RunError (exit 1) when the client cannot be configured."""
    kind = args.store
    if kind == "auto":
        kind = "memory" if args.simulated_fleet else ("configmap" if _in_cluster() else "file")
    namespace = args.namespace or _pod_namespace()
    kube = None
    if (
        kind == "configmap"
        or args.scale_via == "kubernetes"
        or args.leader_election == "on"
        or _enabled(args, args.knob_rollouts)
        or _enabled(args, args.drain_scale_in)
    ):
        from actuators.kubeapi import api_client

        try:
            kube = api_client()
        except Exception as exc:
            raise _RunError(f"cannot configure the Kubernetes client: {exc}", 1) from None
    store: Store
    if kind == "configmap":
        from kubernetes import client as k8s

        from service.cmstore import ConfigMapStore

        store = ConfigMapStore(k8s.CoreV1Api(kube), namespace, args.configmap)
        store.start_watch()  # the targets are watched, not read every tick
    elif kind == "file":
        store = FileStore(args.state_file)
    else:
        store = MemoryStore()
    elector: Elector = AlwaysLeader(args.identity)
    if args.leader_election == "on" or (args.leader_election == "auto" and kind == "configmap"):
        from service.leader import LeaseElector

        elector = LeaseElector(kube, namespace, args.lease, args.identity)
    return store, elector, kube


def _enabled(args: argparse.Namespace, switch: str) -> bool:
    """An auto|on|off switch of a Kubernetes feature: auto = inside a cluster, with
    Prometheus as the source (not a simulated fleet)."""
    if switch == "auto":
        return _in_cluster() and args.simulated_fleet is None
    return switch == "on"


def _kube_actuators(
    args: argparse.Namespace, kube: Any, config: GovernorConfig, core_ref: list[ServiceCore]
) -> list[Actuator]:
    """The Kubernetes actuators `args` ask for: the scale patcher (with drain-aware
    scale-in), the drain before KEDA's/the HPA's scale-downs, the knob roll-outs. Their
    failures are counted by ServiceCore (set_error_hook)."""

    def targets() -> dict[str, tuple[str, str]]:
        return core_ref[0].deployments()

    def rollout_interval_s(model: str) -> float:
        cfg = core_ref[0].config
        return cfg.policy_for(cfg.model(model)).rollout_min_interval_s

    def rollout_worth(model: str, decided: Knobs, annotated: Knobs) -> bool:
        """A take-over's catch-up: engines that follow knobs live never need a restart."""
        cfg = core_ref[0].config
        pol = cfg.policy_for(cfg.model(model))
        return not pol.knobs_live and decided.differs_by(annotated, pol.knob_rollout_gain_frac)

    out: list[Actuator] = []
    drain = None
    if _enabled(args, args.drain_scale_in):
        from kubernetes import client as k8s

        from actuators.drain import PodDrainer, prometheus_running_by_pod
        from estimators.prometheus import http_query_client

        p = config.prometheus
        prom = http_query_client(p.url, p.timeout_s, p.disable_ssl, 0, p.query_method)
        running = prometheus_running_by_pod(prom, p.model_label, p.namespace_label)
        drain = PodDrainer(k8s.CoreV1Api(kube), k8s.AppsV1Api(kube), running).prepare
    if args.scale_via == "kubernetes":
        from actuators.kubernetes import KubernetesScaleActuator

        hpa_check = args.hpa_conflict_check == "on"
        out.append(KubernetesScaleActuator(kube, targets, drain=drain, hpa_check=hpa_check))
    elif drain is not None:
        from actuators.drain import DrainBeforeScaleDown

        out.append(DrainBeforeScaleDown(drain, targets))
    if _enabled(args, args.knob_rollouts):
        from actuators.rollout import KnobRolloutActuator

        out.append(KnobRolloutActuator(kube, targets, rollout_interval_s, worth=rollout_worth))
    return out


def register_actuator_metrics(registry: CollectorRegistry, actuators: list[Actuator]) -> None:
    """Let each actuator that exports metrics of its own (`register_metrics`, e.g. the
    roll-out actuator's waiting time) add them to the service's /metrics registry."""
    for act in actuators:
        register = getattr(act, "register_metrics", None)
        if callable(register):
            register(registry)


def run_service(args: argparse.Namespace) -> int:
    """`governor run`: 0 after a graceful shutdown (SIGTERM/SIGINT), 2 for bad
    arguments or config, 1 when the service cannot start."""
    try:
        return _run(args)
    except _RunError as exc:
        print(f"governor run: {exc.message}", file=sys.stderr)
        return exc.code


def _run(args: argparse.Namespace) -> int:
    from controller.logs import configure_logging

    _check_flags(args)
    try:
        admin_token, tls = _security_args(args)
    except (SecurityConfigError, ValueError) as exc:
        raise _RunError(str(exc), 2) from None
    if args.config is None and args.simulated_fleet is None:
        raise _RunError("give --config FILE (or --simulated-fleet TRACE)", 2)
    try:
        config = load_config(args.config) if args.config is not None else demo_config()
    except ConfigError as exc:
        raise _RunError(str(exc), 2) from None
    source, actuators = _source(args, config)
    configure_logging(args.log_level)  # after validation: a refused command changes nothing
    store, elector, kube = _persistence(args)
    core_ref: list[ServiceCore] = []
    actuators += _kube_actuators(args, kube, config, core_ref)
    try:
        core = ServiceCore(
            config, source, store, actuators=actuators, elector=elector, max_models=args.max_models
        )
    except StoreError as exc:
        raise _RunError(f"cannot restore state: {exc}", 1) from None
    core_ref.append(core)
    register_actuator_metrics(core.metrics.registry, actuators)
    try:
        server = GovernorServer(
            core,
            grpc_listen=args.grpc_listen,
            metrics_listen=args.metrics_listen,
            max_concurrent_rpcs=args.max_concurrent_rpcs,
            max_watch_streams=args.max_watch_streams,
            max_watch_streams_per_client=args.max_watch_streams_per_client,
            admin_token=admin_token,
            allow_unauthenticated_admin=args.insecure_admin,
            tls=tls,
            admin_listen=args.admin_listen,
            serving=args.serving,
            log_level=args.log_level,
            tick_nice=args.tick_nice,
        )
        return serve(server, args.shutdown_grace_s)
    except OSError as exc:
        message = str(exc)
        if not message.startswith("cannot listen on "):  # names no listener: list them all
            listens = ", ".join(f"{flag} {value}" for flag, value in _listens(args))
            message = f"cannot serve on {listens}: {message}"
        raise _RunError(message, 1) from None


_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _security_args(args: argparse.Namespace) -> tuple[AdminToken | None, TlsFiles | None]:
    """The admin token and TLS files of `governor run`; SecurityConfigError or
    ValueError naming the flag (never a file's content)."""
    token = AdminToken(args.admin_token_file) if args.admin_token_file else None
    if args.insecure_admin:
        if token is not None:
            raise ValueError("--insecure-admin and --admin-token-file exclude each other")
        flag, listen = (
            ("--admin-listen", args.admin_listen)
            if args.admin_listen is not None
            else ("--grpc-listen", args.grpc_listen)
        )
        host, _ = parse_listen(listen, flag)
        if host not in _LOOPBACK:
            raise ValueError(
                f"--insecure-admin needs a loopback {flag} (127.0.0.1:PORT): an "
                f"unauthenticated admin API must not be reachable from other hosts (got {host})"
            )
    tls = None
    if args.tls_cert_file or args.tls_key_file:
        if not (args.tls_cert_file and args.tls_key_file):
            raise ValueError("give both --tls-cert-file and --tls-key-file")
        tls = TlsFiles(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
        server_credentials(tls)  # read and check the files now: exit 2 naming a bad one
    elif args.tls_client_ca_file:
        raise ValueError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    return token, tls
