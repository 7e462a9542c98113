"""The engines the chart starts follow the knobs live (engine.liveKnobs), and the governor's
prometheus.scrape_interval_s is the interval the chart's monitors scrape at."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import GovernorConfig
from tests.helm.chart import (
    FULLNAME,
    MODEL_8B,
    MODEL_OTHER_NS,
    container,
    helm,
    one,
    render,
    values,
)

PLUGIN = "/run/governor/plugin"


def _engine_pod(**overrides: Any) -> dict[str, Any]:
    objs = render(values(models=[MODEL_8B], exampleEngine={"enabled": True}, **overrides))
    return one(objs, "Deployment", MODEL_8B["deployment"])["spec"]["template"]["spec"]


def _env(c: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in c.get("env") or []}


def test_live_knobs_by_default_plugin_on_the_engines_pythonpath() -> None:
    pod = _engine_pod()
    init = container(pod, "governor-engine-args", init=True)
    script = init["args"][0]
    assert f"--live --plugin-dir {PLUGIN} --default-max-num-seqs-ceiling 512 >" in script
    vllm = container(pod, "vllm")
    assert _env(vllm)["PYTHONPATH"] == PLUGIN
    assert "$(cat /run/governor/engine-args)" in vllm["args"][0]
    # The plugin lies in the hand-over volume: written by the init container, read by vLLM.
    init_mount = next(m for m in init["volumeMounts"] if m["name"] == "governor-engine-args")
    vllm_mount = next(m for m in vllm["volumeMounts"] if m["name"] == "governor-engine-args")
    assert PLUGIN.startswith(init_mount["mountPath"] + "/") and not init_mount.get("readOnly")
    assert PLUGIN.startswith(vllm_mount["mountPath"] + "/")
    vol = next(v for v in pod["volumes"] if v["name"] == "governor-engine-args")
    assert vol["emptyDir"]["sizeLimit"] == "8Mi", "room for the plugin's packages"


def test_live_knobs_off_starts_the_engine_with_start_only_flags() -> None:
    pod = _engine_pod(engine={"liveKnobs": False})
    script = container(pod, "governor-engine-args", init=True)["args"][0]
    assert "--live" not in script and "--plugin-dir" not in script
    assert "PYTHONPATH" not in _env(container(pod, "vllm"))


def _models(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    text = one(objs, "ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"]
    cfg = GovernorConfig.model_validate(yaml.safe_load(text))
    return {m.name: cfg.policy_for(m).model_dump() for m in cfg.models}


@pytest.mark.parametrize(
    ("over", "live"),
    [
        # the example engine runs the first model: only its engines follow knobs live
        ({"exampleEngine": {"enabled": True}}, {MODEL_8B["name"]: True, "qwen-72b": False}),
        (
            {"exampleEngine": {"enabled": True, "model": "qwen-72b"}},
            {MODEL_8B["name"]: False, "qwen-72b": True},
        ),
        # sidecar mode: every model's engines carry the chart's templates
        ({"mode": "sidecar"}, {MODEL_8B["name"]: True, "qwen-72b": True}),
        # engines the chart does not start, start-only engines, an operator's own setting
        ({}, {MODEL_8B["name"]: False, "qwen-72b": False}),
        (
            {"mode": "sidecar", "engine": {"liveKnobs": False}},
            {MODEL_8B["name"]: False, "qwen-72b": False},
        ),
        (
            {"mode": "sidecar", "models": [dict(MODEL_8B, policy={"knobs_live": False})]},
            {MODEL_8B["name"]: False},
        ),
    ],
)
def test_the_governor_knows_which_engines_follow_knobs_live(
    over: dict[str, Any], live: dict[str, bool]
) -> None:
    """policy.knobs_live (no roll-outs; new knobs on every replica at once) for exactly the
    models whose engines the chart starts with engine.liveKnobs."""
    got = _models(render(values(**{"models": [MODEL_8B, MODEL_OTHER_NS], **over})))
    assert {name: pol["knobs_live"] for name, pol in got.items()} == live


def test_live_knobs_must_be_a_boolean() -> None:
    with pytest.raises(helm.HelmError, match="liveKnobs"):
        render(values(engine={"liveKnobs": "yes"}))


def _run_script(script: str, tmp_path: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    script = script.replace("/run/governor", str(run_dir))
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "GOVERNOR_MODEL": MODEL_8B["name"],
        "GOVERNOR_SERVER": "127.0.0.1:9",  # nobody listens: the governor is down
        "HOME": str(tmp_path),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    done = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    return (run_dir / "engine-args").read_text(), done


def test_live_script_with_the_real_cli_and_no_governor(tmp_path: Path) -> None:
    """The rendered init script, run by /bin/sh with the real `governor` CLI and no
    governor reachable: exit 0, the live flags, both packages copied and importable."""
    script = container(_engine_pod(), "governor-engine-args", init=True)["args"][0]
    flags, done = _run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    argv = shlex.split(flags)
    # No governor: the model's knob bound (MODEL_8B: max_num_seqs_max 512), not the default.
    assert argv[:2] == ["--max-num-seqs", "512"], argv
    assert argv[argv.index("--scheduler-cls") + 1].startswith("governor_engine.")
    assert argv[argv.index("--middleware") + 1].startswith("governor_engine.")
    plugin = tmp_path / "run" / "plugin"
    probe = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "import governor_engine, governor_api; print(governor_engine.__file__)",
            str(plugin),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0 and probe.stdout.startswith(str(plugin)), probe.stderr


def test_live_script_falls_back_when_the_plugin_cannot_be_copied(tmp_path: Path) -> None:
    """A plugin that cannot be copied must not make vLLM fail on --scheduler-cls's import:
    the script prints the start-only flags instead (the model's default knobs)."""
    script = container(_engine_pod(), "governor-engine-args", init=True)["args"][0]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "plugin").write_text("not a directory")
    flags, done = _run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--scheduler-cls" not in flags and "--middleware" not in flags, flags
    assert "--max-num-seqs 128" in flags, flags  # MODEL_8B's knobs.default_max_num_seqs
    assert "plugin packages missing" in done.stderr


