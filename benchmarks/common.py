"""Shared helpers of the benchmarks: result rows, medians, timers, fleets of N models.

This owns the row format every benchmark writes and the runner (`benchmarks/__main__.py`)
prints as one table: `Row(section, name, value, goal, met, data)`, where `value` and
`goal` are display strings and `data` holds the raw numbers (units in the key names:
`_ms`, `_s`, `_mb`, `_rps`). It also builds the N-model `GovernorConfig` the tick,
gRPC and memory benchmarks share, and the quiet logger for benchmark plumbing.

Timing: CPU time (`time.process_time`, this process, all threads) wherever it measures
the same thing as wall time, because other engineers load this 2-core machine; medians
over repeated runs everywhere.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from controller.config import GovernorConfig

SLA_MS = {"ttft_p95_ms": 1000, "itl_p95_ms": 50}


@dataclass
class Row:
    """One line of the benchmark table. `met`: None when the row has no goal."""

    section: str
    name: str
    value: str
    goal: str = ""
    met: bool | None = None
    data: dict[str, Any] = field(default_factory=dict)


def median(values: Iterable[float]) -> float:
    """Median of `values`; ValueError when empty or when one is NaN (statistics.median
    sorts, and NaN compares false with everything: the answer depended on where the NaN
    stood, and a run that measured nothing vanished in it). Leave such runs out and say
    so (`nan_runs`)."""
    vals = list(values)
    if any(isinstance(v, float) and math.isnan(v) for v in vals):
        raise ValueError(f"median over a NaN: {vals}")
    return float(statistics.median(vals))


def nan_runs(runs: Sequence[dict[str, Any]], keys: Iterable[str]) -> list[int]:
    """Indexes of the `runs` with a NaN under any of `keys` (a run that never saw what
    it measures)."""
    keys = tuple(keys)
    return [
        i
        for i, r in enumerate(runs)
        if any(isinstance(r.get(k), float) and math.isnan(r[k]) for k in keys)
    ]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, nearest rank (no interpolation)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return float(ordered[rank - 1])


def span(seconds: float) -> str:
    """A duration for a table cell: `1 h`, `20 min`, `45 s`."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def rss_mb() -> float:
    """Resident set size of this process now, MB (from /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def machine() -> dict[str, Any]:
    """What ran the benchmark: cores, memory, Python, OS."""
    mem_gib = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    os_name = platform.platform()
    try:
        with open("/etc/os-release") as fh:
            for line in fh:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "os": os_name,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def fleet_config(n_models: int, names: Sequence[str], **policy: Any) -> GovernorConfig:
    """A config of `n_models` models named `names` (SLA TTFT p95 1 s, ITL p95 50 ms,
    1-64 replicas, slo knobs) and the default policy with `policy` overrides."""
    return GovernorConfig.model_validate(
        {
            "models": [
                {
                    "name": name,
                    "deployment": f"d{i}",
                    "sla": SLA_MS,
                    "replicas": {"min_replicas": 1, "max_replicas": 64},
                }
                for i, name in enumerate(names[:n_models])
            ],
            "policy": policy,
        }
    )


class NullLogger:
    """Drops every log call (benchmark plumbing that is not being measured)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def bench_args(description: str | None) -> argparse.ArgumentParser:
    """An argument parser with the `--json PATH` and `--quick` options every bench has."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer/smaller runs (smoke test)")
    return ap


def write_rows(path: str | None, bench: str, rows: list[Row], details: Any = None) -> None:
    """Write `rows` (and free-form `details`) as JSON to `path` (no-op when None)."""
    if path is None:
        return
    doc = {
        "bench": bench,
        "rows": [asdict(r) for r in rows],
        "details": details,
        "machine": machine(),
    }
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def print_rows(rows: list[Row]) -> None:
    """Print rows as plain lines (a bench run on its own)."""
    for r in rows:
        met = "" if r.met is None else ("  [met]" if r.met else "  [NOT met]")
        goal = f"  (goal {r.goal})" if r.goal else ""
        print(f"{r.section:<22} {r.name:<44} {r.value}{goal}{met}", file=sys.stdout)
