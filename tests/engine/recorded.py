"""Recorded real-engine capacity runs, kept in the repository so that a replay of them
through today's decider is a test (`tests/engine/test_recorded_runs.py`).

A kept run (`python -m tests.engine.capacity --json F`, or `make test`'s out/engine.json)
points at its world's folder: a Prometheus TSDB of a few MB and the governor's config.
`python -m tests.engine.recorded record F [NAME]` turns it into two files under `RUNS_DIR`
(the engine suite does it itself into out/recorded/, see tests/engine/conftest.py):

- `NAME.json`: the run's capacity JSON (rungs with their end times, the step's start),
  its world's governor config under `governor`, without the machine path `workdir`;
- `NAME.om.xz`: the samples the replay reads, as OpenMetrics text (xz): every series of
  `SERIES` (the engine's signals that estimators/promql.py queries, and `up`) from
  `HISTORY_S` before the replay's first tick to its last, staleness markers left out
  (~0.3 MB a run; the whole TSDB's samples are ~65 MB of text).

`world(name, folder)` rebuilds a run's world folder from them (`promtool tsdb
create-blocks-from openmetrics` writes the blocks, Prometheus's own importer), so that
`tests.engine.replay` reads the same samples the live governor read: the same decider,
the same answers, whatever machine replays it. `python -m tests.engine.recorded replay`
prints the README's table of every recorded run replayed through today's decider.

Times in unix seconds (OpenMetrics timestamps are seconds too).
"""

from __future__ import annotations

import json
import lzma
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from estimators import promql
from tests.engine.replay import Replay, replay_span, replay_world, window_report

