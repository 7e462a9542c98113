"""`governor simulate|demo --policy-from FILE`: the governor runs with the scaling policy
of an operator's own config file (the file `governor run` reads), in a single run and in
every cell of a matrix; a file the service would refuse, or one that contradicts the
simulated deployment, is refused before anything runs, naming what is wrong."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from controller.config import ScalingPolicy
from service.cli import main
from simulator.cli_args import policy_from_args
from simulator.matrix import (
    CONDITIONS,
    TRACES,
    MatrixSpec,
    _document,
    _spec_doc,
    matrix_table,
    scenario_for,
)
from simulator.oracle import OracleResult

_MODEL = "{name: %s, deployment: %s, sla: {ttft_p95_ms: 500, itl_p95_ms: 50}%s}"


def _config(
    tmp_path: Path, policy: str = "", models: tuple[str, ...] = ("chat",), **over: str
) -> Path:
    """A governor config file: `models` (each with the per-model policy `over[name]`, a
    YAML flow mapping) and the global `policy` (YAML flow mapping text, or none)."""
    lines = ["models:"]
    for m in models:
        extra = f", policy: {over[m]}" if m in over else ""
        lines.append("  - " + _MODEL % (m, m, extra))
    if policy:
        lines.append(f"policy: {policy}")
    path = tmp_path / "governor.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _args(path: Path | None, model: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(policy_from=None if path is None else str(path), policy_model=model)


def test_the_file_s_global_policy_with_its_model_s_overrides(tmp_path: Path) -> None:
    """The global policy, then the named (or only) model's overrides on top; no file:
    the built-in defaults."""
    one = _config(
        tmp_path,
        "{tolerance_frac: 0.2, cooldown_after_scale_up_s: 300}",
        **{"chat": "{tolerance_frac: 0.05}"},
    )
    got = policy_from_args(_args(one), [15.0])
    assert (got.tolerance_frac, got.cooldown_after_scale_up_s) == (0.05, 300.0)
    assert got.scale_down_stabilization_s == ScalingPolicy().scale_down_stabilization_s
    two = _config(tmp_path, "{tolerance_frac: 0.2}", ("a", "b"), b="{tolerance_frac: 0.3}")
    assert policy_from_args(_args(two, "a"), [15.0]).tolerance_frac == 0.2
    assert policy_from_args(_args(two, "b"), [15.0]).tolerance_frac == 0.3
    assert policy_from_args(_args(None), [15.0]) == ScalingPolicy()


@pytest.mark.parametrize(
    ("policy", "models", "model", "scrapes", "live", "says"),
    [
        pytest.param(
            "",
            ("a", "b"),
            None,
            [15.0],
            False,
            "has 2 models (a, b): name the one",
            id="several-models-none-named",
        ),
        pytest.param("", ("a", "b"), "c", [15.0], False, "--policy-model c: ", id="unknown-model"),
        pytest.param(
            "{tolerance_frac: 2}",
            ("a",),
            None,
            [15.0],
            False,
            "policy.tolerance_frac: Input should be less than 1",
            id="invalid-field",
        ),
        pytest.param(
            "{toleranse_frac: 0.2}",
            ("a",),
            None,
            [15.0],
            False,
            "policy.toleranse_frac: unknown key",
            id="misspelt-field",
        ),
        pytest.param(
            "{window_s: 40}",
            ("a",),
            None,
            [5.0, 30.0],
            None,
            "with a 30 s scrape: policy.window_s (40.0) must be >= 2 x",
            id="scrape",
        ),
        pytest.param(
            "{knobs_live: true}",
            ("a",),
            None,
            [15.0],
            False,
            "sets policy.knobs_live: true, but the simulated engines do not",
            id="knobs",
        ),
        pytest.param(
            "{knobs_live: false}",
            ("a",),
            None,
            [15.0],
            True,
            "(drop --live-knobs, or remove the field)",
            id="knobs-flag",
        ),
    ],
)
def test_a_file_that_cannot_apply_is_refused_naming_why(
    tmp_path: Path,
    policy: str,
    models: tuple[str, ...],
    model: str | None,
    scrapes: list[float],
    live: bool | None,
    says: str,
) -> None:
    path = _config(tmp_path, policy, models)
    with pytest.raises(ValueError, match="--policy-") as exc:
        policy_from_args(_args(path, model), scrapes, live)
    assert says in str(exc.value)


def test_what_the_file_need_not_say_is_not_refused(tmp_path: Path) -> None:
    """knobs_live left out of the file follows the plant either way; a window that spans
    two of every scrape the run has passes; a matrix (live None) takes any knobs_live."""
    path = _config(tmp_path, "{window_s: 60}")
    assert policy_from_args(_args(path), [5.0, 30.0], True).window_s == 60.0
    knobs = _config(tmp_path, "{knobs_live: true}")
    assert policy_from_args(_args(knobs), [15.0], None).knobs_live is True


def test_the_readme_s_example_file_is_a_valid_policy_file(tmp_path: Path) -> None:
    """The README's `my-governor.yaml` is a config `--policy-from` takes as written, and
    so is the shipped example it points to, with its model's own override on top."""
    readme = Path("README.md").read_text()
    start = readme.index("# my-governor.yaml")
    path = tmp_path / "my-governor.yaml"
    path.write_text(readme[start : readme.index("```", start)])
    got = policy_from_args(_args(path), [15.0])
    assert got == ScalingPolicy(scale_down_stabilization_s=180.0)
    # The Configuration section's example: the shipped config's code-assistant model.
    assert "--policy-from examples/governor.yaml --policy-model code-assistant" in readme
    example = policy_from_args(_args(Path("examples/governor.yaml"), "code-assistant"), [15.0])
    assert (example.scale_down_stabilization_s, example.scale_to_zero_idle_s) == (600.0, 900.0)


