"""A kept real-engine capacity run replayed through today's decider, open loop.

`python -m tests.engine.capacity --json F` keeps its world's folder (the Prometheus
TSDB the governor read and the governor's config, `workdir` in F) and records each
rung's end and the step's start in unix seconds. `python -m tests.engine.replay F
[F ...]` starts a Prometheus on a copy of each run's TSDB, ticks a `ControlLoop` of
today's code over the run at the governor's tick interval (every query evaluated at the
tick's time, as `governor run` does; each query text asked once, as a range query over
the ticks' grid, tests/engine/rangeanswers.py, or with `--instant` tick by tick as
`governor run` sends them: the same replay, ~10x slower), and prints, per rung, the
live governor's capacity per replica next to the replayed one, then the replayed
capacity at the end of the last rung within the SLA against the measured capacity, and
the ticks from the step to the first scale-up. With `--rungs` it also prints where each
rung's time went, from the engine's own histograms over the rung (`rung_means`); with
`--windows`, every tick's window readings as the plant learning took them
(`WindowReading`: what the speed, the per-sequence fit and its gate read, and the belief
after), for a change to controller/plant.py to be read window by window (`python -m
tests.engine.recorded windows NAME` does it for a recorded run). `make test`'s
out/engine.json replays too (its `capacity_at_sla`; the world's folder is pytest's tmp
folder, which pytest keeps for its last three runs).

What it is for: a change to the plant learning (controller/plant.py) judged over every
kept run, in seconds each, instead of one 6-minute engine run per change on a machine
whose load moves the engine's speed 3.6-22 req/s between runs (docs/real-engine-runs.md).
Run it from the worktree that holds the change.

Open loop is exact for what it measures: on one engine the governor's decisions change
nothing the engine sees (replicas are not actuated, and the world's batching policy is
static). What differs from the live run: the ticks' instants (the replay's grid starts
`LEAD_S` before the first rung, not at the live governor's start) and the policy the
ladder set through the admin API (`LADDER_POLICY`), applied here to the whole config.

Times in unix seconds; rates req/s.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from unittest import mock

import structlog
import yaml

import controller.plantstep
from controller.config import GovernorConfig
from controller.loop import ControlLoop
from controller.plant import window_speed
from estimators.prometheus import http_query_client
from estimators.types import MetricSource
from tests.engine.capacity import LADDER_POLICY, Rung, served_within_sla
from tests.engine.rangeanswers import RangeAnswers
from tests.integration.promserver import PrometheusServer, find_prometheus

LEAD_S = 30.0
"""Seconds of ticks before the ladder's first (unjudged) rung: the idle stretch the live
governor saw before it (at least one window)."""
RUNG_S = 12.0
"""One rung of the ladder (capacity.measure's default duration), seconds."""
FIRST_RUNG_S = 6.0 + RUNG_S
"""The unjudged warm-up rung and the first judged one (capacity.measure), seconds."""
STEP_TICKS = 30
"""Ticks replayed after the step (the live run gives up after 30 s at 1 s ticks)."""
RUNG_MEANS = {
    "ttft_ms": "vllm:time_to_first_token_seconds",
    "queue_ms": "vllm:request_queue_time_seconds",
    "prefill_ms": "vllm:request_prefill_time_seconds",
    "decode_ms": "vllm:request_decode_time_seconds",
    "itl_ms": "vllm:inter_token_latency_seconds",
}
"""The engine's latency histograms whose means over a rung `rung_means` reads."""

Query = Callable[[str, float], float | None]
"""A PromQL instant query at a unix time -> its single value (None: no answer)."""


@dataclass
class ReplayedRung:
    """One ladder rung: the live governor's capacity and the replay's at its end."""

    rate_rps: float
    offered_rps: float
    within_sla: bool
    at_s: float
    """The replayed tick read: the first at or after the rung's end."""
    live_capacity_rps: float | None
    capacity_rps: float | None
    speed: float | None
    seq_ratio: float | None
    means: dict[str, float | None] = field(default_factory=dict)
    """Where the rung's time went (`rung_means`), when read from a kept TSDB."""


def rung_means(query: Query, end_s: float, span_s: float) -> dict[str, float | None]:
    """The engine's means over the `span_s` seconds before `end_s`: TTFT, queue, prefill,
    decode and inter-token latency (ms, each None without requests), completions (req/s),
    the front end's share of TTFT (TTFT - queue - prefill: HTTP, tokenization, the
    engine core's input queue, ms) and Little's law's running sequences (completions x
    (prefill + decode)), the batch the rung held on average (the gauge is one instant).
    Example: 33.1 req/s x (60 + 678.5) ms = 24.4 sequences."""
    window = f"{max(1, round(span_s))}s"

    def mean_ms(hist: str) -> float | None:
        v = query(f"sum(rate({hist}_sum[{window}])) / sum(rate({hist}_count[{window}]))", end_s)
        return 1000.0 * v if v is not None and math.isfinite(v) else None

    out: dict[str, float | None] = {k: mean_ms(h) for k, h in RUNG_MEANS.items()}
    out["done_rps"] = query(f"sum(rate(vllm:request_success_total[{window}]))", end_s)
    ttft, queue, prefill = out["ttft_ms"], out["queue_ms"], out["prefill_ms"]
    decode, done = out["decode_ms"], out["done_rps"]
    out["frontend_ms"] = None
    if ttft is not None and queue is not None and prefill is not None:
        out["frontend_ms"] = ttft - queue - prefill
    out["little_running"] = None
    if done is not None and prefill is not None and decode is not None:
        out["little_running"] = done * (prefill + decode) / 1000.0
    return out


def prometheus_query(url: str, timeout_s: float = 10.0) -> Query:
    """A `Query` on the Prometheus at `url` (the first series' value, None if none)."""

    def query(expr: str, at_s: float) -> float | None:
        q = urllib.parse.urlencode({"query": expr, "time": f"{at_s:.3f}"})
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=timeout_s) as resp:
            result = json.load(resp)["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    return query


Parts = tuple[float, float, float] | None
"""A window's (observed mean ITL, the profile's per-sequence part, the rest), ms, as
controller.plant.window_parts gives it; None: no such window."""


@dataclass(frozen=True)
class WindowReading:
    """One tick's windows as the plant learning took them (controller.plant.learn_plant's
    arguments): each window's step against the profile's at its own batch, ITL /
    (rest + per-sequence part), for the speed's window, the per-sequence fit's (queued
    ones too), its gate's (clean: one chunk a prompt) and a standing queue's (None: no
    such window this tick); the fit window's parts (ms); the belief after the tick."""

    at_s: float
    speed_window: float | None
    fit_window: float | None
    clean_window: float | None
    standing_window: float | None
    fit_parts: Parts
    speed: float
    seq_ratio: float

    def line(self, start_s: float) -> str:
        """One printed row: seconds after `start_s`, then each reading."""
        cells = " ".join(
            f"{name} {_fmt(v, '5.2f')}"
            for name, v in (
                ("speed-window", self.speed_window),
                ("fit", self.fit_window),
                ("clean", self.clean_window),
                ("standing", self.standing_window),
            )
        )
        parts = ""
        if self.fit_parts is not None:
            itl, seqs, rest = self.fit_parts
            parts = f"  itl {itl:6.1f} seqs {seqs:6.2f} rest {rest:6.2f} ms"
        return (
            f"  t+{self.at_s - start_s:6.1f}s {cells} -> x{self.speed:.2f} "
            f"ratio {self.seq_ratio:.2f}{parts}"
        )


@dataclass
class Replay:
    """What the replay found for one run (module doc)."""

    rungs: list[ReplayedRung] = field(default_factory=list)
    measured_capacity_rps: float | None = None
    """The highest rate served within the SLA (`CapacityResult.measured_capacity_rps`),
    whatever the run's JSON recorded (earlier sessions recorded other measures)."""
    live_capacity_rps: float | None = None
    capacity_rps: float | None = None
    """The replayed capacity per replica at the end of the last rung within the SLA."""
    ticks_to_scale_up: int | None = None
    """Replayed ticks after the step up to and including the first above one replica."""
    windows: list[WindowReading] = field(default_factory=list)
    """Every tick's window readings (`replay(..., windows=True)`; empty otherwise)."""

    @property
    def over_measured(self) -> float | None:
        """Replayed / measured capacity (None when either is unknown)."""
        if self.capacity_rps is None or not self.measured_capacity_rps:
            return None
        return self.capacity_rps / self.measured_capacity_rps


def _quiet_logger() -> Any:
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
    )