RUNS_DIR = Path(__file__).resolve().parent / "data" / "runs"
"""Where the recorded runs live (NAME.json and NAME.om.xz)."""
HISTORY_S = promql.DEFAULT_SEED_WINDOW_S + 30.0
"""Seconds of samples kept before the replay's first tick: the longest range a query
reads back (the seed policy's 5-minute arrival window) and half a minute more."""
_HISTOGRAMS = (
    promql.TTFT_METRICS
    + promql.ITL_METRICS
    + promql.TPOT_METRICS
    + promql.E2E_METRICS
    + promql.QUEUE_METRICS
    + promql.DECODE_METRICS
    + promql.PREFILL_METRICS
    + promql.PROMPT_TOKENS_METRICS
    + promql.OUTPUT_TOKENS_METRICS
    + promql.STEP_TOKENS_METRICS
)
SERIES = frozenset(
    {f"{h}{suffix}" for h in _HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | set(
        promql.RUNNING_METRICS
        + promql.WAITING_METRICS
        + promql.KV_USAGE_METRICS
        + promql.SUCCESS_METRICS
        + promql.PREEMPTIONS_METRICS
        + promql.ADMISSION_REJECTIONS_METRICS
        + promql.PREFIX_HITS_METRICS
        + promql.PREFIX_QUERIES_METRICS
    )
    | {"up"}
)
"""Metric names kept: what the governor's queries read, and `up`."""

_DUMP_LINE = re.compile(r'^\{__name__="([^"]+)"(?:, )?(.*)\} (\S+) (\d+)$')
"""One line of `promtool tsdb dump`: `{__name__="n", a="x", ...} value timestamp_ms`."""
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
"""One `name="value"` pair of a dump line (OpenMetrics wants them without spaces)."""


def promtool() -> str:
    """Path of `promtool` (next to $PROMETHEUS_BIN's or the PATH's prometheus, else on
    PATH); FileNotFoundError naming what is missing."""
    from tests.integration.promserver import find_prometheus

    binary = find_prometheus()
    beside = Path(binary).with_name("promtool") if binary else None
    if beside is not None and beside.exists():
        return str(beside)
    found = shutil.which("promtool")
    if found is None:
        raise FileNotFoundError("no promtool (Debian's `prometheus` package has it)")
    return found


def openmetrics(dump: str, start_s: float, stop_s: float) -> str:
    """The samples of `dump` (promtool's text) of `SERIES` within [start_s, stop_s], as
    OpenMetrics text: families in name order, each series' samples in time order,
    staleness markers (NaN) left out."""
    series: dict[str, dict[str, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    for line in dump.splitlines():
        m = _DUMP_LINE.match(line)
        if m is None:
            continue
        name, labels, value, ts_ms = m.groups()
        if name not in SERIES or value == "NaN" or not start_s <= int(ts_ms) / 1000 <= stop_s:
            continue
        pairs = ",".join(f'{k}="{v}"' for k, v in _LABEL.findall(labels))
        series[name][pairs].append((int(ts_ms), value))
    out: list[str] = []
    for name in sorted(series):
        for labels, samples in sorted(series[name].items()):
            head = f"{name}{{{labels}}}" if labels else name
            out += [f"{head} {v} {ms // 1000}.{ms % 1000:03d}" for ms, v in sorted(samples)]
    out.append("# EOF")
    return "\n".join(out) + "\n"


def run_name(result: dict[str, Any], prefix: str) -> str:
    """A recorded run's name: `prefix` and its first rung's end, UTC to the minute
    (e.g. `ci-20261203T0729`)."""
    first = datetime.fromtimestamp(result["rungs"][0]["ended_unix_s"], tz=UTC)
    return f"{prefix}-{first:%Y%m%dT%H%M}"


def record(run_json: Path, name: str | None = None, runs_dir: Path = RUNS_DIR) -> tuple[Path, Path]:
    """Write `name`.json and `name`.om.xz (default name: `run_name(..., "local")`) for
    the kept run `run_json` (module doc)."""
    raw = json.loads(run_json.read_text())
    result = dict(raw.get("capacity_at_sla", raw))
    name = name or run_name(result, "local")
    workdir = Path(result.pop("workdir"))
    config = yaml.safe_load((workdir / "governor.yaml").read_text())
    start, stop = replay_span(result, float(config["policy"]["tick_interval_s"]))
    with tempfile.TemporaryDirectory(prefix="record-") as tmp:
        copy = Path(tmp) / "data"
        shutil.copytree(workdir / "data-0", copy)  # promtool may replay the WAL into it
        (copy / "wal").mkdir(exist_ok=True)  # blocks alone (a rebuilt world): dump needs one
        dump = subprocess.run(
            [promtool(), "tsdb", "dump", str(copy)], check=True, capture_output=True, text=True
        ).stdout
    runs_dir.mkdir(parents=True, exist_ok=True)
    meta, samples = runs_dir / f"{name}.json", runs_dir / f"{name}.om.xz"
    meta.write_text(json.dumps({**result, "governor": config}, indent=1, sort_keys=True) + "\n")
    samples.write_bytes(lzma.compress(openmetrics(dump, start - HISTORY_S, stop).encode()))
    return meta, samples


def keep_recording(out: Path, workdir: Path, into: Path, prefix: str) -> Path | None:
    """Record the capacity run of the world in `workdir` from `out` (the engine suite's
    out/engine.json) into `into`, named `run_name(..., prefix)`; its samples file, or
    None when `out` holds no run of this world. A failure to record is a warning (the
    suite's teardown calls this: the measurement stands without it)."""
    if not out.exists():
        return None
    result = json.loads(out.read_text()).get("capacity_at_sla") or {}
    if result.get("workdir") != str(workdir) or not result.get("rungs"):
        return None
    try:
        return record(out, run_name(result, prefix), into)[1]
    except Exception as exc:  # tooling after the tests: never fails them
        warnings.warn(f"the capacity run was not recorded: {exc}", stacklevel=1)
        return None


def recorded_names(runs_dir: Path = RUNS_DIR) -> list[str]:
    """The recorded runs' names, sorted."""
    return sorted(p.name.removesuffix(".om.xz") for p in runs_dir.glob("*.om.xz"))


def world(name: str, folder: Path, runs_dir: Path = RUNS_DIR) -> dict[str, Any]:
    """Rebuild recorded run `name`'s world in `folder` (its TSDB blocks in `data-0`,
    `governor.yaml`) and return its capacity JSON with `workdir` set to `folder`, as
    `tests.engine.replay.replay_kept` takes it."""
    result: dict[str, Any] = json.loads((runs_dir / f"{name}.json").read_text())
    config = result.pop("governor")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "governor.yaml").write_text(yaml.safe_dump(config))
    text = folder / "samples.om"
    text.write_bytes(lzma.decompress((runs_dir / f"{name}.om.xz").read_bytes()))
    subprocess.run(
        [
            promtool(),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(text),
            str(folder / "data-0"),
        ],
        check=True,
        capture_output=True,
    )
    text.unlink()
    return {**result, "workdir": str(folder)}


WITHIN_FRAC = 0.25
"""The issue's goal: the learned capacity within 25 % of the measured."""
GOAL_TICKS = 3
"""The issue's goal: a scale-up request within 3 ticks of a load the SLA cannot take."""
TABLE_HEAD = (
    "| recorded run | measured capacity | learned live | learned, replayed today "
    "| replayed / measured | speed, per-sequence ratio | first scale-up request |\n"
    "| --- | --- | --- | --- | --- | --- | --- |"
)


def table_row(name: str, result: dict[str, Any], replayed: Replay) -> str:
    """`name`'s row of the README's table (TABLE_HEAD): req/s, the ratio to 2 decimals,
    the first scale-up request in ticks after the step."""
    last = next((r for r in reversed(replayed.rungs) if r.within_sla), None)

    def num(x: float | None, spec: str = ".1f") -> str:
        return "-" if x is None else format(x, spec)

    live = result.get("learned_capacity_rps")
    return (
        f"| {name} | {num(replayed.measured_capacity_rps)} | {num(live)} "
        f"| {num(replayed.capacity_rps)} | {num(replayed.over_measured, '.2f')}x "
        f"| x{num(last.speed if last else None, '.2f')}, "
        f"{num(last.seq_ratio if last else None, '.2f')} "
        f"| tick {num(replayed.ticks_to_scale_up, 'd')} |"
    )


def within_band(replays: Iterable[Replay]) -> int:
    """How many of `replays` learned a capacity within WITHIN_FRAC of the measured."""
    return sum(
        1
        for r in replays
        if r.over_measured is not None and abs(r.over_measured - 1) <= WITHIN_FRAC
    )


def summary(replays: list[Replay]) -> str:
    """The README's line under the table: how many runs meet each goal."""
    within = within_band(replays)
    fast = sum(
        1 for r in replays if r.ticks_to_scale_up is not None and r.ticks_to_scale_up <= GOAL_TICKS
    )
    n = len(replays)
    return (
        f"Replayed today: within {100 * WITHIN_FRAC:.0f} % of the measured capacity in "
        f"{within} of {n} runs; first scale-up request within {GOAL_TICKS} ticks of the step "
        f"in {fast} of {n}."
    )


def replay_recorded(
    names: list[str] | None = None, phase_s: float = 0.0
) -> dict[str, tuple[str, Replay]]:
    """Recorded runs `names` (all by default) replayed through today's decider, each
    world rebuilt in a temporary folder: name -> (its README row, its replay); `phase_s`
    shifts the ticks' grid (tests.engine.replay.replay).

    Two at a time, in processes of their own (a replay keeps ~1.1 cores busy: its
    Prometheus answering and the decider ticking; 46 runs take ~30 s on 2 cores, each
    query a range query: tests.engine.rangeanswers). The answers do not depend on the
    pace: every query is evaluated at its tick's recorded instant. Spawned, not forked:
    the caller may hold gRPC or Prometheus threads, which a fork copies mid-flight."""
    todo = names or recorded_names()
    workers = min(REPLAY_WORKERS, os.cpu_count() or 1, len(todo))
    one = partial(_replay_one, phase_s=phase_s)
    if workers <= 1:
        return dict(zip(todo, map(one, todo), strict=True))
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
        return dict(zip(todo, pool.map(one, todo), strict=True))


REPLAY_WORKERS = 2
"""Recorded runs replayed at once (`replay_recorded`)."""


def _replay_one(name: str, phase_s: float = 0.0) -> tuple[str, Replay]:
    """Recorded run `name` replayed in a world rebuilt in a temporary folder: its README
    row and its replay."""
    with tempfile.TemporaryDirectory(prefix="recorded-") as tmp:
        result = world(name, Path(tmp) / "world")
        replayed = replay_world(result, phase_s=phase_s)
    return table_row(name, result, replayed), replayed


PHASES_S = (0.0, 0.25, 0.5, 0.75)
"""The tick grid's shifts `phases` replays at, seconds (the harness ticks every 1 s)."""
PHASE_SPREAD = 1.1
"""A run whose learned capacity moves by more than this factor with the shift is named."""


def phases(names: list[str] | None = None, shifts: tuple[float, ...] = PHASES_S) -> str:
    """How much the recorded runs' replays depend on where the ticks fall: `phases_table`
    of `names` (all by default) replayed with the tick grid shifted by each of `shifts`
    seconds."""
    return phases_table([replay_recorded(names, phase_s=s) for s in shifts], shifts)


def phases_table(done: list[dict[str, tuple[str, Replay]]], shifts: tuple[float, ...]) -> str:
    """`done[i]`, the runs replayed at `shifts[i]` (`replay_recorded`), as a table: each
    run's learned over measured capacity at each shift, the largest over the smallest
    (its spread), and per shift how many runs are within 25 % of the measured."""
    heads = " | ".join(f"+{s:g} s" for s in shifts)
    lines = [f"| recorded run | {heads} | spread |", "| --- |" + " --- |" * (len(shifts) + 1)]
    moved = []
    for name in done[0]:
        ratios = [d[name][1].over_measured for d in done]
        known = [r for r in ratios if r is not None]
        spread = max(known) / min(known) if known else None
        cells = " | ".join("-" if r is None else f"{r:.2f}x" for r in ratios)
        lines.append(f"| {name} | {cells} | {'-' if spread is None else f'{spread:.2f}'} |")
        if spread is not None and spread > PHASE_SPREAD:
            moved.append(name)
    within = [within_band(r for _, r in d.values()) for d in done]
    lines += [
        "",
        f"Within {100 * WITHIN_FRAC:.0f} % at each shift: {', '.join(map(str, within))} of "
        f"{len(done[0])}; moved over {PHASE_SPREAD:g}x by the shift: {len(moved)} "
        f"({', '.join(moved) or 'none'}).",
    ]
    return "\n".join(lines)


def table(names: list[str] | None = None) -> str:
    """The README's table of the recorded runs replayed today, and its summary line."""
    done = replay_recorded(names)
    rows = [row for row, _ in done.values()]
    return "\n".join([TABLE_HEAD, *rows, "", summary([r for _, r in done.values()])])


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.engine.recorded record RUN.json [NAME]` records a kept run;
    `python -m tests.engine.recorded replay [NAME ...]` prints the README's table of the
    recorded runs (all by default) replayed through today's decider; `python -m
    tests.engine.recorded windows NAME [NAME ...]` prints each one's window readings
    (tests.engine.replay.window_report) and its row; `python -m tests.engine.recorded
    phases [NAME ...]` replays them with the tick grid shifted (`phases`)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 2 and args[0] == "windows":
        for name in args[1:]:
            with tempfile.TemporaryDirectory(prefix="recorded-") as tmp:
                result = world(name, Path(tmp) / "world")
                replayed = replay_world(result, windows=True)
            print("\n".join([*window_report(replayed), table_row(name, result, replayed)]))
        return 0
    if len(args) in (2, 3) and args[0] == "record":
        for path in record(Path(args[1]), args[2] if len(args) == 3 else None):
            print(f"{path} ({path.stat().st_size} bytes)")
        return 0
    if args and args[0] == "replay":
        print(table(args[1:]))
        return 0
    if args and args[0] == "phases":
        print(phases(args[1:]))
        return 0
    print(main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
