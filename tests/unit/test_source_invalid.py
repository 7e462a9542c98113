"""PrometheusSource on answers with invalid rates, through a fake client of the HTTP API
(the answer shape of /api/v1/query: a list of {metric, value} samples): a negative
rate is no data, never 0 req/s (a real Prometheus cannot be made to answer one from
vLLM's counters; an operator's `ingress_rate_query` or a misbehaving backend can)."""

from __future__ import annotations

from typing import Any

import pytest

from estimators.prometheus import PrometheusSource
from estimators.promql import SIGNAL_LABEL
from estimators.types import ModelQuery, NoDataError, Observation

NOW = 1_700_000_000.0


def _row(signal: str, value: float) -> dict[str, Any]:
    return {"metric": {"model_name": "m", SIGNAL_LABEL: signal}, "value": [NOW, str(value)]}


class DemandClient:
    """Answers the demand query with `demand` (signal -> value), the state query with a
    fresh sample, `up` of 2 targets up and 2 running; nothing else."""

    def __init__(self, demand: dict[str, float], up: int = 2, gauge_ts: float = NOW - 1.0) -> None:
        self.demand = demand
        self.up = up
        self.gauge_ts = gauge_ts

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        if "arrival_rps" in query:
            return [_row(k, v) for k, v in self.demand.items()]
        if "gauge_sample_ts" in query:
            return [
                _row("gauge_sample_ts", self.gauge_ts),
                _row("running", 2.0),
                _row("targets_up", float(self.up)),
                _row("targets_known", 2.0),
            ]
        return []


def _observe(
    demand: dict[str, float], ingress: bool = False, up: int = 2, gauge_ts: float = NOW - 1.0
) -> Observation | NoDataError:
    src = PrometheusSource(
        "http://p",
        client=DemandClient(demand, up, gauge_ts),
        ingress_rate_query="sum by (model_name) (rate(gateway_requests_total[{window}]))"
        if ingress
        else None,
    )
    return src.observe([ModelQuery("m")], NOW)["m"]


def test_a_negative_arrival_rate_is_no_data() -> None:
    out = _observe({"arrival_rps": -5.0})
    assert isinstance(out, NoDataError), out
    assert "negative" in str(out) and "-5" in str(out)
    ok = _observe({"arrival_rps": 3.0})
    assert isinstance(ok, Observation) and ok.arrival_rate_rps == 3.0


@pytest.mark.parametrize("short", [-2.0, float("nan")])
def test_a_negative_short_window_rate_is_missing_not_zero(short: float) -> None:
    out = _observe({"arrival_rps": 3.0, "arrival_short_rps": short, "arrival_seed_rps": -1.0})
    assert isinstance(out, Observation)
    assert out.arrival_rate_short_rps is None and out.arrival_rate_5m_rps is None


def test_a_negative_ingress_rate_is_no_ingress_signal() -> None:
    """Every engine target down and an ingress of -4 req/s: no data (the targets' cause),
    not a fleet observed at 0 req/s; a valid ingress is observed as it is."""
    out = _observe({"ingress_rps": -4.0}, ingress=True, up=0)
    assert isinstance(out, NoDataError), out
    assert "down" in str(out)
    ok = _observe({"ingress_rps": 4.0}, ingress=True, up=0)
    assert isinstance(ok, Observation) and ok.arrival_rate_rps == 4.0 and ok.targets_up == 0
    more = _observe({"arrival_rps": 3.0, "ingress_rps": 4.0}, ingress=True)
    assert isinstance(more, Observation) and more.arrival_rate_rps == 4.0


def test_a_negative_target_count_is_no_data_never_some_up() -> None:
    """`targets_up` of -1 with 2 known read truthy and passed the all-down check, with
    more targets down than known: a count below 0 is no data, naming the targets."""
    out = _observe({"arrival_rps": 5.0}, up=-1)
    assert isinstance(out, NoDataError), out
    assert out.signal == "targets_up" and "below 0" in str(out)
    assert isinstance(_observe({"arrival_rps": 5.0}, up=1), Observation)


def test_a_sample_stamped_after_the_evaluation_time_is_no_data() -> None:
    """Every query is evaluated at the tick's time: a gauge stamped a million seconds
    later read the model as fresh (staleness 0) whatever its counters' age."""
    out = _observe({"arrival_rps": 5.0}, gauge_ts=NOW + 1e6)
    assert isinstance(out, NoDataError), out
    assert out.signal == "staleness" and "after the evaluation time" in str(out)
    assert isinstance(_observe({"arrival_rps": 5.0}, gauge_ts=NOW + 0.0005), Observation)
