"""Request lengths as the capacity model and the plant learning see them: a lognormal
fitted to a mean and a p95 (tokens), its sigma, its moments truncated at a cap (the
profile's max_model_len, or a quantile), and its quantiles.

Why a lognormal from two numbers: the fleet's metrics give a length histogram's sum,
count and bucket-interpolated quantiles (vLLM's 1-2-5 buckets), so the mean is exact
and the p95 is what PromQL interpolates. A lognormal through both has the long right
tail LLM prompts have; `SIGMA_MAX` keeps a p95 read high inside a wide bucket from
turning that tail into moments ~100x too large (controller.capacity prices them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

_Z95 = 1.6448536269514722
_NORMAL = NormalDist()


SIGMA_MAX = 1.2
"""The largest length sigma the model uses. A p95 read from a histogram is interpolated
within wide buckets (vLLM's 2k-5k-10k-20k-50k edges) and reads 5-15 % high; near the
largest p95 / mean a lognormal can have (3.87, at sigma 1.645) that turns the
long-context trace's true sigma 1.10 (p95 / mean 3.33) into 1.6, and the tail moments
the model uses (up to the 4th) by a factor of ~100."""


def lognormal_sigma(mean: float, p95: float) -> float:
    """Sigma of the lognormal with this mean and p95, at most SIGMA_MAX (0 when p95 <=
    mean; SIGMA_MAX when no lognormal fits). Example: 1,455 / 4,083 -> 0.844."""
    if not (mean > 0 and p95 > mean * (1.0 + 1e-9)):
        return 0.0
    disc = _Z95 * _Z95 - 2.0 * math.log(p95 / mean)
    return SIGMA_MAX if disc < 0 else min(SIGMA_MAX, _Z95 - math.sqrt(disc))


def square_spread(mean: float, p95: float, cap: float) -> float:
    """E[min(L, cap)^2] / mean^2 for lognormal prompts L with this mean and p95 (tokens;
    `lognormal_sigma`), none priced past `cap` (the profile's max_model_len: the
    engines refuse a longer prompt). Example: 12,000 / 40,000 up to 131,072 -> 2.73,
    where exp(sigma^2) (no cap) is 3.35."""
    s = lognormal_sigma(mean, p95)  # 0 for a mean that is not > 0 as well
    if s == 0:
        return 1.0
    mu = math.log(mean) - s * s / 2.0
    log_cap = math.log(cap)
    above = 1.0 - _NORMAL.cdf((log_cap - mu) / s)
    return (partial_moment(2, mu, s, log_cap) + cap * cap * above) / (mean * mean)


def partial_moment(k: int, mu: float, s: float, log_cap: float) -> float:
    """E[L^k; L < exp(log_cap)] of the lognormal with log-mean `mu` and sigma `s` > 0."""
    raw = math.exp(k * mu + k * k * s * s / 2.0)
    return raw * _NORMAL.cdf((log_cap - mu - k * s * s) / s)


def normal_quantile(q: float) -> float:
    """The standard normal's `q`-quantile, `q` kept within [1e-9, 1 - 1e-9]: a goal the
    config accepts (< 1) can still round a quantile to 1.0 (0.9999999999999999's
    p99.75-style cut: 1 - (1 - goal) / 4 == 1.0), where inv_cdf raises and the tick
    of every model would fail."""
    return _NORMAL.inv_cdf(min(max(q, 1e-9), 1.0 - 1e-9))


@dataclass(frozen=True, slots=True)
class Prompts:
    """Prompt-length statistics the model needs (tokens; moments truncated at cap)."""

    mu: float
    sigma: float
    m1: float
    m2: float
    m3: float
    m4: float
    cap: float

    @staticmethod
    def of(mean: float, p95: float, cap: float, top_q: float) -> Prompts:
        """Statistics of prompts up to the `top_q` quantile (and `cap` tokens)."""
        s = lognormal_sigma(mean, p95)
        mu = math.log(max(mean, 1e-9)) - s * s / 2.0
        log_cap = math.log(cap)
        if s > 0:
            log_cap = min(log_cap, mu + s * normal_quantile(top_q))

        def moment(k: int) -> float:
            if s == 0:
                return math.exp(k * mu)  # every prompt at the mean
            return partial_moment(k, mu, s, log_cap)

        return Prompts(mu, s, mean, moment(2), moment(3), moment(4), cap)

    def quantile(self, q: float) -> float:
        if self.sigma == 0:
            return self.m1
        return min(math.exp(self.mu + self.sigma * normal_quantile(q)), self.cap)