def replay_config(workdir: Path, prometheus_url: str) -> GovernorConfig:
    """The run's governor config (its `governor.yaml`) reading `prometheus_url`, with the
    ladder's policy overrides."""
    raw = yaml.safe_load((workdir / "governor.yaml").read_text())
    raw["prometheus"]["url"] = prometheus_url
    raw["policy"].update(LADDER_POLICY)
    return GovernorConfig.model_validate(raw)


def _rung(record: dict[str, Any]) -> Rung:
    known = {f.name for f in fields(Rung)}
    return Rung(**{k: v for k, v in record.items() if k in known})


def replay_span(result: dict[str, Any], tick_s: float) -> tuple[float, float]:
    """(first, last) unix second `replay` ticks at over the run `result`: LEAD_S before
    the ladder's first rung to STEP_TICKS ticks after the step (the last rung's end
    without one)."""
    ends = [r["ended_unix_s"] for r in result["rungs"]]
    step_at = result.get("step_started_unix_s")
    stop = step_at + STEP_TICKS * tick_s if step_at is not None else ends[-1]
    return ends[0] - FIRST_RUNG_S - LEAD_S, stop


def replay(
    result: dict[str, Any],
    config: GovernorConfig,
    source: MetricSource | None = None,
    query: Query | None = None,
    windows: bool = False,
    instant: bool = False,
    phase_s: float = 0.0,
) -> Replay:
    """Tick today's loop over the run in `result` (a `capacity` JSON with rung end
    times) against `source` (default: the Prometheus in `config`, read as `governor run`
    reads it; each query text asked once, as a range query over the ticks, unless
    `instant`: tests.engine.rangeanswers); see the module doc. With `query`, each rung's
    `rung_means` too; with `windows`, every tick's `WindowReading` (the decider's plant step's
    `learn_plant` wrapped for the replay: the readings are its arguments, the decisions
    unchanged); `phase_s` shifts the ticks' grid later by that many seconds."""
    out = Replay()
    if not windows:
        return _replay(result, config, source, query, out, instant, phase_s)
    learn = controller.plantstep.learn_plant

    def logged(belief: Any, parts: Parts, dt: float, now_s: float, *args: Any) -> Any:
        after = learn(belief, parts, dt, now_s, *args)
        _confirm, _allowed, fit, clean, standing = args

        def off(p: Parts) -> float | None:  # the step over the profile's, shape included
            return window_speed(p, 1.0)

        out.windows.append(
            WindowReading(
                at_s=now_s,
                speed_window=off(parts),
                fit_window=off(fit),
                clean_window=off(clean),
                standing_window=off(standing),
                fit_parts=fit,
                speed=after.speed,
                seq_ratio=after.seq_ratio,
            )
        )
        return after

    with mock.patch.object(controller.plantstep, "learn_plant", logged):
        return _replay(result, config, source, query, out, instant, phase_s)