def _config(**overrides: Any) -> GovernorConfig:
    objs = render(values(**overrides))
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {}))
    return GovernorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))


@pytest.mark.parametrize(("interval", "seconds"), [("15s", 15.0), ("30s", 30.0), ("500ms", 0.5)])
def test_scrape_interval_is_the_monitors_interval(interval: str, seconds: float) -> None:
    mon = {"serviceMonitor": {"enabled": True, "interval": interval}}
    cfg = _config(monitoring=mon, exampleEngine={"enabled": True})
    assert cfg.prometheus.scrape_interval_s == seconds
    objs = render(values(monitoring=mon, exampleEngine={"enabled": True}))
    assert one(objs, "ServiceMonitor")["spec"]["endpoints"][0]["interval"] == interval
    assert one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["interval"] == interval


def test_scrape_interval_left_alone_without_the_monitors() -> None:
    assert _config(prometheus={"scrape_interval_s": 30}).prometheus.scrape_interval_s == 30
    # Equal values are no conflict.
    mon = {"serviceMonitor": {"enabled": True, "interval": "30s"}}
    assert _config(monitoring=mon, prometheus={"scrape_interval_s": 30})


def test_inconsistent_scrape_interval_is_refused_at_install() -> None:
    mon = {"serviceMonitor": {"enabled": True, "interval": "15s"}}
    with pytest.raises(helm.HelmError, match=r"scrape_interval_s \(30\) disagrees"):
        render(values(monitoring=mon, prometheus={"scrape_interval_s": 30}))
    slow = {"serviceMonitor": {"enabled": True, "interval": "1m"}}
    with pytest.raises(helm.HelmError, match=r"policy.max_staleness_s \(90\) must be >= 2 x"):
        render(values(monitoring=slow))
    assert (
        _config(
            monitoring=slow, policy={"max_staleness_s": 120, "window_s": 120}
        ).prometheus.scrape_interval_s
        == 60
    )


def test_scrape_interval_change_restarts_the_governor() -> None:
    def checksum(interval: str) -> str:
        dep = one(
            render(values(monitoring={"serviceMonitor": {"enabled": True, "interval": interval}})),
            "Deployment",
        )
        return dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum("15s") != checksum("30s")
