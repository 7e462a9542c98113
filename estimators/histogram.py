"""Histogram arithmetic the way Prometheus does it.

`histogram_quantile` follows PromQL's `histogram_quantile` (linear interpolation inside
the bucket, the lowest bucket interpolated from 0 when its bound is positive, the +Inf
bucket answered with the highest finite bound). `fraction_le` is the exact attainment
`bucket(le=x) / count` when `x` is a bucket edge. Buckets are (upper bound, cumulative
count) pairs sorted by bound, the last one +Inf. A histogram with any count that is not
a finite number >= 0 (NaN, an infinity, a negative rate) is unknown: both answer None,
never a quantile or fraction read past the bad count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Buckets = Sequence[tuple[float, float]]
_INF = math.inf


def _counts_ok(buckets: Buckets) -> bool:
    """Every count a finite number >= 0 (NaN fails the comparison)."""
    return all(0.0 <= c < _INF for _b, c in buckets)


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile (0 <= q <= 1) of cumulative `buckets`, or None when there is no data.

    Example: buckets [(0.1, 50), (0.2, 100), (inf, 100)], q=0.95 -> 0.1 + 0.1 * 45/50 = 0.19.
    """
    if not 0.0 <= q <= 1.0 or not buckets:
        return None
    if not math.isinf(buckets[-1][0]):
        return None  # PromQL returns NaN without a +Inf bucket
    total = buckets[-1][1]
    if not math.isfinite(total) or total <= 0 or not _counts_ok(buckets):
        return None
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for i, (bound, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(bound):
                return buckets[i - 1][0] if i > 0 else None
            if i == 0 and bound <= 0:
                return bound
            lower = prev_bound if i > 0 else 0.0
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return bound
            return lower + (bound - lower) * (rank - prev_count) / in_bucket
        prev_bound, prev_count = bound, count
    return buckets[-2][0] if len(buckets) > 1 else None


def fraction_le(threshold: float, buckets: Buckets, rel_tol: float = 1e-9) -> float | None:
    """Exact fraction of observations <= `threshold` when it is a bucket edge, else None
    (also None without the `+Inf` bucket as the last: its count is the total, and any
    other bucket as the total reads the observations past it as within; and None with
    any count that is not a finite number >= 0: the module doc)."""
    if not buckets or not math.isinf(buckets[-1][0]):
        return None
    total = buckets[-1][1]
    if not math.isfinite(total) or total <= 0 or not _counts_ok(buckets):
        return None
    for bound, count in buckets:
        if math.isclose(bound, threshold, rel_tol=rel_tol):
            return min(1.0, max(0.0, count / total))
    return None


# vLLM's histogram bucket bounds (docs/ARCHITECTURE.md, Signals), seconds or tokens.
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS_S: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
QUEUE_BUCKETS_S = E2E_BUCKETS_S
# vLLM's buckets of the per-request phase times (`vllm:request_prefill_time_seconds`,
# `vllm:request_decode_time_seconds`; newer releases also use them for e2e and queue).
PHASE_BUCKETS_S: tuple[float, ...] = (0.1, 0.2, *E2E_BUCKETS_S)
# `vllm:request_time_per_output_token_seconds` shares the ITL buckets.
TPOT_BUCKETS_S = ITL_BUCKETS_S


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 token-count buckets up to `max_model_len` (inclusive cap)."""
    out: list[float] = []
    mantissa = (1, 2, 5)
    exp = 0
    while True:
        for m in mantissa:
            v = m * 10**exp
            if v > max_model_len:
                return tuple(out)
            out.append(float(v))
        exp += 1