def test_simulate_runs_the_governor_on_the_file_s_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same run with a policy that sizes for half the load per replica costs more
    GPU-hours (the policy reached the decider), and the JSON and the printout say which
    fields were off the defaults; bad flags change nothing and exit 2."""
    argv = [
        "simulate",
        "--trace",
        "synthetic:poisson:rate=30,duration=180",
        "--no-oracle",
        "--policies",
        "governor",
        "--no-progress",
    ]
    assert main([*argv, "--json", str(tmp_path / "default.json")]) == 0
    path = _config(tmp_path, "{target_utilization_frac: 0.5, tolerance_frac: 0.1}")
    out = tmp_path / "file.json"
    assert main([*argv, "--json", str(out), "--policy-from", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "fields off the defaults: target_utilization_frac=0.5" in printed
    doc = json.loads(out.read_text())
    base = json.loads((tmp_path / "default.json").read_text())
    assert doc["scenario"]["governor_policy"] == {"target_utilization_frac": 0.5}
    assert "governor_policy" not in base["scenario"]
    assert (
        doc["policies"]["governor"]["gpu_hours"] > 1.2 * base["policies"]["governor"]["gpu_hours"]
    )
    assert main([*argv, "--policy-model", "chat"]) == 2
    assert "--policy-model chat: read only with --policy-from" in capsys.readouterr().err
    assert main(["demo", "--policy-from", str(tmp_path / "none.yaml"), "--out", str(tmp_path)]) == 2
    assert "governor demo: --policy-from" in capsys.readouterr().err


def test_every_matrix_cell_runs_the_file_s_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spec's policy reaches each cell's scenario; a default spec's document has no
    policy entry (the committed matrices stay as they were); a rerun against a base
    records its own policy, not the base's, with knobs_live left to each condition."""
    policy = ScalingPolicy(tolerance_frac=0.2)
    spec = MatrixSpec(traces=TRACES[3:], conditions=CONDITIONS[:1], governor_policy=policy)
    assert scenario_for(spec, TRACES[3], CONDITIONS[0]).governor_policy == policy
    assert _spec_doc(spec)["governor_policy"] == {"tolerance_frac": 0.2}
    assert "governor_policy" not in _spec_doc(MatrixSpec())
    path = _config(
        tmp_path,
        "{target_utilization_frac: 0.5, knobs_live: true, scale_down_stabilization_s: 120}",
    )
    out = tmp_path / "m.json"
    args = ["simulate", "--matrix-quick", "--matrix-base", "docs/matrix-quick.json"]
    assert main([*args, "--policy-from", str(path), "--json", str(out), "--no-progress"]) == 0
    got = json.loads(out.read_text())
    committed = json.loads(Path("docs/matrix-quick.json").read_text())
    assert got["spec"]["governor_policy"] == {
        "target_utilization_frac": 0.5,
        "scale_down_stabilization_s": 120.0,
    }
    assert "oracle_hold_s" not in got["spec"]  # the base's oracle figures, held 300 s
    gpu = [r["policies"]["governor"]["gpu_hours"] for r in got["rows"]]
    was = [r["policies"]["governor"]["gpu_hours"] for r in committed["rows"]]
    assert sum(gpu) > 1.2 * sum(was)
    printed = capsys.readouterr().out
    changed = "scale_down_stabilization_s=120.0, target_utilization_frac=0.5"
    assert f"fields off the defaults: {changed}" in printed
    assert "| oracle held 300 s / no flap |" in printed
    assert "knobs_live" not in printed


@pytest.mark.parametrize(("hold_s", "held"), [(300.0, 9 / 5), (120.0, 7 / 5), (0.0, 1.0)])
def test_the_oracle_is_held_through_the_file_s_scale_down_window(
    hold_s: float, held: float
) -> None:
    """A matrix run on a policy with another scale-down window holds the oracle's counts
    through that window ("oracle held" and "no flap"), records it (only off the default,
    so the committed matrices stay as they are) and says it in the column's header."""
    spec = MatrixSpec(
        traces=TRACES[3:],
        conditions=CONDITIONS[:1],
        policies=("governor",),
        governor_policy=ScalingPolicy(scale_down_stabilization_s=hold_s),
    )
    tr, cond = TRACES[3], CONDITIONS[0]
    orc = OracleResult(gpu_hours=5 / 60, window_s=60.0, replicas=[3, 1, 1])
    cell = {"slo_attainment": 0.995, "gpu_hours": 0.1, "gpu_hours_trace": 0.1, "flaps": 0}
    results = {(tr.key, cond.name, "governor"): cell}
    doc = _document(spec, results, {(tr.key, *cond.oracle_plant): orc}, 0.0)
    row = doc["rows"][0]
    assert row["oracle_held_ratio"] == pytest.approx(held)
    assert row["oracle_flap_free_ratio"] == orc.flap_free_ratio(hold_s, 600.0, 1)
    assert doc["spec"].get("oracle_hold_s") == (None if hold_s == 300.0 else hold_s)
    assert f"| oracle held {hold_s:g} s / no flap |" in matrix_table(doc)
