"""scripts/faults_report.py: a case run with several parameters is one row and one case
in the totals (a new parameter must not make a case count twice)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "faults_report", ROOT / "scripts" / "faults_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(case: str, outcome: str = "passed") -> dict[str, Any]:
    return {
        "test": f"tests/faults/test_x.py::{case}",
        "area": "Security",
        "case": case,
        "checked": "what",
        "outcome": outcome,
        "duration_s": 1.0,
        "notes": [],
        "when": "2026-11-30 18:00 UTC",
    }


def test_parametrized_runs_are_one_row_and_one_case() -> None:
    report = _module().render(
        [
            _record("a separate admin listener (--admin-listen) [inline]"),
            _record("a separate admin listener (--admin-listen) [process]"),
            _record("no admin token configured"),
        ]
    )
    rows = [line for line in report.splitlines() if line.startswith("| Security")]
    assert len(rows) == 2
    assert "pass (2/2: inline, process)" in rows[0]
    assert "2 of 2 cases passed (3 test runs) in 3 s" in report


def test_a_case_with_one_failed_run_is_not_passed() -> None:
    report = _module().render(
        [
            _record("listener [inline]"),
            _record("listener [process]", "failed"),
        ]
    )
    assert "FAIL (1/2: inline, process); failed: process" in report
    assert "0 of 1 cases passed (2 test runs)" in report
