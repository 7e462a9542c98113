"""A kept real-engine capacity run replayed through today's decider, open loop.

`python -m tests.engine.capacity --json F` keeps its world's folder (the Prometheus
TSDB the governor read and the governor's config, `workdir` in F) and records each
rung's end and the step's start in unix seconds. `python -m tests.engine.replay F
[F ...]` starts a Prometheus on a copy of each run's TSDB, ticks a `ControlLoop` of
today's code over the run at the governor's tick interval (every query evaluated at the
tick's time, as `governor run` does), and prints, per rung, the live governor's capacity
per replica next to the replayed one, then the replayed capacity at the end of the last
rung within the SLA against the measured capacity, and the ticks from the step to the
first scale-up. With `--rungs` it also prints where each rung's time went, from the
engine's own histograms over the rung (`rung_means`). `make test`'s out/engine.json
replays too (its `capacity_at_sla`; the world's folder is pytest's tmp folder, which
pytest keeps for its last three runs).

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

import structlog
import yaml

from controller.config import GovernorConfig
from controller.loop import ControlLoop
from estimators.types import MetricSource
from tests.engine.capacity import LADDER_POLICY, Rung, served_within_sla
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
) -> Replay:
    """Tick today's loop over the run in `result` (a `capacity` JSON with rung end
    times) against `source` (default: the Prometheus in `config`, as `governor run`
    reads it); see the module doc. With `query`, each rung's `rung_means` too."""
    from service.run import prometheus_source

    rungs = [_rung(r) for r in result["rungs"]]
    ends = [r.ended_unix_s for r in rungs if r.ended_unix_s is not None]
    if not rungs or len(ends) != len(rungs):
        raise ValueError("the run records no rung end times (capacity.py before replays)")
    step_at = result.get("step_started_unix_s")
    tick_s = config.policy.tick_interval_s
    if source is None:
        source = prometheus_source(config, reported_s=lambda _url, _timeout: None)
    loop = ControlLoop(
        config, source, logger=_quiet_logger(), pause_gc=False, switch_interval_s=None
    )
    name = config.models[0].name
    start, stop = replay_span(result, tick_s)
    out = Replay()
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


def replay_kept(path: Path) -> Replay:
    """`replay_world` of the run whose `capacity` JSON (or `make test`'s
    out/engine.json) is `path`."""
    result = json.loads(path.read_text())
    return replay_world(result.get("capacity_at_sla", result))


def replay_world(result: dict[str, Any]) -> Replay:
    """`replay` of the run `result` (a `capacity` JSON) on a Prometheus started on a copy
    of its world's TSDB (`workdir`; the folder is not written)."""
    binary = find_prometheus()
    if binary is None:
        raise SystemExit("no Prometheus server binary (`make prometheus`)")
    with tempfile.TemporaryDirectory(prefix="replay-") as tmp:
        shutil.copytree(Path(result["workdir"]) / "data-0", Path(tmp) / "data-0")
        prom = PrometheusServer(binary, Path(tmp), {})
        prom.start(attempts=1)  # attempt 0 reads data-0
        try:
            config = replay_config(Path(result["workdir"]), prom.url)
            return replay(result, config, query=prometheus_query(prom.url))
        finally:
            prom.stop()


def _fmt(x: float | None, spec: str = "7.1f") -> str:
    return "-".rjust(len(format(0.0, spec))) if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.engine.replay F [F ...] [--rungs] [--json OUT]` (module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="capacity JSON files of kept runs")
    ap.add_argument("--rungs", action="store_true", help="print every rung")
    ap.add_argument("--json", type=Path, help="write every replay here")
    args = ap.parse_args(argv)
    done: dict[str, Any] = {}
    for path in args.runs:
        r = replay_kept(path)
        done[str(path)] = {**asdict(r), "over_measured": r.over_measured}
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
