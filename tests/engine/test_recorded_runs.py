"""The recorded real-engine runs (tests/engine/recorded.py) replayed through today's
decider, against the README's table of them.

No engine runs here: each run's Prometheus samples (kept in tests/engine/data/runs) are
written into TSDB blocks by the real `promtool` and read by a real Prometheus, and a
`ControlLoop` of today's code ticks over them as `governor run` did live
(tests/engine/replay.py). The replay is deterministic (the same samples, the same
queries at the same instants), so the README's "Real engine" numbers are this test's:
a change to the plant learning, the capacity model or the queries that moves what the
decider learns of a real engine fails here until the table is regenerated
(`python -m tests.engine.recorded replay`).
"""

from __future__ import annotations

import json
import lzma
import re
import shutil
from pathlib import Path

import pytest

from tests.engine.recorded import (
    RUNS_DIR,
    SERIES,
    keep_recording,
    openmetrics,
    phases_table,
    recorded_names,
    replay_recorded,
    run_name,
    summary,
    world,
)
from tests.engine.replay import Replay

README = Path(__file__).resolve().parents[2] / "README.md"
NAMES = recorded_names()


def test_the_samples_kept_are_the_read_series_in_time_order_without_stale_markers() -> None:
    dump = "\n".join(
        [
            '{__name__="vllm:num_requests_running", engine="0", model_name="m"} 3 2000',
            '{__name__="vllm:num_requests_running", engine="0", model_name="m"} 2 1000',
            '{__name__="vllm:num_requests_running", engine="0", model_name="m"} NaN 3000',
            '{__name__="python_gc_objects_collected_total", generation="0"} 5 1000',
            '{__name__="up", instance="a:1", job="vllm"} 1 1500',
            '{__name__="up", instance="a:1", job="vllm"} 1 9000',
        ]
    )
    assert "vllm:num_requests_running" in SERIES
    assert "python_gc_objects_collected_total" not in SERIES
    assert openmetrics(dump, 1.0, 5.0).splitlines() == [
        'up{instance="a:1",job="vllm"} 1 1.500',
        'vllm:num_requests_running{engine="0",model_name="m"} 2 1.000',
        'vllm:num_requests_running{engine="0",model_name="m"} 3 2.000',
        "# EOF",
    ]


@pytest.mark.prometheus
def test_a_rebuilt_world_records_back_to_the_same_files(tmp_path: Path) -> None:
    """The engine suite's teardown (`keep_recording`): a run of this world in
    out/engine.json is recorded, sample for sample what the recording it was rebuilt
    from holds (promtool's dump of promtool's blocks); a run of another world is not;
    a world whose TSDB is gone warns and records nothing."""
    name = NAMES[-1]
    result = world(name, tmp_path / "w")
    out = tmp_path / "engine.json"
    out.write_text(json.dumps({"capacity_at_sla": result}))
    samples = keep_recording(out, tmp_path / "w", tmp_path / "recorded", "ci")
    again = run_name(result, "ci")
    assert samples == tmp_path / "recorded" / f"{again}.om.xz"
    original = lzma.decompress((RUNS_DIR / f"{name}.om.xz").read_bytes())
    assert lzma.decompress(samples.read_bytes()) == original
    meta = json.loads((tmp_path / "recorded" / f"{again}.json").read_text())
    assert meta == json.loads((RUNS_DIR / f"{name}.json").read_text())
    assert keep_recording(out, tmp_path / "other", tmp_path / "elsewhere", "ci") is None
    shutil.rmtree(tmp_path / "w" / "data-0")
    with pytest.warns(UserWarning, match="not recorded"):
        assert keep_recording(out, tmp_path / "w", tmp_path / "broken", "ci") is None


@pytest.fixture(scope="module")
def replays() -> dict[str, tuple[str, Replay]]:
    """Every recorded run's README row and replay (one Prometheus per run, ~1 s each,
    two at a time: tests.engine.recorded.replay_recorded)."""
    return replay_recorded(NAMES)


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_recorded_run_replays_to_its_readme_row(
    name: str, replays: dict[str, tuple[str, Replay]]
) -> None:
    row, replayed = replays[name]
    # what the ladder measured and what the decider learned at its last rung within the SLA
    assert replayed.measured_capacity_rps and replayed.capacity_rps
    assert replayed.ticks_to_scale_up is not None, "no scale-up request after the step"
    lines = README.read_text().splitlines()
    readme_rows = [line for line in lines if line.startswith(f"| {name} |")]
    assert readme_rows == [row], "regenerate with `python -m tests.engine.recorded replay`"


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_readme_lists_every_recorded_run_and_their_goals(
    replays: dict[str, tuple[str, Replay]],
) -> None:
    assert len(NAMES) >= 5, "the recordings are missing (tests/engine/data/runs)"
    text = README.read_text()
    listed = re.findall(r"^\| ((?:ci|local)-\d{8}T\d{4}) \|", text, flags=re.MULTILINE)
    assert sorted(listed) == NAMES
    assert summary([r for _, r in replays.values()]) in text


@pytest.mark.prometheus
def test_phases_replays_the_run_at_each_shift_of_the_tick_grid() -> None:
    """`phases`: the replay at shift 0 is the README's; a shifted one ticks on a grid
    that many seconds later (each rung read by a tick half a tick off)."""
    name = NAMES[-1]
    shifts = (0.0, 0.5)
    done = [replay_recorded([name], phase_s=s) for s in shifts]
    text = phases_table(done, shifts)
    row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
    readme = next(
        line for line in README.read_text().splitlines() if line.startswith(f"| {name} |")
    )
    assert row.split(" | ")[1] == readme.split(" | ")[4]  # learned over measured
    assert "Within 25 % at each shift: " in text
    plain, shifted = (d[name][1] for d in done)
    assert [abs(a.at_s - b.at_s) for a, b in zip(plain.rungs, shifted.rungs, strict=True)] == [
        0.5
    ] * len(plain.rungs)
