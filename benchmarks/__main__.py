"""`make bench`: run every benchmark, print ONE table, write out/bench.json.

Each benchmark runs in its own process (`python -m benchmarks.<module> --json F`), so
memory and CPU readings do not carry over from one to the next; its own progress lines
stream through prefixed with its name. Then the rows of all of them are printed as one
markdown table (issue 7's sections 1-6, in order) and written, with the machine, the
date and each benchmark's raw numbers, to `--out` (default out/bench.json; out/ is
git-ignored).

Exit status: 0 when every benchmark ran (goals met or not: the table says which), 1 when
one failed or ran past its time limit. `--only tick,grpc` runs some; `--quick` passes
`--quick` on (small sizes, one run: a smoke test, not the numbers to quote).
Sized for < 10 minutes on the 2-core benchmark machine (about 7).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine

# (name, module, time limit in seconds), in the order they run.
BENCHES: list[tuple[str, str, float]] = [
    ("tick", "benchmarks.bench_tick", 420.0),  # 5,000 models: ~4 s of CPU a tick
    ("grpc", "benchmarks.bench_grpc", 240.0),
    ("memory", "benchmarks.bench_memory", 120.0),
    ("reaction", "benchmarks.bench_reaction", 120.0),
    ("simulator", "benchmarks.bench_simulator", 150.0),
    ("governor_sim", "benchmarks.bench_governor_sim", 180.0),
]
SECTION_ORDER = ("1", "2", "3", "4", "5", "6")


def _stream(pipe: Any, prefix: str) -> None:
    for raw in iter(pipe.readline, b""):
        sys.stdout.write(f"[{prefix}] {raw.decode(errors='replace')}")
        sys.stdout.flush()


def run_one(name: str, module: str, limit_s: float, quick: bool, tmp: Path) -> dict[str, Any]:
    """Run one benchmark module; returns its JSON document plus rc and wall seconds."""
    out = tmp / f"{name}.json"
    argv = [sys.executable, "-m", module, "--json", str(out), *(["--quick"] if quick else [])]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    reader = threading.Thread(target=_stream, args=(proc.stdout, name), daemon=True)
    reader.start()
    try:
        rc = proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        rc = -9
        print(f"[{name}] killed after {limit_s:.0f} s", flush=True)
    reader.join(5)
    doc: dict[str, Any] = {"rows": [], "details": None}
    if out.is_file():
        doc = json.loads(out.read_text())
    doc.update({"rc": rc, "wall_s": round(time.monotonic() - t0, 1)})
    return doc


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as one markdown table, sections in issue order."""

    def key(r: dict[str, Any]) -> tuple[int, int]:
        sec = r["section"].split()[0]
        return (SECTION_ORDER.index(sec) if sec in SECTION_ORDER else 99, r["_i"])

    lines = ["| # | measurement | result | goal | met |", "|---|---|---|---|---|"]
    for r in sorted(rows, key=key):
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(
            f"| {_cell(r['section'])} | {_cell(r['name'])} | {_cell(r['value'])} | "
            f"{_cell(r['goal'])} | {met} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", default="", help="comma-separated names: " + ", ".join(
        n for n, _, _ in BENCHES))  # fmt: skip
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="out/bench.json")
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    unknown = only - {n for n, _, _ in BENCHES}
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    started = time.monotonic()
    docs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, module, limit in BENCHES:
            if only and name not in only:
                continue
            print(f"\n=== {name} ({module}) ===", flush=True)
            docs[name] = run_one(name, module, limit, args.quick, Path(tmp))
    total = time.monotonic() - started
    rows: list[dict[str, Any]] = []
    for doc in docs.values():
        for r in doc.get("rows", []):
            rows.append({**r, "_i": len(rows)})
    failed = [n for n, d in docs.items() if d["rc"] != 0]
    info = machine()
    print("\n" + table(rows))
    print(
        f"\n{dt.date.today().isoformat()}, {info['cpus']} cores, {info['mem_gib']} GiB, "
        f"Python {info['python']}, {info['os']}; load average at the end "
        f"{info['load_avg_1m']}; total {total:.0f} s"
        + (f"; FAILED: {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": dt.date.today().isoformat(),
                "machine": info,
                "total_s": round(total, 1),
                "quick": args.quick,
                "rows": [{k: v for k, v in r.items() if k != "_i"} for r in rows],
                "benches": docs,
            },
            indent=1,
            default=str,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
