"""`--matrix-plots` refuses a folder that holds another matrix's plots under the same
names (simulator.plotdir): the quick matrix's long-context and diurnal rows are named as
the full matrix's but replay 5-minute slices at a quarter of the rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main
from simulator.matrix import QUICK_TRACES, TRACES
from simulator.plotdir import OWNER_FILE, check_plots_dir, claim_plots_dir


def test_a_folder_keeps_the_traces_it_plots_and_refuses_others_under_their_names(
    tmp_path: Path,
) -> None:
    claim_plots_dir(str(tmp_path), TRACES)
    check_plots_dir(str(tmp_path), TRACES)  # the full matrix again, or the combined one
    with pytest.raises(ValueError, match=r"'long-context'.*pick another --matrix-plots"):
        check_plots_dir(str(tmp_path), QUICK_TRACES)
    # conv x4 and code x1 are keys of their own: the quick matrix's other rows pass
    claim_plots_dir(str(tmp_path / "q"), QUICK_TRACES[:2])
    claim_plots_dir(str(tmp_path / "q"), TRACES[:2])  # records merge
    check_plots_dir(str(tmp_path / "q"), QUICK_TRACES[:2] + TRACES[:2])


def test_an_unreadable_record_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / OWNER_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=f"{OWNER_FILE}: unreadable"):
        check_plots_dir(str(tmp_path), TRACES)
    (tmp_path / OWNER_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a record of traces"):
        check_plots_dir(str(tmp_path), TRACES)


def test_the_quick_matrix_into_the_full_ones_folder_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any cell runs: the full matrix's plot and record stay as they were."""
    claim_plots_dir(str(tmp_path), TRACES)
    record = (tmp_path / OWNER_FILE).read_text()
    plot = tmp_path / "long-context_default.png"
    plot.write_bytes(b"full")
    args = ["simulate", "--matrix-quick", "--matrix-plots", str(tmp_path), "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--matrix-plots:" in err and "'long-context'" in err and "300 s" in err
    assert plot.read_bytes() == b"full" and (tmp_path / OWNER_FILE).read_text() == record


def test_the_committed_plot_folders_record_the_full_traces() -> None:
    """docs/matrix-plots and docs/matrix-plots-combined hold the full traces' plots, so a
    quick run pointed at either is refused."""
    for folder in ("docs/matrix-plots", "docs/matrix-plots-combined"):
        check_plots_dir(folder, TRACES)
        with pytest.raises(ValueError):
            check_plots_dir(folder, QUICK_TRACES)
