"""The robustness matrix (`governor simulate --matrix`): goals per row, the table, and a
quick smoke run of the whole machinery (process pool, oracle once per trace and plant)."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.matrix import CONDITIONS, TRACES, row_goals


def _cell(att: float, gpu_h: float, flaps: int = 0, ratio: float | None = None) -> dict[str, Any]:
    return {"slo_attainment": att, "gpu_hours": gpu_h, "flaps": flaps, "oracle_ratio": ratio}


def test_smooth_row_goals() -> None:
    row = {
        "smooth": True,
        "policies": {
            "governor": _cell(0.995, 10.0, 0, 1.2),
            "hpa-queue": _cell(0.995, 9.0, 2, 1.1),  # as good, cheaper: dominates
            "static": _cell(1.0, 5.0, 0, 0.6),  # static knows the future: never counted
        },
    }
    goals = row_goals(row)
    assert goals["attainment >= 99 %"] and goals["GPU-h <= 1.3x oracle"] and goals["0 flaps"]
    assert goals["not dominated (hpa-queue)"] is False
    row["policies"]["governor"] = _cell(0.98, 10.0, 1, 1.4)
    goals = row_goals(row)
    assert not any(v for k, v in goals.items() if k != "not dominated")


def test_bursty_row_goals() -> None:
    row = {
        "smooth": False,
        "policies": {
            "governor": _cell(0.92, 17.0, 1),
            "hpa-queue": _cell(0.91, 22.0, 6),
            "hpa-gpu": _cell(0.73, 6.0, 1),
        },
    }
    goals = row_goals(row)
    assert goals == {
        "attainment >= hpa-queue": True,
        "GPU-h < hpa-queue": True,
        "flaps <= hpa-gpu": True,
        "not dominated": True,
    }
    row["policies"]["hpa-gpu"]["flaps"] = 0
    assert row_goals(row)["flaps <= hpa-gpu"] is False


def test_the_matrix_covers_the_issue_conditions() -> None:
    assert [t.key for t in TRACES] == ["conv x16", "code x4", "long-context", "diurnal"]
    assert [c.name for c in CONDITIONS] == [
        "default",
        "start 4",
        "scrape 5 s",
        "scrape 30 s",
        "speed 0.7",
        "speed 1.3",
        "cold start 2x",
    ]


def test_matrix_traces_filter_refuses_unknown_keys(capsys) -> None:  # type: ignore[no-untyped-def]
    from service.cli import main

    assert main(["simulate", "--matrix", "--matrix-traces", "conv x16,nope"]) == 2
    err = capsys.readouterr().err
    assert "--matrix-traces: unknown nope" in err and "long-context" in err


@pytest.mark.slow
def test_oracle_ratio_is_over_the_trace_and_missed_rows_are_plotted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A tiny matrix (a 2-minute step from 4 to 24 req/s that one replica cannot absorb
    behind a 90 s cold start): the ratio to the oracle is taken over the trace's minutes
    (the oracle's window), the whole run's (with the drain tail) beside it, and every row
    with a goal missed gets a PNG."""
    from simulator.matrix import Condition, MatrixSpec, MatrixTrace, run_matrix

    spec = MatrixSpec(
        traces=(
            MatrixTrace(
                "step",
                "synthetic:step:low=4,high=24,at=0.25,duration=120",
                1.0,
                500.0,
                50.0,
                smooth=True,
            ),
        ),
        conditions=(Condition("default"), Condition("cold start 2x", cold_start_factor=2.0)),
        policies=("governor", "hpa-queue"),
        workers=1,
        plots_dir=str(tmp_path),
    )
    doc = run_matrix(spec)
    missed_rows = 0
    for row in doc["rows"]:
        for cell in row["policies"].values():
            assert cell["gpu_hours_trace"] < cell["gpu_hours"]  # the tail is not in it
            assert cell["oracle_ratio"] == cell["gpu_hours_trace"] / row["oracle_gpu_hours"]
            assert cell["oracle_ratio_run"] == cell["gpu_hours"] / row["oracle_gpu_hours"]
        name = f"step_{row['condition']}".replace(" ", "-") + ".png"
        missed = not all(row["goals"].values())
        missed_rows += missed
        assert (tmp_path / name).exists() == missed
    assert missed_rows >= 1 and len(doc["plots"]) == missed_rows
