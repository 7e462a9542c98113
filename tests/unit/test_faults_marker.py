"""The fault suite's plugin fails a test that lacks its `fault_case` marker, whether the
test itself passes or fails (a strict xfail let an unmarked failing test pass)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).parents[1] / "faults" / "conftest.py"


def test_unmarked_fault_tests_fail_passing_or_not(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_cases="""
def test_unmarked_passes():
    assert True

def test_unmarked_fails():
    assert False
"""
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)  # failed at setup: neither passes
    result.stdout.fnmatch_lines(["*every test needs @pytest.mark.fault_case*"])