def _replay(
    result: dict[str, Any],
    config: GovernorConfig,
    source: MetricSource | None,
    query: Query | None,
    out: Replay,
    instant: bool,
    phase_s: float,
) -> Replay:
    """`replay`'s ticks, into `out`."""
    from service.run import prometheus_source

    rungs = [_rung(r) for r in result["rungs"]]
    ends = [r.ended_unix_s for r in rungs if r.ended_unix_s is not None]
    if not rungs or len(ends) != len(rungs):
        raise ValueError("the run records no rung end times (capacity.py before replays)")
    step_at = result.get("step_started_unix_s")
    tick_s = config.policy.tick_interval_s
    start, stop = replay_span(result, tick_s)
    start += phase_s
    if source is None:
        source = prometheus_source(
            config, reported_s=lambda _settings: None, client=_client(config, start, stop, instant)
        )
    loop = ControlLoop(
        config, source, logger=_quiet_logger(), pause_gc=False, switch_interval_s=None
    )
    name = config.models[0].name
    ticks_after_step = 0
    for i in range(math.ceil((stop - start) / tick_s) + 1):
        now = start + i * tick_s
        (decision,) = loop.tick(now)
        plant = s.plant if (s := loop.states().get(name)) is not None else None
        while len(out.rungs) < len(rungs) and now >= ends[len(out.rungs)]:
            k = len(out.rungs)
            rung = rungs[k]
            span = ends[k] - ends[k - 1] if k else RUNG_S
            means = rung_means(query, ends[k], span) if query is not None else {}
            out.rungs.append(
                ReplayedRung(
                    rate_rps=rung.rate_rps,
                    offered_rps=rung.offered_rps,
                    within_sla=rung.within_sla,
                    at_s=now,
                    live_capacity_rps=rung.gov_capacity_rps,
                    capacity_rps=decision.capacity_rps_per_replica,
                    speed=plant.speed if plant else None,
                    seq_ratio=plant.seq_ratio if plant else None,
                    means=means,
                )
            )
        if step_at is not None and now > step_at and out.ticks_to_scale_up is None:
            ticks_after_step += 1
            if decision.replicas > 1:
                out.ticks_to_scale_up = ticks_after_step
    last = next((r for r in reversed(out.rungs) if r.within_sla), None)
    if last is not None:
        out.measured_capacity_rps = served_within_sla(rungs[: len(out.rungs)])
        out.live_capacity_rps, out.capacity_rps = last.live_capacity_rps, last.capacity_rps
    return out


