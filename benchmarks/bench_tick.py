"""Tick cost and Prometheus queries per tick for 1, 100, 1,000 and 5,000 models.

One control tick as `governor run` does it, on replayed Prometheus answers: observe
(`PrometheusSource` over `benchmarks.promreplay.ReplayClient`: the recording of a real
Prometheus scaled to N models, each answer's HTTP body decoded by the source on every
query, as with its default HTTP client) + decide (one `Decider` per model) + publish
(the `DecisionBoard` engines and KEDA read), with the controller's own metrics and its
logging at info (`controller.logs.configure_logging`, written to /dev/null: a `tick`
line, and a `decision` line per model whose decision changed). The HTTP round trip to
Prometheus is not included (it is Prometheus's CPU, not ours).

Reported per size: median CPU ms per tick over the measured ticks (after warm-up
ticks) of `--rounds` rounds over all sizes, pooled; CPU per model (us); queries per
tick; and at 1,000 models a phase breakdown from an instrumented pass: JSON decode
(`estimators.decode.AnswerDecoder.samples`), answer parsing (observe minus decode; it
includes freeing the decoded answers and building the Observations), decide,
metrics, logging, publish, the cyclic GC's run as the tick ends (`gc`), and the rest of
the loop (queries, snapshots, history, timers). Every tick gets its own answers (no
input repeats). After the warm-up ticks the heap alive is frozen
(`controller.loop.freeze_startup_heap`), as `governor run` does once it serves. Also the
service tick (`ServiceCore.tick`: + targets poll + state
document, MemoryStore) at 1,000 models.

A measured tick must have measured a tick over data: the source's queries all sent,
a valid decision with data for every model, every model published (`tick_problems`);
else the rows fail, "NOT MEASURED" and the reason in their value (a tick whose queries
all fail costs ~10x less and read as a goal met).

Goals (issue 7): 1,000 models <= 50 ms CPU per tick; cost per model not growing with
N (5,000 vs 1,000 within +25 %); queries per tick constant in N and <= 15.
Run: `.venv/bin/python -m benchmarks.bench_tick [--sizes 1,100,1000,5000] [--json F]`.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from actuators.publisher import DecisionBoard, ModelSlot
from benchmarks.common import (
    Row,
    bench_args,
    fleet_config,
    median,
    print_rows,
    write_rows,
)
from benchmarks.promreplay import ReplayClient, model_names
from controller.config import GovernorConfig
from controller.loop import ControlLoop, freeze_startup_heap
from controller.metrics import GovernorMetrics
from controller.types import Decision, Knobs, Reason
from estimators.prometheus import PrometheusSource
from estimators.types import ModelQuery, ObservationResult

GOAL_CPU_MS_1000 = 50.0
GOAL_QUERIES = 15
GOAL_LINEAR_FRAC = 1.25
TICK_S = 5.0
WINDOW_S = 60.0
PANIC_WINDOW_S = 10.0


def _devnull_logging() -> None:
    """`governor run`'s logging (JSON lines, info) with the stream on /dev/null."""
    from controller.logs import configure_logging

    saved = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the logger keeps it for the process
    try:
        configure_logging("info", json=True)
    finally:
        sys.stderr = saved


class _Phases:
    """CPU seconds per phase, summed (instrumented pass only)."""

    def __init__(self) -> None:
        self.s: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.s[name] = self.s.get(name, 0.0) + seconds


class _GcTimer:
    """A `gc.callbacks` entry summing the CPU of the cyclic collector's runs as phase
    `gc`: the loop pauses it during a tick, so it runs once as the tick ends, over the
    containers the tick left alive (decisions, states, observations, snapshots)."""

    def __init__(self, phases: _Phases) -> None:
        self.phases, self.c0 = phases, 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self.c0 = time.process_time()
        else:
            self.phases.add("gc", time.process_time() - self.c0)


class _TimedSource:
    def __init__(self, inner: PrometheusSource, phases: _Phases) -> None:
        self.inner, self.phases = inner, phases

    def observe(self, models: Sequence[ModelQuery], now_s: float) -> dict[str, ObservationResult]:
        c0 = time.process_time()
        try:
            return self.inner.observe(models, now_s)
        finally:
            self.phases.add("observe", time.process_time() - c0)


