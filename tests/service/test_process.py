"""Real service processes: SIGTERM (in-flight calls complete, exit 0 within the grace
period), SIGKILL + restart (targets and hysteresis intact, no scale-down), and the
`governor run` entry point. Waits are bounded polls on observable state, not sleeps."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.cli import main as cli_main
from service.store import FileStore
from tests.service.harness import ServiceProcess, keda_replicas, wait_until

ROOT = Path(__file__).resolve().parents[2]
TICK_S = 0.2


def _write_config(path: Path, **policy: Any) -> Path:
    cfg = {
        "models": [
            {
                "name": "demo",
                "deployment": "demo",
                "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 50},
                "replicas": {"min_replicas": 1, "max_replicas": 20},
            }
        ],
        "policy": {"tick_interval_s": TICK_S, "cooldown_after_scale_up_s": 0, **policy},
        "prometheus": {"url": "http://127.0.0.1:1", "timeout_s": 0.5},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _write_rates(path: Path, **rates: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rates))
    os.replace(tmp, path)


def _start(tmp: Path, *extra: str) -> ServiceProcess:
    return ServiceProcess(
        [
            "-m",
            "tests.service.serve_fake",
            "--config",
            str(tmp / "config.yaml"),
            "--state-file",
            str(tmp / "state.json"),
            "--rates-file",
            str(tmp / "rates.json"),
            *extra,
        ],
        cwd=str(ROOT),
    )


@pytest.mark.slow
def test_sigterm_completes_in_flight_calls_and_exits_0(tmp_path: Path) -> None:
    _write_config(tmp_path / "config.yaml")
    _write_rates(tmp_path / "rates.json", demo=10.0)
    marker = tmp_path / "saving"
    grace_s = 8.0
    svc = _start(tmp_path, "--slow-save-s", "1.5", "--marker", str(marker), "--grace-s", "8")
    try:
        port = svc.port()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        wait_until(lambda: keda_replicas(channel), 20, "the first decision")
        admin = pb_grpc.AdminServiceStub(channel)
        got = admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5)
        target = pb.ModelTarget()
        target.CopyFrom(got.target)
        target.sla.itl_p95_ms = 42
        watch = pb_grpc.BatchingServiceStub(channel).WatchBatchingConfig(
            pb.GetBatchingConfigRequest(model="demo"), timeout=30
        )
        first = next(iter(watch))
        assert first.model == "demo"
        # no save before this call (checked before it is sent: once sent, its own save
        # writes the marker at once on a quick server, which read as a save too early)
        assert not marker.exists(), marker.read_text()
        future = admin.SetTarget.future(pb.SetTargetRequest(target=target), timeout=20)
        wait_until(marker.exists, 10, "the SetTarget call to be in flight")
        sent = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)
        resp = future.result(timeout=20)  # the in-flight call completes normally
        assert resp.target.sla.itl_p95_ms == 42
        rest = list(watch)  # the stream ends with OK (not cancelled, not an error)
        assert watch.code() == grpc.StatusCode.OK, (watch.details(), rest, svc.output()[-3000:])
        code = svc.proc.wait(timeout=grace_s + 10)
        elapsed = time.monotonic() - sent
        assert code == 0, svc.output()[-3000:]
        assert elapsed < grace_s, f"took {elapsed:.1f}s, grace {grace_s}s"
        channel.close()
        stored = json.loads((tmp_path / "state.json").read_text())
        assert stored["targets"]["models"][0]["sla"]["itl_p95_ms"] == 42  # flushed
        assert "demo" in stored["state"]["models"]
    finally:
        svc.kill()


@pytest.mark.slow
def test_kill_and_restart_keeps_targets_and_does_not_scale_down(tmp_path: Path) -> None:
    _write_config(tmp_path / "config.yaml", scale_down_stabilization_s=120)
    _write_rates(tmp_path / "rates.json", demo=100.0)
    svc = _start(tmp_path)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{svc.port()}")
        high = wait_until(
            lambda: (r := keda_replicas(channel)) is not None and r >= 5 and r, 30, "scale-up"
        )
        admin = pb_grpc.AdminServiceStub(channel)
        got = admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5)
        got.target.sla.ttft_p95_ms = 950
        admin.SetTarget(pb.SetTargetRequest(target=got.target), timeout=5)
        # let at least one more tick save the state with the new target
        n = len(admin.Explain(pb.ExplainRequest(model="demo"), timeout=5).decisions)
        wait_until(
            lambda: len(admin.Explain(pb.ExplainRequest(model="demo"), timeout=5).decisions) > n,
            10,
            "a tick after the target change",
        )
        high = keda_replicas(channel)
        channel.close()
    finally:
        svc.kill()  # SIGKILL: no shutdown hook runs
    assert svc.proc.returncode == -signal.SIGKILL

    _write_rates(tmp_path / "rates.json", demo=1.0)  # load dropped during the outage
    svc2 = _start(tmp_path)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{svc2.port()}")
        admin = pb_grpc.AdminServiceStub(channel)
        assert keda_replicas(channel) == high  # restored, served at once
        target = admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5).target
        assert target.sla.ttft_p95_ms == 950

        def decisions() -> Any:
            return admin.Explain(pb.ExplainRequest(model="demo"), timeout=5).decisions

        # 10 ticks (~2 s) of low load, well inside the 120 s stabilization window
        history = wait_until(lambda: (d := decisions()) and len(d) >= 10 and d, 30, "10 ticks")
        assert all(d.summary.replicas == high for d in history), [
            d.summary.replicas for d in history
        ]
        # the raw recommendation fell; restored hysteresis (stabilization window or
        # panic hold) kept the replicas
        last = history[-1].summary
        assert last.raw_replicas < high
        held = {"panic:PANIC_HOLD", "stabilize:SCALE_DOWN_STABILIZED"}
        assert held & set(last.stage_reasons), list(last.stage_reasons)
        assert keda_replicas(channel) == high
        channel.close()
        svc2.proc.send_signal(signal.SIGTERM)
        assert svc2.proc.wait(timeout=15) == 0
    finally:
        svc2.kill()


@pytest.mark.slow
def test_governor_run_entry_point_serves_health_metrics_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """`governor run` itself (Prometheus unreachable: decisions hold, service serves)."""
    cfg = _write_config(tmp_path / "config.yaml")
    svc = ServiceProcess(
        [
            "-m",
            "service.cli",
            "run",
            "--config",
            str(cfg),
            "--store",
            "file",
            "--state-file",
            str(tmp_path / "state.json"),
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--shutdown-grace-s",
            "5",
        ],
        cwd=str(ROOT),
    )
    try:
        port, metrics = svc.ports()
        metrics_port = int(metrics)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING

            def ticked() -> bool:
                url = f"http://127.0.0.1:{metrics_port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as r:
                    body = r.read().decode()
                return "governor_ticks_total" in body and "governor_ticks_total 0.0" not in body

            wait_until(ticked, 20, "a tick counted in /metrics")
            # no data from Prometheus: KEDA is told UNAVAILABLE, never a zero
            assert keda_replicas(channel) is None
            # each held decision's stages, the knob step's as stage="knobs"
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                reasons = [
                    line
                    for line in r.read().decode().splitlines()
                    if line.startswith("governor_stage_reasons_total{")
                ]
            assert any('stage="knobs"' in line for line in reasons), reasons
            assert any('stage="raw"' in line for line in reasons), reasons
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(timeout=15) == 0
    finally:
        svc.kill()


def test_governor_run_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write_config(tmp_path / "config.yaml")
    cases = [
        (["run"], "--config"),
        # read as "not given", an empty path ran the demo config and wrote its state
        (["run", "--config", ""], "--config: empty"),
        (["run", "--config", " ", "--simulated-fleet", "synthetic:poisson"], "--config: empty"),
        (["run", "--config", str(cfg), "--grpc-listen", "nowhere"], "HOST:PORT"),
        (["run", "--config", str(cfg), "--metrics-listen", "h:99999"], "port"),
        (["run", "--config", str(tmp_path / "missing.yaml")], "cannot read"),
        (["run", "--simulated-fleet", str(tmp_path / "none.csv")], "not found"),
        (["run", "--simulated-fleet", "synthetic:"], "NAME"),
        (["run", "--config", str(cfg), "--shutdown-grace-s", "0"], "grace"),
        (["run", "--config", str(cfg), "--tick-nice", "-1"], "--tick-nice must be within"),
        (["run", "--config", str(cfg), "--tick-nice", "20"], "--tick-nice must be within"),
        (["run", "--config", str(cfg), "--identity", ""], "--identity: empty"),
        (["run", "--config", str(cfg), "--identity", "  "], "--identity: empty"),
        (
            ["run", "--config", str(cfg), "--leader-election", "on", "--identity", ""],
            "--identity: empty",
        ),
    ]
    for argv, text in cases:
        assert cli_main(argv) == 2, argv
        assert text in capsys.readouterr().err, argv


def test_one_concurrent_rpc_is_refused_and_the_default_streams_leave_unary_slots() -> None:
    """`run --max-concurrent-rpcs 1` defaulted --max-watch-streams to 1: one open watch
    stream held the only slot and every unary call (engines, KEDA, admin, health) was
    refused. Now exit 2 naming the flag; from 2 on the default streams take at most half
    the slots. Checked on the flags alone (nothing is started)."""
    from service.cli import build_parser
    from service.run import _check_flags, _RunError

    def flags(rpcs: str) -> argparse.Namespace:
        argv = ["run", "--config", "c.yaml", "--max-concurrent-rpcs", rpcs]
        return build_parser().parse_args(argv)

    with pytest.raises(_RunError, match=r"--max-concurrent-rpcs must be >= 2 \(got 1\)") as ei:
        _check_flags(flags("1"))
    assert ei.value.code == 2
    for rpcs, streams in (("2", 1), ("3", 1), ("10", 5), ("4096", 1024)):
        args = flags(rpcs)
        _check_flags(args)
        assert args.max_watch_streams == streams < args.max_concurrent_rpcs


def test_engine_args_prints_flags_and_falls_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unreachable controller: the configured defaults, exit 0, quickly."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "name": "m",
                        "deployment": "m",
                        "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 40},
                        "knobs": {
                            "default_max_num_seqs": 64,
                            "default_max_num_batched_tokens": 4096,
                        },
                    }
                ]
            }
        )
    )
    started = time.monotonic()
    code = cli_main(
        ["engine-args", "--model", "m", "--server", "127.0.0.1:1", "--config", str(cfg),
         "--timeout-s", "1"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    assert out.strip() == "--max-num-seqs 64 --max-num-batched-tokens 4096"
    assert "warning" in err and "defaults of 'm'" in err
    assert time.monotonic() - started < 10
    code = cli_main(["engine-args", "--model", "m", "--server", "127.0.0.1:1", "--timeout-s", "1"])
    out, _ = capsys.readouterr()
    assert code == 0 and out.strip() == "--max-num-seqs 256 --max-num-batched-tokens 8192"


def test_simulated_fleet_without_a_name_suggests_names_that_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--simulated-fleet synthetic:` suggested `synthetic:steady`, which is refused as
    unknown: the names suggested are the simulator's own, and each one loads."""
    from simulator.traces import load_trace

    assert cli_main(["run", "--simulated-fleet", "synthetic:"]) == 2
    err = capsys.readouterr().err
    listed = err.split("(one of ", 1)[1].split(")", 1)[0].split(", ")
    assert "synthetic:poisson" in listed and "synthetic:steady" not in err
    for spec in listed:
        load_trace(f"{spec}:duration=30")  # an unknown name raises ValueError


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (
            ["--default-max-num-seqs", "4096", "--default-max-num-batched-tokens", "512"],
            "--default-max-num-batched-tokens 512 is below --default-max-num-seqs 4096: vLLM "
            "refuses a token budget below max_num_seqs",
        ),
        (
            ["--default-max-num-seqs", "10000"],
            "--default-max-num-seqs 10000 is above the built-in default token budget 8192",
        ),
        (
            ["--default-max-num-batched-tokens", "100"],
            "--default-max-num-batched-tokens 100 is below the built-in default max_num_seqs 256",
        ),
        (
            ["--config", "CFG", "--default-max-num-seqs", "2000"],
            "--default-max-num-seqs 2000 is outside [8, 1024], the knob bounds of 'm' in",
        ),
        (
            ["--config", "CFG", "--default-max-num-seqs", "128"],
            "--default-max-num-seqs 128 is above the default token budget 100 of 'm' in",
        ),
    ],
)
def test_engine_args_refuses_fallback_knobs_vllm_refuses(
    flags: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--default-max-num-seqs 4096 --default-max-num-batched-tokens 512` printed a token
    budget below max_num_seqs (vLLM refuses to start on it) and `--default-max-num-seqs
    10000` printed 10000 against the default budget 8192, both exit 0: now exit 2 with
    nothing on stdout, the flags named; with --config naming the model, a default past
    its knob bounds too. Checked before the governor is asked."""
    cfg = tmp_path / "c.yaml"
    knobs = {
        "max_num_batched_tokens_min": 64,
        "default_max_num_seqs": 64,
        "default_max_num_batched_tokens": 100,
    }
    entry = {"name": "m", "deployment": "m", "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 40}}
    cfg.write_text(yaml.safe_dump({"models": [{**entry, "knobs": knobs}]}))
    flags = [str(cfg) if f == "CFG" else f for f in flags]
    server = ["--server", "127.0.0.1:1", "--timeout-s", "1"]
    assert cli_main(["engine-args", "--model", "m", *server, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and needle in err, err
    assert "no answer from" not in err  # refused before the call


def test_engine_args_names_a_model_missing_from_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --config without the model warned with the bare KeyError text ("'m'")."""
    cfg = tmp_path / "c.yaml"
    entry = {"name": "other", "deployment": "o", "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 40}}
    cfg.write_text(yaml.safe_dump({"models": [entry]}))
    argv = ["engine-args", "--model", "m", "--server", "127.0.0.1:1", "--config", str(cfg)]
    assert cli_main([*argv, "--timeout-s", "1", "--default-max-num-seqs", "512"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "--max-num-seqs 512 --max-num-batched-tokens 8192"
    assert f"{cfg}: model 'm' is not in it (its models: other)" in err


@pytest.mark.parametrize("flag", [["-o", "json"], ["--token-file", "t"]])
def test_engine_args_refuses_the_admin_flags(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """engine-args prints the engine's flags and calls the read-only BatchingService:
    an output format or an admin token would be accepted and ignored, so they are refused
    (exit 2, naming the flag) rather than silently dropped."""
    with pytest.raises(SystemExit) as exc:
        cli_main(["engine-args", "--model", "m", "--server", "127.0.0.1:1", *flag])
    assert exc.value.code == 2
    assert flag[0] in capsys.readouterr().err


def test_engine_args_from_a_live_server(capsys: pytest.CaptureFixture[str]) -> None:
    from service.core import ServiceCore
    from tests.service.fakes import FakeClock, FakeSource, make_config, quiet_logger
    from tests.service.harness import ServerThread

    clock = FakeClock()
    log = quiet_logger()
    core = ServiceCore(
        make_config(knob_sustain_s=0), FakeSource({"demo": 20.0}), clock=clock, logger=log
    )
    with ServerThread(core, logger=log) as s:
        core.tick(clock.advance(5))
        knobs = core.board.get("demo").knobs
        code = cli_main(["engine-args", "--model", "demo", "--server", s.address])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out.strip() == " ".join(knobs.engine_args())
        assert knobs.max_num_seqs != 256  # really from the server, not the default
        code = cli_main(["engine-args", "--model", "unknown", "--server", s.address])
        out, err = capsys.readouterr()
        assert code == 0 and "NOT_FOUND" in err
        assert out.strip() == "--max-num-seqs 256 --max-num-batched-tokens 8192"


@pytest.mark.parametrize(
    ("busy_flag", "other_flag", "serving"),
    [
        ("--metrics-listen", "--grpc-listen", "process"),
        ("--metrics-listen", "--grpc-listen", "inline"),
        ("--grpc-listen", "--metrics-listen", "process"),
    ],
)
def test_governor_run_busy_port_names_that_listener_and_exits_1(
    busy_flag: str, other_flag: str, serving: str
) -> None:
    """A port already taken: exit 1, the message names exactly the listener that failed
    (address and flag), and nothing half-started is left to complain at exit."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = f"127.0.0.1:{holder.getsockname()[1]}"
        argv = [sys.executable, "-m", "service.cli", "run", "--simulated-fleet"]
        argv += ["synthetic:poisson", "--store", "memory", "--serving", serving]
        argv += [busy_flag, busy, other_flag, "127.0.0.1:0"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    err = done.stderr
    assert done.returncode == 1, err
    assert f"cannot listen on {busy} for " in err and f"({busy_flag})" in err, err
    assert other_flag not in err, err
    for noise in ("Traceback", "never awaited", "Exception ignored"):
        assert noise not in err, err


def test_a_start_that_cannot_bind_leaves_the_store_unseeded(tmp_path: Path) -> None:
    """A refused start changes nothing: the store is seeded with the config's models
    only once the listeners are bound, so the corrected config of the next start (the
    operator fixed a typo and a port) is the one the store gets, not the failed one's."""
    state = tmp_path / "state.json"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = f"127.0.0.1:{holder.getsockname()[1]}"
        argv = [sys.executable, "-m", "service.cli", "run", "--simulated-fleet"]
        argv += ["synthetic:poisson", "--store", "file", "--state-file", str(state)]
        argv += ["--grpc-listen", busy, "--metrics-listen", "127.0.0.1:0"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on {busy}" in done.stderr
    assert FileStore(state).load_targets() is None


def _thread_nices(pid: int) -> list[int]:
    """The nice of every thread of process `pid` (Linux: a thread id is a PRIO_PROCESS
    target)."""
    nices = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            nices.append(os.getpriority(os.PRIO_PROCESS, int(task.name)))
    return nices


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "nice"), [((), 10), (("--tick-nice", "3"), 3)])
def test_governor_run_nices_only_its_tick_thread_by_tick_nice(
    tmp_path: Path, flags: tuple[str, ...], nice: int
) -> None:
    """`governor run` (serving process): the tick thread runs `--tick-nice` (default
    TICK_NICE, 10) above the process's nice, every other thread of the ticking process
    at the process's own: the listeners there (admin calls, /metrics) and the Lease
    elector keep their priority."""
    cfg = _write_config(tmp_path / "config.yaml")
    svc = ServiceProcess(
        ["-m", "service.cli", "run", "--config", str(cfg), "--store", "memory",
         "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", *flags],
        cwd=str(ROOT),
    )  # fmt: skip
    try:
        svc.ports()
        base = os.getpriority(os.PRIO_PROCESS, svc.proc.pid)
        niced = wait_until(
            lambda: [n for n in _thread_nices(svc.proc.pid) if n != base] or None,
            20,
            "the tick thread (started at the first tick)",
        )
        assert niced == [min(19, base + nice)]
    finally:
        svc.kill()
