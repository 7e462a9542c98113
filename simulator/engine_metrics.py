"""simulator.engine_metrics: one simulated engine's cumulative vLLM metrics.

The bottom of the simulator's layers: `simulator.engine` updates an `EngineMetrics` in
its hot loop; `simulator.metrics` reads it the way Prometheus would. A histogram is a
list of per-bucket counts aligned with its bounds, the last entry the +Inf overflow, plus
a running sum (seconds or tokens). Counters only grow. Names and buckets are vLLM V1's.
"""

from __future__ import annotations

from collections.abc import Sequence

from estimators.histogram import (
    E2E_BUCKETS_S,
    ITL_BUCKETS_S,
    QUEUE_BUCKETS_S,
    TTFT_BUCKETS_S,
    token_buckets,
)

ITL_BUCKETS_MS: tuple[float, ...] = tuple(b * 1000.0 for b in ITL_BUCKETS_S)
"""ITL bucket bounds in milliseconds (step durations are computed in ms)."""

ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
)
"""vLLM's `vllm:iteration_tokens_total` bucket bounds (tokens per step)."""

REQUEST_PHASE_BUCKETS_S: tuple[float, ...] = E2E_BUCKETS_S
"""vLLM's bounds for per-request prefill and decode times (its request-latency buckets)."""
TPOT_BUCKETS_S: tuple[float, ...] = ITL_BUCKETS_S
"""vLLM's bounds for `vllm:request_time_per_output_token_seconds` (same as ITL)."""

HIST_ATTRS: tuple[str, ...] = (
    "ttft",
    "itl",
    "e2e",
    "queue",
    "req_prompt",
    "req_gen",
    "iter_tokens",
    "prefill_t",
    "decode_t",
    "tpot",
)
"""The histogram attributes of `EngineMetrics`, in snapshot order."""


def hist_bounds(attr: str, max_model_len: int) -> tuple[float, ...]:
    """Bucket bounds of histogram `attr` (token bounds depend on `max_model_len`)."""
    if attr in ("req_prompt", "req_gen"):
        return token_buckets(max_model_len)
    return {
        "ttft": TTFT_BUCKETS_S,
        "itl": ITL_BUCKETS_S,
        "e2e": E2E_BUCKETS_S,
        "queue": QUEUE_BUCKETS_S,
        "iter_tokens": ITERATION_TOKENS_BUCKETS,
        "prefill_t": REQUEST_PHASE_BUCKETS_S,
        "decode_t": REQUEST_PHASE_BUCKETS_S,
        "tpot": TPOT_BUCKETS_S,
    }[attr]


def _zeros(bounds: Sequence[float]) -> list[int]:
    return [0] * (len(bounds) + 1)


class EngineMetrics:
    """Cumulative metrics of one engine, updated in place by `simulator.engine.Engine`.

    Histograms (see `HIST_ATTRS`) are lists of per-bucket counts aligned with their
    bounds, plus one final +Inf bucket; `*_sum` holds the sum of observed values
    (seconds or tokens). Per-request phases follow vLLM V1: `prefill_t` = first token -
    first scheduled, `decode_t` = last token - first token, `tpot` = decode_t / (output
    tokens - 1) for outputs of 2+ tokens. Busy time is the total duration of executed
    steps, seconds.
    """

    __slots__ = (
        "busy_s",
        "decode_t",
        "decode_t_sum",
        "e2e",
        "e2e_sum",
        "generation_tokens",
        "iter_tokens",
        "iter_tokens_sum",
        "itl",
        "itl_sum",
        "preemptions",
        "prefill_t",
        "prefill_t_sum",
        "prefix_hits",
        "prefix_queries",
        "prompt_tokens",
        "queue",
        "queue_sum",
        "refused",
        "req_gen",
        "req_gen_sum",
        "req_prompt",
        "req_prompt_sum",
        "steps",
        "success",
        "token_bounds",
        "tpot",
        "tpot_sum",
        "ttft",
        "ttft_sum",
    )

    def __init__(self, max_model_len: int) -> None:
        self.token_bounds: tuple[float, ...] = token_buckets(max_model_len)
        self.success = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.refused = 0
        self.busy_s = 0.0
        self.steps = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.ttft = _zeros(TTFT_BUCKETS_S)
        self.ttft_sum = 0.0
        self.itl = _zeros(ITL_BUCKETS_S)
        self.itl_sum = 0.0
        self.e2e = _zeros(E2E_BUCKETS_S)
        self.e2e_sum = 0.0
        self.queue = _zeros(QUEUE_BUCKETS_S)
        self.queue_sum = 0.0
        self.req_prompt = _zeros(self.token_bounds)
        self.req_prompt_sum = 0.0
        self.req_gen = _zeros(self.token_bounds)
        self.req_gen_sum = 0.0
        self.iter_tokens = _zeros(ITERATION_TOKENS_BUCKETS)
        self.iter_tokens_sum = 0.0
        self.prefill_t = _zeros(REQUEST_PHASE_BUCKETS_S)
        self.prefill_t_sum = 0.0
        self.decode_t = _zeros(REQUEST_PHASE_BUCKETS_S)
        self.decode_t_sum = 0.0
        self.tpot = _zeros(TPOT_BUCKETS_S)
        self.tpot_sum = 0.0
