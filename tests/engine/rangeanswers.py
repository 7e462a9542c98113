"""A replay's query client: each query evaluated over the whole replay in one range query.

A replay (tests/engine/replay.py) ticks today's `ControlLoop` over a recorded run at the
governor's tick interval, every query an instant query at the tick's time, as `governor
run` sends them: ~360 ticks of 8 queries a run, ~3.5 ms of Prometheus CPU each, and the
recorded runs' replays were a fifth of `make test`. A range query is the same
evaluation at each step (PromQL evaluates `query_range` as an instant query at every
`start + k step`; subqueries align to absolute multiples of their own step either way),
so `RangeAnswers` asks each distinct query once over the replay's grid, at its first
instant, and answers every later instant on that grid from it: the body an instant query
would have had (the series with a point at that step, `value` [time, text] as
Prometheus writes it). The source (`PrometheusSource`) still decodes and reads real
Prometheus answers; only their transport is batched.

Anything it cannot answer from a range is sent as the instant query it is (`fallbacks`
counts them): an instant off the grid or past its end, a range answer that is not a
matrix or carries warnings. tests/engine/test_rangeanswers.py holds a replay through it equal
to one sent tick by tick, decision for decision.

Times in unix seconds (ms on the grid, as Prometheus parses them).
"""

from __future__ import annotations

from typing import Any

import orjson
import requests

from estimators.prometheus import BodyQueryClient


class RangeAnswers:
    """A `BodyQueryClient` answering instant queries on the grid `start_s + k step_s`
    (k >= 0, up to `stop_s`) from one range query per query text; `inner` sends the
    rest. `url`: the Prometheus both ask."""

    def __init__(
        self,
        inner: BodyQueryClient,
        url: str,
        start_s: float,
        stop_s: float,
        step_s: float,
        timeout_s: float = 30.0,
    ) -> None:
        if not step_s > 0 or not stop_s >= start_s:
            raise ValueError(f"bad grid: {start_s}..{stop_s} every {step_s} s")
        self._inner = inner
        self._url = url
        self._start_ms = round(start_s * 1000)
        self._stop_ms = round(stop_s * 1000)
        self._step_ms = round(step_s * 1000)
        self._timeout_s = timeout_s
        self._answers: dict[str, dict[int, list[dict[str, Any]]] | None] = {}
        self.fallbacks = 0
        """Instant queries sent as such (not answered from a range)."""
        self.ranges = 0
        """Range queries sent."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        """The inner client's `custom_query` (the source sends none on this path)."""
        return self._inner.custom_query(query, params=params)

    def query_body(
        self, query: str, params: dict[str, Any] | None = None, timeout: float | None = None
    ) -> bytes:
        """The body of instant query `query` at `params["time"]`: from its range answer
        where the instant is on the grid, else the inner client's."""
        text = (params or {}).get("time")
        at_ms = round(float(text) * 1000) if text is not None else None
        on_grid = (
            at_ms is not None
            and self._start_ms <= at_ms <= self._stop_ms
            and (at_ms - self._start_ms) % self._step_ms == 0
        )
        steps = self._steps(query) if on_grid else None
        if steps is None or at_ms is None:
            self.fallbacks += 1
            return self._inner.query_body(query, params=params, timeout=timeout)
        vector = steps.get(at_ms, [])
        body = {"status": "success", "data": {"resultType": "vector", "result": vector}}
        return orjson.dumps(body)

    def _steps(self, query: str) -> dict[int, list[dict[str, Any]]] | None:
        """`query`'s instant answers by grid instant (ms -> the vector's samples), from
        one range query over the grid; None where the range answer cannot stand for them."""
        if query not in self._answers:
            self._answers[query] = self._fetch(query)
        return self._answers[query]

    def _fetch(self, query: str) -> dict[int, list[dict[str, Any]]] | None:
        self.ranges += 1
        fields = {
            "query": query,
            "start": f"{self._start_ms / 1000:.3f}",
            "end": f"{self._stop_ms / 1000:.3f}",
            "step": f"{self._step_ms / 1000:g}",
            "timeout": f"{self._timeout_s:g}",
        }
        response = requests.post(
            f"{self._url}/api/v1/query_range", data=fields, timeout=self._timeout_s
        )
        answer = orjson.loads(response.content) if response.status_code == 200 else {}
        data = answer.get("data") or {}
        if answer.get("status") != "success" or answer.get("warnings") or answer.get("infos"):
            return None
        if data.get("resultType") != "matrix":
            return None
        steps: dict[int, list[dict[str, Any]]] = {}
        for series in data.get("result", []):
            for t, value in series["values"]:
                at_ms = round(float(t) * 1000)
                steps.setdefault(at_ms, []).append(
                    {"metric": series["metric"], "value": [t, value]}
                )
        return steps
