"""How often Prometheus scrapes the engines, as Prometheus itself reports it.

A rate over a window needs two samples, so the governor's short (panic) window must
span at least two scrape intervals (`prometheus.scrape_interval_s` in the config). The
config can be wrong; at start the service asks Prometheus: the engine jobs are those
whose targets export vLLM's running-requests gauge, and each active target of those
jobs reports its `scrapeInterval` in `/api/v1/targets`. The largest one is the answer.
Example: jobs {"vllm"}; targets of job vllm report "15s" and "30s" -> 30.0.

Every failure (unreachable, not Prometheus, no engine targets yet) is None: the check
is advisory, the configured value stays in force. It asks as the control loop asks
(`PrometheusSettings.query_method`, and no TLS verification where `disable_ssl`), so a
Prometheus the loop can read answers the check too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import requests

from estimators.deadline import deadline_session
from estimators.prometheus import query_request

ENGINE_JOBS_QUERY = "count by (job) (vllm:num_requests_running or vllm_num_requests_running)"
_UNIT_S: dict[str, float] = {"y": 365 * 86400.0, "w": 604800.0, "d": 86400.0, "h": 3600.0}
_UNIT_S.update({"m": 60.0, "s": 1.0, "ms": 0.001})
_DURATION = re.compile("".join(rf"(?:(?P<{u}>[0-9]+){u})?" for u in _UNIT_S))
"""Prometheus's duration grammar (model.ParseDuration): whole numbers in ASCII digits,
each unit at most once, largest first ("1h30m", not "30m1h" or "1.5h")."""


def parse_duration_s(text: str) -> float | None:
    """A Prometheus duration ("15s", "1m30s", "500ms") in seconds; None when malformed
    (Prometheus's grammar: `_DURATION`), zero or not finite (a 400-digit count had read
    as infinity)."""
    if not isinstance(text, str) or not text:
        return None
    m = _DURATION.fullmatch(text)
    if m is None:
        return None
    total = sum(float(n) * _UNIT_S[u] for u, n in m.groupdict().items() if n is not None)
    return total if 0 < total < math.inf else None


def engine_scrape_interval_s(
    url: str,
    timeout_s: float = 3.0,
    request: Callable[..., Any] | None = None,
    *,
    method: str = "POST",
    verify: bool = True,
) -> float | None:
    """The largest scrape interval of the engines' active targets, seconds, or None
    when Prometheus cannot say (see the module doc). The jobs query goes with HTTP
    `method` (POST: in a form body; GET: in the URL), the targets API with GET;
    `verify`: check TLS certificates; `request`: a `estimators.deadline.deadline_session`'s
    by default (each request ends by 2 x `timeout_s`: a drip-fed answer held the start)."""
    send = request or deadline_session(verify).request
    base = url.rstrip("/")
    verb, url_params, form = query_request(method, {"query": ENGINE_JOBS_QUERY})
    try:
        jobs_answer = send(
            verb,
            f"{base}/api/v1/query",
            params=url_params,
            data=form,
            timeout=timeout_s,
            verify=verify,
        ).json()
        jobs = {r["metric"].get("job") for r in jobs_answer["data"]["result"]}
        targets = send(
            "GET",
            f"{base}/api/v1/targets",
            params={"state": "active"},
            timeout=timeout_s,
            verify=verify,
        ).json()["data"]["activeTargets"]
        intervals = [_interval_s(t, jobs) for t in targets]  # None: a TypeError
        known = [i for i in intervals if i is not None]
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError):
        return None
    return max(known) if known else None


def _interval_s(target: Any, jobs: set[Any]) -> float | None:
    """The scrape interval of one active target (seconds) when it belongs to one of
    `jobs`; None for anything else (not an object, no or null `labels`, no interval)."""
    if not isinstance(target, dict):
        return None
    labels = target.get("labels")
    job = labels.get("job") if isinstance(labels, dict) else None
    if not isinstance(job, str) or job not in jobs:
        return None
    return parse_duration_s(target.get("scrapeInterval", ""))
