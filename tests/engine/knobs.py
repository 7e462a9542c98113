"""The engine's per-request streaming speed and the governor's knobs, read on the real-engine
world (tests/engine/realengine.py): what `benchmarks.engine_knobs` prints and the slo-knob
test of tests/engine/test_real_engine.py asserts.

`vllm:request_time_per_output_token_seconds` is each request's time per output token, the
streaming speed the SLA's ITL target judges; its bucket edges (EDGES_MS) make the share
within a target at an edge exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from tests.engine.realengine import ADMIN_DEADLINE_S, MODEL_NAME, EngineWorld, metric_value

TPOT = "vllm:request_time_per_output_token_seconds"
EDGES_MS = (10, 25, 50, 75, 100, 150, 200, 300, 400, 500, 750, 1000)
"""Bucket edges of vLLM 0.32's TPOT histogram up to 1 s (ms)."""


SHOWN_MS = (10, 25, 50)
"""The edges whose shares are printed beside the target's."""


@dataclass(frozen=True)
class Window:
    """The engine's TPOT over one window: requests, the share within the target and
    within each of SHOWN_MS (edge ms -> fraction), the mean (ms), requests served per
    second."""

    requests: int
    within_frac: float | None
    within_by_edge: dict[int, float]
    tpot_mean_ms: float | None
    rps: float


def _tpot_counts(world: EngineWorld, edges_ms: tuple[int, ...]) -> tuple[float, float, list[float]]:
    """(requests, sum of TPOT in seconds, requests within each of `edges_ms`) so far."""
    text = world.engine.metrics()
    count = metric_value(text, f"{TPOT}_count", model_name=MODEL_NAME)
    total = metric_value(text, f"{TPOT}_sum", model_name=MODEL_NAME)
    within = [
        metric_value(text, f"{TPOT}_bucket", model_name=MODEL_NAME, le=f"{e / 1000.0:g}")
        for e in edges_ms
    ]
    if count is None or total is None or any(w is None for w in within):
        raise RuntimeError(f"{TPOT} (count, sum, buckets {edges_ms} ms) missing from the engine")
    return count, total, within  # type: ignore[return-value]


def measure_window(world: EngineWorld, itl_ms: int, window_s: float) -> Window:
    """The engine's TPOT numbers over the next `window_s` seconds."""
    edges = (itl_ms, *SHOWN_MS)
    n0, s0, w0 = _tpot_counts(world, edges)
    start = time.monotonic()
    time.sleep(window_s)
    n1, s1, w1 = _tpot_counts(world, edges)
    elapsed = time.monotonic() - start
    n = n1 - n0
    shares = [(b - a) / n if n > 0 else None for a, b in zip(w0, w1, strict=True)]
    return Window(
        requests=int(n),
        within_frac=shares[0],
        within_by_edge={
            e: round(f, 4) for e, f in zip(SHOWN_MS, shares[1:], strict=True) if f is not None
        },
        tpot_mean_ms=1000.0 * (s1 - s0) / n if n > 0 else None,
        rps=n / elapsed,
    )


def slo_target(itl_ms: int) -> Callable[[pb.ModelTarget], None]:
    """A change for realengine.target_changed: the ITL target `itl_ms` and the batching
    policy `slo`."""

    def change(target: pb.ModelTarget) -> None:
        target.sla.itl_p95_ms = itl_ms
        target.batching_policy = "slo"

    return change


def governor_view(world: EngineWorld) -> dict[str, object]:
    """The knobs the governor serves now (`max_num_seqs`, `max_num_batched_tokens`), its
    knob reason, learned speed, per-sequence ratio and knob correction, and the running
    and waiting requests it observed."""
    with world.governor_channel() as channel:
        status = pb_grpc.AdminServiceStub(channel).GetStatus(
            pb.GetStatusRequest(), timeout=ADMIN_DEADLINE_S
        )
    m = next(m for m in status.models if m.model == MODEL_NAME)
    d = m.decision
    return {
        "max_num_seqs": m.published.max_num_seqs,
        "max_num_batched_tokens": m.published.max_num_batched_tokens,
        "reason": d.knob_reason,
        "speed": round(d.plant_speed, 2),
        "seq_ratio": round(d.plant_seq_ratio, 2),
        "knob_correction": round(d.knob_correction, 3) if d.HasField("knob_correction") else None,
        "running": m.observation.running,
        "waiting": m.observation.waiting,
    }
