"""Print the "Faults and bad input" table of the last fault-suite run.

The fault suite (tests/faults, `make test-faults`) records each case it runs, what was
checked, the outcome and its numbers in `out/faults.json` (tests/faults/conftest.py
calls `write_report` at the end of the session, which also writes `out/faults.md`).
This script renders that JSON as the Markdown table the README carries.

Usage: python scripts/faults_report.py [out/faults.json] [--check]
  --check: exit 1 when a case failed, was skipped or did not run (CI gate).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "out" / "faults.json"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


AREA_ORDER = (
    "Prometheus",
    "Kubernetes API",
    "Controller crash",
    "Clock",
    "Simulator",
    "Security",
    "Bad input",
    "Load",
)
"""Row order of the table: the order of the issue's list; other areas after, by name."""


def _rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case: the parametrized variants of a case (`case [id]`) are merged,
    their outcomes and notes kept in order."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in records:
        base, _, param = r["case"].partition(" [")
        key = (r["area"], base, r["checked"])
        row = rows.setdefault(
            key, {"area": r["area"], "case": base, "checked": r["checked"], "runs": []}
        )
        row["runs"].append((param.rstrip("]"), r))

    def order(row: dict[str, Any]) -> tuple[int, str]:
        area = row["area"]
        return (AREA_ORDER.index(area) if area in AREA_ORDER else len(AREA_ORDER), area)

    return sorted(rows.values(), key=order)  # stable: run order within an area


def _result(runs: list[tuple[str, dict[str, Any]]]) -> str:
    words = {"passed": "pass", "failed": "FAIL", "skipped": "skipped"}
    passed = sum(1 for _, r in runs if r["outcome"] == "passed")
    seconds = sum(r["duration_s"] for _, r in runs)
    if len(runs) == 1:
        head = words.get(runs[0][1]["outcome"], runs[0][1]["outcome"])
    else:
        head = "pass" if passed == len(runs) else "FAIL"
        head += f" ({passed}/{len(runs)}: {', '.join(p for p, _ in runs)})"
        failed = [p for p, r in runs if r["outcome"] != "passed"]
        if failed:
            head += f"; failed: {', '.join(failed)}"
    notes = [n for _, r in runs for n in r.get("notes", [])]
    text = f"{head}: {'; '.join(notes)}" if notes else head
    return f"{text} ({seconds:.1f} s)"


def render(records: list[dict[str, Any]]) -> str:
    """The Markdown table (one row per case, parametrized variants merged, areas in
    `AREA_ORDER`) and a totals line."""
    lines = [
        "| area | case | what was checked | result |",
        "| --- | --- | --- | --- |",
    ]
    rows = _rows(records)
    for row in rows:
        lines.append(
            f"| {_cell(row['area'])} | {_cell(row['case'])} | {_cell(row['checked'])} | "
            f"{_cell(_result(row['runs']))} |"
        )
    # Counted per case (row), as the table lists them: a case run with two parameters is
    # one case passed only when both runs passed, never two.
    passed = sum(1 for row in rows if all(r["outcome"] == "passed" for _, r in row["runs"]))
    total_s = sum(r["duration_s"] for r in records)
    lines.append("")
    lines.append(
        f"{passed} of {len(rows)} cases passed ({len(records)} test runs) in {total_s:.0f} s "
        f"(tests/faults, {records[0]['when'] if records else 'no run'})."
    )
    return "\n".join(lines) + "\n"


def write_report(records: list[dict[str, Any]], out_dir: Path) -> Path:
    """Write `faults.json` and `faults.md` into `out_dir`; returns the Markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "faults.json").write_text(json.dumps(records, indent=1) + "\n")
    md = out_dir / "faults.md"
    md.write_text(render(records))
    return md


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    path = Path(args[0]) if args else DEFAULT_JSON
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"faults_report: cannot read {path}: {exc} (run `make test-faults`)", file=sys.stderr)
        return 2
    sys.stdout.write(render(records))
    if "--check" in argv:
        bad = [r for r in records if r["outcome"] != "passed"]
        if bad or not records:
            for r in bad:
                print(f"faults_report: {r['area']} / {r['case']}: {r['outcome']}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
