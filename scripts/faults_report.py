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


def render(records: list[dict[str, Any]]) -> str:
    """The Markdown table (one row per case, in run order) and a totals line."""
    lines = [
        "| area | case | what was checked | result |",
        "| --- | --- | --- | --- |",
    ]
    for r in records:
        outcome = r["outcome"]
        result = {"passed": "pass", "failed": "FAIL", "skipped": "skipped"}.get(outcome, outcome)
        notes = "; ".join(r.get("notes", []))
        if notes:
            result = f"{result}: {notes}"
        lines.append(
            f"| {_cell(r['area'])} | {_cell(r['case'])} | {_cell(r['checked'])} | "
            f"{_cell(result)} ({r['duration_s']:.1f} s) |"
        )
    passed = sum(1 for r in records if r["outcome"] == "passed")
    total_s = sum(r["duration_s"] for r in records)
    lines.append("")
    lines.append(
        f"{passed} of {len(records)} cases passed in {total_s:.0f} s "
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