class _TimedBoard:
    def __init__(self, inner: DecisionBoard, phases: _Phases) -> None:
        self.inner, self.phases = inner, phases

    def apply(self, decisions: Sequence[Decision]) -> None:
        c0 = time.process_time()
        self.inner.apply(decisions)
        self.phases.add("publish", time.process_time() - c0)


class _TimedLogger:
    def __init__(self, inner: Any, phases: _Phases) -> None:
        self.inner, self.phases = inner, phases

    def info(self, *a: Any, **k: Any) -> Any:
        c0 = time.process_time()
        self.inner.info(*a, **k)
        self.phases.add("log", time.process_time() - c0)

    def debug(self, *a: Any, **k: Any) -> Any:
        c0 = time.process_time()
        self.inner.debug(*a, **k)
        self.phases.add("log", time.process_time() - c0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _TimedMetrics(GovernorMetrics):
    phases: _Phases

    def record(self, d: Decision, staleness_s: float | None, paused: bool = False) -> None:
        c0 = time.process_time()
        super().record(d, staleness_s, paused)
        self.phases.add("metrics", time.process_time() - c0)


class Rig:
    """One governor's loop over N models on replayed answers (see module doc)."""

    def __init__(self, n: int, *, instrumented: bool = False, variants: int = 4) -> None:
        import structlog

        names = model_names(n)
        self.config: GovernorConfig = fleet_config(n, names)
        self.phases = _Phases()
        self.client: ReplayClient | None = None
        source = PrometheusSource(
            "http://replay",
            window_s=WINDOW_S,
            short_window_s=PANIC_WINDOW_S,
            client=_Lazy(),
        )
        self.client = ReplayClient(source.queries, n, variants=variants)
        source._client = self.client
        self.source = source
        self.board = DecisionBoard(
            [
                ModelSlot(
                    m.name,
                    m.namespace,
                    Knobs(m.knobs.default_max_num_seqs, m.knobs.default_max_num_batched_tokens),
                )
                for m in self.config.models
            ],
            logger=structlog.wrap_logger(structlog.ReturnLogger()),
        )
        logger = structlog.get_logger("governor.loop")
        metrics: GovernorMetrics
        if instrumented:
            metrics = _TimedMetrics()
            metrics.phases = self.phases
            self.loop = ControlLoop(
                self.config,
                _TimedSource(source, self.phases),
                [_TimedBoard(self.board, self.phases)],
                metrics=metrics,
                # Bound once, as the loop binds its lazy logger once per tick: timing the
                # lazy proxy would count a bind per line (about 3x the line's cost).
                logger=_TimedLogger(logger.bind(), self.phases),
            )
            for d in self.loop._deciders.values():
                d.decide = _timed(d.decide, self.phases, "decide")  # type: ignore[method-assign]
        else:
            self.loop = ControlLoop(self.config, source, [self.board], metrics=GovernorMetrics())
        self.now = 1000.0
        self.decisions: list[Decision] = []
        """The latest tick's decisions (`tick_problems` checks them)."""

    def tick(self) -> float:
        """One tick; returns its CPU seconds."""
        c0 = time.process_time()
        self.decisions = self.loop.tick(self.now)
        cpu = time.process_time() - c0
        self.now += TICK_S
        return cpu


class _Lazy:
    """Placeholder client until the replay client (which needs the queries) exists."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        raise RuntimeError("replay client not set")


def _timed(fn: Any, phases: _Phases, name: str) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        c0 = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            phases.add(name, time.process_time() - c0)

    return wrapper


NO_DATA_REASONS = frozenset({Reason.NO_DATA_HOLD, Reason.NO_DATA_FALLBACK, Reason.KNOBS_NO_DATA})
"""A decision made without the replayed data: the tick skipped the work it measures."""


def tick_problems(rig: Rig, n: int) -> list[str]:
    """Why the latest tick of `rig` did not measure a tick over `n` models' data: fewer
    decisions than models, a decision invalid or made without data (a replayed answer
    that failed, a query the recording does not hold), or a query count other than the
    source's queries. Empty when it did (a tick that fails is ~10x cheaper)."""
    problems = []
    expected = len(list(rig.source.queries.items()))
    if rig.source.queries_last_tick != expected:
        problems.append(f"{rig.source.queries_last_tick} queries sent, expected {expected}")
    if len(rig.decisions) != n:
        problems.append(f"{len(rig.decisions)} decisions for {n} models")
    bad = [
        d
        for d in rig.decisions
        if not d.valid or d.knob_reason in NO_DATA_REASONS or NO_DATA_REASONS & set(d.reasons)
    ]
    if bad:
        why = bad[0].detail or " ".join(r.value for r in bad[0].reasons)
        why = why if len(why) <= 120 else why[:117] + "..."
        problems.append(
            f"{len(bad)} of {n} decisions invalid or without data (first: {bad[0].model}: {why})"
        )
    return problems


def measure(n: int, ticks: int, warmup: int = 2, breakdown: bool = True) -> dict[str, Any]:
    """Median CPU/wall per tick and (with `breakdown`) the phase breakdown for `n` models.
    Every tick gets its own answers (`warmup + ticks` variants): no input repeats.
    `problems`: why a measured tick did not measure what it should (`tick_problems`, and
    fewer models published than ticked); the rows fail on any."""
    rig = Rig(n, variants=warmup + ticks)
    assert rig.client is not None
    for _ in range(warmup):
        rig.tick()
    freeze_startup_heap()  # as `governor run` does once it serves
    cpus, walls, queries = [], [], []
    seen: dict[str, int] = {}  # problem -> measured ticks that had it
    gc_before = sum(s["collections"] for s in gc.get_stats())
    for _ in range(ticks):
        w0 = time.perf_counter()
        cpus.append(rig.tick())
        walls.append(time.perf_counter() - w0)
        queries.append(rig.source.queries_last_tick)
        for problem in tick_problems(rig, n):
            seen[problem] = seen.get(problem, 0) + 1
    gc_runs = sum(s["collections"] for s in gc.get_stats()) - gc_before
    bytes_per_tick = rig.client.bytes_per_tick
    valid = sum(1 for d in rig.board.snapshot().values() if d.replicas is not None)
    problems = [f"{p} ({k} of {ticks} ticks)" for p, k in seen.items()]
    if valid < n:
        problems.append(f"{valid} of {n} models published")
    gc.unfreeze()
    del rig
    gc.collect()

    out: dict[str, Any] = {
        "models": n,
        "ticks": ticks,
        "cpu_ms_median": median(cpus) * 1000.0,
        "wall_ms_median": median(walls) * 1000.0,
        "cpu_ms_all": [round(c * 1000.0, 2) for c in cpus],
        "cpu_us_per_model": median(cpus) * 1e6 / n,
        "queries_per_tick": max(queries),
        "queries_per_tick_min": min(queries),
        "answer_mb_per_tick": bytes_per_tick / 1e6,
        "gc_collections_per_tick": gc_runs / ticks,
        "models_published": valid,
        "problems": problems,
        "breakdown_ms": {},
    }
    if not breakdown:
        return out
    # Instrumented pass: where the time goes (timer overhead included, so the phases
    # add up to a little more than the headline).
    rig = Rig(n, instrumented=True, variants=warmup + ticks)
    assert rig.client is not None
    for _ in range(warmup):
        rig.tick()
    freeze_startup_heap()
    decoder = rig.source._decoder
    decoder.samples = _timed(decoder.samples, rig.phases, "decode")  # type: ignore[method-assign]
    rig.phases.s.clear()
    rig.client.decode_cpu_s = 0.0
    inst_cpu = 0.0
    collector = _GcTimer(rig.phases)
    gc.callbacks.append(collector)
    try:
        for _ in range(ticks):
            inst_cpu += rig.tick()
    finally:
        gc.callbacks.remove(collector)
    gc.unfreeze()
    ph = {k: v / ticks * 1000.0 for k, v in rig.phases.s.items()}
    decode_ms = ph.get("decode", 0.0) + rig.client.decode_cpu_s / ticks * 1000.0
    phases = {
        "decode_ms": decode_ms,
        "parse_ms": ph.get("observe", 0.0) - decode_ms,
        "decide_ms": ph.get("decide", 0.0),
        "metrics_ms": ph.get("metrics", 0.0),
        "log_ms": ph.get("log", 0.0),
        "publish_ms": ph.get("publish", 0.0),
        "gc_ms": ph.get("gc", 0.0),
    }
    phases["loop_other_ms"] = inst_cpu / ticks * 1000.0 - sum(phases.values())
    del rig
    gc.collect()
    out["breakdown_ms"] = {k: round(v, 2) for k, v in phases.items()}
    return out


def measure_service(n: int, ticks: int, warmup: int = 2) -> dict[str, Any]:
    """Median CPU ms of `ServiceCore.tick` (the `governor run` tick: targets poll, loop
    tick, state document) for `n` models, MemoryStore, with `governor run`'s logging."""
    from service.core import ServiceCore
    from service.store import MemoryStore

    names = model_names(n)
    cfg = fleet_config(n, names)
    src = PrometheusSource(
        "http://replay", window_s=WINDOW_S, short_window_s=PANIC_WINDOW_S, client=_Lazy()
    )
    src._client = ReplayClient(src.queries, n)
    core = ServiceCore(cfg, src, MemoryStore())
    now = 1000.0
    cpus = []
    for i in range(warmup + ticks):
        if i == warmup:
            freeze_startup_heap()
        c0 = time.process_time()
        core.tick(now)
        if i >= warmup:
            cpus.append(time.process_time() - c0)
        now += TICK_S
    gc.unfreeze()
    core.close()
    return {"models": n, "cpu_ms_median": median(cpus) * 1000.0}


def _rounds(sizes: list[int], rounds: int, ticks_arg: int) -> dict[int, list[dict[str, Any]]]:
    """`rounds` rounds over all sizes (a burst of load from other users of the machine
    then spreads over the sizes instead of landing on one of them)."""
    by_round: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for rnd in range(rounds):
        for n in sizes:
            ticks = ticks_arg or (8 if n <= 100 else 5 if n <= 1000 else 3)
            r = measure(n, ticks, breakdown=False)
            by_round[n].append(r)
            print(
                f"round {rnd + 1}: {n:>5} models: {r['cpu_ms_median']:8.1f} ms cpu/tick "
                f"(wall {r['wall_ms_median']:.1f}), {r['cpu_us_per_model']:.0f} us/model, "
                f"{r['queries_per_tick']} queries, {r['answer_mb_per_tick']:.2f} MB answers"
                + (f"; NOT MEASURED: {'; '.join(r['problems'])}" if r["problems"] else ""),
                flush=True,
            )
    return by_round


def _pooled(sizes: list[int], by_round: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per size: the rounds' ticks pooled; the breakdown at 1,000 models (or the largest)."""
    results = []
    for n in sizes:
        runs = by_round[n]
        cpus = [c for r in runs for c in r["cpu_ms_all"]]
        r = dict(runs[-1])
        r.update(
            {
                "cpu_ms_all": cpus,
                "cpu_ms_median": median(cpus),
                "cpu_us_per_model": median(cpus) * 1000.0 / n,
                "wall_ms_median": median(x["wall_ms_median"] for x in runs),
                "queries_per_tick": max(x["queries_per_tick"] for x in runs),
                "queries_per_tick_min": min(x["queries_per_tick_min"] for x in runs),
                "models_published": min(x["models_published"] for x in runs),
                "problems": [p for x in runs for p in x["problems"]],
                "rounds": len(runs),
            }
        )
        if n == 1000 or (n == max(sizes) and 1000 not in sizes):
            b = measure(n, 5, breakdown=True)["breakdown_ms"]
            r["breakdown_ms"] = b
            print(f"{n} models, breakdown (ms CPU): {b}", flush=True)
        results.append(r)
    return results


def _unmeasured(results: list[dict[str, Any]]) -> str:
    """The problems of `results` (`measure`'s), as a row's reason; empty when none."""
    problems = [f"{r['models']:,} models: {p}" for r in results for p in r.get("problems", [])]
    if not problems:
        return ""
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; NOT MEASURED, the ticks had no data: " + "; ".join(problems[:3]) + more


def _tick_rows(results: list[dict[str, Any]], service: dict[str, Any] | None) -> list[Row]:
    """The cost rows; a row whose ticks did not measure a tick with data (`problems`)
    fails whatever its numbers, the reason in its value."""
    rows: list[Row] = []
    by_n = {r["models"]: r for r in results}
    for r in results:
        n = r["models"]
        goal, met = "", None
        if n == 1000:
            goal, met = f"<= {GOAL_CPU_MS_1000:g} ms", r["cpu_ms_median"] <= GOAL_CPU_MS_1000
        why = _unmeasured([r])
        rows.append(
            Row(
                "1 tick cost",
                f"observe+decide+publish, {n:,} models (CPU/tick)",
                f"{r['cpu_ms_median']:.1f} ms ({r['cpu_us_per_model']:.0f} us/model){why}",
                goal,
                False if why else met,
                r,
            )
        )
    if 1000 in by_n and 5000 in by_n:
        ratio = by_n[5000]["cpu_us_per_model"] / by_n[1000]["cpu_us_per_model"]
        why = _unmeasured([by_n[1000], by_n[5000]])
        rows.append(
            Row(
                "1 tick cost",
                "growth: per-model cost at 5,000 / at 1,000",
                f"{ratio:.2f}x{why}",
                f"<= {GOAL_LINEAR_FRAC:g}x (linear)",
                ratio <= GOAL_LINEAR_FRAC and not why,
                {"ratio": ratio},
            )
        )
    if 1000 in by_n:
        b = by_n[1000]["breakdown_ms"]
        rows.append(
            Row(
                "1 tick cost",
                "breakdown at 1,000 models (ms CPU)",
                ", ".join(f"{k[:-3]} {v:.1f}" for k, v in b.items()),
                data=b,
            )
        )
    if service is not None:
        rows.append(
            Row(
                "1 tick cost",
                "service tick (+ targets poll, state doc), 1,000",
                f"{service['cpu_ms_median']:.1f} ms",
                data=service,
            )
        )
    return rows


def _query_row(results: list[dict[str, Any]]) -> Row:
    qs = {r["models"]: r["queries_per_tick"] for r in results}
    constant = len(set(qs.values())) == 1 and all(
        r["queries_per_tick"] == r["queries_per_tick_min"] for r in results
    )
    why = _unmeasured(results)  # a failing tick stops after its first query
    return Row(
        "2 Prometheus queries",
        "queries per tick for " + ", ".join(f"{n:,}" for n in qs) + " models",
        ", ".join(str(q) for q in qs.values()) + why,
        f"constant, <= {GOAL_QUERIES}",
        constant and max(qs.values()) <= GOAL_QUERIES and not why,
        {"queries_per_tick": qs},
    )


def main(argv: list[str] | None = None) -> list[Row]:
    ap = bench_args(__doc__)
    ap.add_argument("--sizes", default="1,100,1000,5000")
    ap.add_argument("--ticks", type=int, default=0, help="measured ticks per size and round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over all sizes")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes = [s for s in sizes if s <= 100] or [1]
        args.rounds = 1
    _devnull_logging()
    results = _pooled(sizes, _rounds(sizes, args.rounds, args.ticks))
    service = None
    if not args.quick and 1000 in sizes:
        service = measure_service(1000, 5)
        print(f"service tick, 1000 models: {service['cpu_ms_median']:.1f} ms cpu", flush=True)
    rows = [*_tick_rows(results, service), _query_row(results)]
    write_rows(args.json, "tick", rows, results)
    return rows


if __name__ == "__main__":
    print_rows(main())
