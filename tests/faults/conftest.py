"""The fault suite's report: every test in tests/faults declares one case with
`@pytest.mark.fault_case(area, case, checked)`; this plugin records the outcome, the
duration and the numbers a test adds with the `fault_note` fixture, and at the end of
the session writes `out/faults.json` and `out/faults.md` (the README table "Faults and
bad input", rendered by scripts/faults_report.py). `GOVERNOR_FAULTS_OUT` overrides the
folder. A test without the marker fails: every case must say what it checks.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_RECORDS = pytest.StashKey[list[dict[str, Any]]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fault_case(area, case, checked): a fault-suite case and what it checks (report row)",
    )
    config.stash[_RECORDS] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A failure, not an expected failure: a strict xfail would let an unmarked test that
    # fails pass silently.
    here = Path(__file__).parent
    if here in Path(str(item.fspath)).parents and item.get_closest_marker("fault_case") is None:
        pytest.fail("tests/faults: every test needs @pytest.mark.fault_case", pytrace=False)


@pytest.fixture
def fault_note(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """`fault_note("1,000 streams, 0 errors")`: a number for the report's result column."""

    def note(text: str) -> None:
        request.node.user_properties.append(("fault_note", text))

    return note


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    marker = item.get_closest_marker("fault_case")
    if marker is None:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        area, case, checked = ([*list(marker.args), "", "", ""])[:3]
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            case = f"{case} [{callspec.id}]"
        notes = [v for k, v in item.user_properties if k == "fault_note"]
        if report.outcome == "failed" and report.longrepr is not None:
            first = str(report.longrepr).strip().splitlines()[-1:]
            notes.append(f"error: {first[0][:200]}" if first else "error")
        item.config.stash[_RECORDS].append(
            {
                "test": item.nodeid,
                "area": area,
                "case": case,
                "checked": checked,
                "outcome": report.outcome,
                "duration_s": round(report.duration, 2),
                "notes": notes,
                "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            }
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    records = session.config.stash.get(_RECORDS, [])
    if not records:
        return
    spec = importlib.util.spec_from_file_location(
        "faults_report", ROOT / "scripts" / "faults_report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = Path(os.environ.get("GOVERNOR_FAULTS_OUT") or ROOT / "out")
    module.write_report(records, out)
