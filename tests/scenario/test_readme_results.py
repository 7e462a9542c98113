"""The README's result tables are the committed matrix runs (docs/matrix-quick.json, and
docs/matrix.json and docs/matrix-combined.json when the full and combined matrices are
committed), and seeded reruns reproduce that JSON within a stated tolerance, so neither
the README nor the JSON can drift from the code.

Tolerance: SLO attainment within 0.5 percentage points, GPU-hours within 5 %, the
governor's learned speed within 0.02, flaps exact. The runs are seeded and deterministic;
the slack absorbs floating-point differences across platforms, not behaviour changes. A
flap is a whole decision, and a goal ("0 flaps", "flaps <= hpa-gpu") counts it: one
more or fewer is a behaviour change (the cooldown after a scale-up at 60 s instead of
600 s adds one to the conversation cell rerun below and to two quick cells). After
a change that moves these numbers, rerun `governor simulate --matrix-quick --json
docs/matrix-quick.json` (and the full and combined matrices, `--matrix --json
docs/matrix.json`, `--matrix-combined --json docs/matrix-combined.json`) and paste the
printed tables into the README.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from simulator.matrix import (
    COMBINED_CONDITIONS,
    CONDITIONS,
    TRACES,
    MatrixSpec,
    MatrixSummary,
    condition_doc,
    matrix_table,
    scenario_for,
)
from simulator.scenario import run_policy

ROOT = Path(__file__).resolve().parents[2]
QUICK_JSON = ROOT / "docs" / "matrix-quick.json"
FULL_JSON = ROOT / "docs" / "matrix.json"
COMBINED_JSON = ROOT / "docs" / "matrix-combined.json"
README = ROOT / "README.md"
# The cheapest cells of the full matrix (the others take minutes of CPU each).
FULL_RERUN = (
    ("conv x16", "default", "governor"),  # the start-up ramp: no reversal within 10 min
    ("long-context", "default", "governor"),
    ("long-context", "default", "hpa-queue"),
    ("diurnal", "default", "governor"),
    ("diurnal", "knobs live", "governor"),  # the engines' live knob path, end to end
    ("diurnal", "random routing", "governor"),  # kube-proxy's random endpoint
    ("diurnal", "overhead 200 ms", "governor"),  # the overhead learned from the histograms
    ("diurnal", "slows 1.3x midway", "governor"),  # the plant changed mid-run
)
COMBINED_RERUN = (("diurnal", "slow + cold 2x", "governor"),)
"""A cheap cell of the combined matrix."""


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _same(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    assert got["slo_attainment"] == pytest.approx(want["slo_attainment"], abs=0.005), where
    assert got["gpu_hours"] == pytest.approx(want["gpu_hours"], rel=0.05), where
    assert got["flaps"] == want["flaps"], where
    if want.get("learned_speed") is None:
        assert got.get("learned_speed") is None, where
    else:
        assert got["learned_speed"] == pytest.approx(want["learned_speed"], abs=0.02), where


def test_readme_shows_the_committed_matrices() -> None:
    text = README.read_text()
    assert matrix_table(_load(QUICK_JSON)) in text
    for path in (FULL_JSON, COMBINED_JSON):
        if path.exists():
            assert matrix_table(_load(path)) in text, path


SUMMARY = re.compile(r"<!-- results-summary.*?-->(.*?)<!-- /results-summary -->", re.S)
"""The README's prose on each matrix, in README order: the full one's block, the combined
one's, the quick one's."""
NUMBER = re.compile(r"\b\d+\.\d+(?: %|x)")
"""An attainment ("98.01 %") or a multiple ("1.26x") as the tables print them."""


def test_readme_summaries_quote_only_the_tables() -> None:
    """Every "N.NN %" and "N.NNx" in the README's summary of a matrix is a value of that
    matrix's table, so the prose beside a table cannot drift from it either (a changed
    decision that moves a quoted cell fails here until the prose is rewritten)."""
    blocks = SUMMARY.findall(README.read_text())
    assert len(blocks) == 3
    for block, path in zip(blocks, (FULL_JSON, COMBINED_JSON, QUICK_JSON), strict=True):
        cells = set(NUMBER.findall(matrix_table(_load(path))))
        quoted = NUMBER.findall(block)
        assert quoted, path
        assert [n for n in quoted if n not in cells] == [], path


def test_readme_goals_met_lines_count_the_tables() -> None:
    text = " ".join(README.read_text().split())
    for path in (FULL_JSON, COMBINED_JSON, QUICK_JSON):
        s = MatrixSummary.of(_load(path))
        assert f"Goals met: {s.met} of {s.goals} over {s.rows} rows, {s.out_of_reach} of" in text


def test_committed_matrices_are_the_current_specs() -> None:
    """The full matrix may be committed for some of its traces (`--matrix-traces`), in the
    spec's order, each under every condition."""
    specs = (
        (QUICK_JSON, MatrixSpec.quick()),
        (FULL_JSON, MatrixSpec()),
        (COMBINED_JSON, MatrixSpec.combined()),
    )
    for path, spec in specs:
        if not path.exists():
            continue
        doc = _load(path)
        known = [dataclasses.asdict(t) for t in spec.traces]
        got = doc["spec"]["traces"]
        assert got and got == [t for t in known if t in got], path
        assert doc["spec"]["conditions"] == [condition_doc(c) for c in spec.conditions]
        assert len(doc["rows"]) == len(got) * len(spec.conditions)


@pytest.mark.slow
def test_seeded_quick_matrix_reproduces_the_readme(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every cell of the quick matrix, rerun through the CLI (2 worker processes, about a
    minute): the table is printed, the JSON written, and every cell matches the README's."""
    out = tmp_path / "m.json"
    assert main(["simulate", "--matrix-quick", "--no-progress", "--json", str(out)]) == 0
    got, want = _load(out), _load(QUICK_JSON)
    printed = capsys.readouterr().out
    assert matrix_table(got) in printed and "goals met" in printed
    assert len(got["rows"]) == len(want["rows"])
    for g_row, w_row in zip(got["rows"], want["rows"], strict=True):
        assert (g_row["trace"], g_row["condition"]) == (w_row["trace"], w_row["condition"])
        assert g_row["oracle_gpu_hours"] == pytest.approx(w_row["oracle_gpu_hours"], rel=0.05)
        for name, cell in w_row["policies"].items():
            _same(g_row["policies"][name], cell, f"{w_row['trace']}/{w_row['condition']}/{name}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "trace", "condition", "policy"),
    [(FULL_JSON, *c) for c in FULL_RERUN] + [(COMBINED_JSON, *c) for c in COMBINED_RERUN],
)
def test_seeded_rerun_reproduces_a_committed_matrix_cell(
    path: Path, trace: str, condition: str, policy: str
) -> None:
    if not path.exists():
        pytest.skip(f"{path.name} is not committed")
    row = next(
        r for r in _load(path)["rows"] if r["trace"] == trace and r["condition"] == condition
    )
    tr = next(t for t in TRACES if t.key == trace)
    cond = next(c for c in (*CONDITIONS, *COMBINED_CONDITIONS) if c.name == condition)
    got = run_policy(policy, scenario_for(MatrixSpec(), tr, cond)).summary()
    _same(got, row["policies"][policy], f"{trace}/{condition}/{policy}")