def _client(
    config: GovernorConfig, start_s: float, stop_s: float, instant: bool
) -> RangeAnswers | None:
    """The query client of a replay on `config`'s Prometheus: the ticks' grid answered
    from range queries (tests.engine.rangeanswers); None with `instant`: each tick's
    queries sent as `governor run` sends them (the source's own client)."""
    if instant:
        return None
    p = config.prometheus
    inner = http_query_client(p.url, p.timeout_s, p.disable_ssl, 0, p.query_method)
    tick_s = config.policy.tick_interval_s
    return RangeAnswers(inner, p.url, start_s, stop_s + tick_s, tick_s)


def replay_kept(path: Path, windows: bool = False, instant: bool = False) -> Replay:
    """`replay_world` of the run whose `capacity` JSON (or `make test`'s
    out/engine.json) is `path`."""
    result = json.loads(path.read_text())
    return replay_world(result.get("capacity_at_sla", result), windows=windows, instant=instant)


def replay_world(
    result: dict[str, Any], windows: bool = False, instant: bool = False, phase_s: float = 0.0
) -> Replay:
    """`replay` of the run `result` (a `capacity` JSON) on a Prometheus started on a copy
    of its world's TSDB (`workdir`; the folder is not written); `windows`, `instant` and
    `phase_s` as `replay`."""
    binary = find_prometheus()
    if binary is None:
        raise SystemExit("no Prometheus server binary (`make prometheus`)")
    with tempfile.TemporaryDirectory(prefix="replay-") as tmp:
        shutil.copytree(Path(result["workdir"]) / "data-0", Path(tmp) / "data-0")
        prom = PrometheusServer(binary, Path(tmp), {})
        prom.start(attempts=1)  # attempt 0 reads data-0
        try:
            config = replay_config(Path(result["workdir"]), prom.url)
            query = prometheus_query(prom.url)
            return replay(
                result, config, query=query, windows=windows, instant=instant, phase_s=phase_s
            )
        finally:
            prom.stop()


def _fmt(x: float | None, spec: str = "7.1f") -> str:
    return "-".rjust(len(format(0.0, spec))) if x is None else format(x, spec)


def window_report(r: Replay) -> list[str]:
    """`r`'s window readings (the ticks with any window), each rung's end among them:
    the lines `--windows` prints."""
    if not r.windows:
        return []
    start = r.windows[0].at_s
    rungs = iter(r.rungs)
    rung = next(rungs, None)
    lines: list[str] = []
    for w in r.windows:
        while rung is not None and rung.at_s <= w.at_s:
            lines.append(_rung_line(rung, start))
            rung = next(rungs, None)
        readings = (w.speed_window, w.fit_window, w.clean_window, w.standing_window)
        if any(v is not None for v in readings):
            lines.append(w.line(start))
    lines.extend(_rung_line(g, start) for g in ([rung] if rung else []) + list(rungs))
    return lines


def _rung_line(g: ReplayedRung, start_s: float) -> str:
    return (
        f"-- t+{g.at_s - start_s:6.1f}s rung {g.rate_rps:.2f} req/s "
        f"{'within' if g.within_sla else 'past'}: capacity {_fmt(g.capacity_rps).strip()} "
        f"(live {_fmt(g.live_capacity_rps).strip()})"
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.engine.replay F [F ...] [--rungs] [--windows] [--instant]
    [--json OUT]` (module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="capacity JSON files of kept runs")
    ap.add_argument("--rungs", action="store_true", help="print every rung")
    ap.add_argument("--windows", action="store_true", help="print every tick's window readings")
    ap.add_argument(
        "--instant",
        action="store_true",
        help="send each tick's instant queries as governor run does (same replay, ~10x slower)",
    )
    ap.add_argument("--json", type=Path, help="write every replay here")
    args = ap.parse_args(argv)
    done: dict[str, Any] = {}
    for path in args.runs:
        r = replay_kept(path, windows=args.windows, instant=args.instant)
        done[str(path)] = {**asdict(r), "over_measured": r.over_measured}
        for line in window_report(r):
            print(line)
        if args.rungs:
            for g in r.rungs:
                print(
                    f"  {g.rate_rps:7.2f} req/s {'within' if g.within_sla else 'past  '} "
                    f"live {_fmt(g.live_capacity_rps)} replay {_fmt(g.capacity_rps)} "
                    f"speed {_fmt(g.speed, '6.2f')} seq ratio {_fmt(g.seq_ratio, '6.2f')}"
                )
                if g.means:
                    print("    " + " ".join(f"{k} {_fmt(v, '.1f')}" for k, v in g.means.items()))
        print(
            f"{path}: measured {_fmt(r.measured_capacity_rps)} live {_fmt(r.live_capacity_rps)} "
            f"replay {_fmt(r.capacity_rps)} ({_fmt(r.over_measured, '4.2f')}x) "
            f"scale-up at tick {r.ticks_to_scale_up}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(done, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
