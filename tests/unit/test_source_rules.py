"""PrometheusSource follows the recording rules' marker tick by tick, with a fake client:
the queries after the demand query read the recorded series exactly when the demand
answer carries the marker, and the query count stays the same either way."""

from __future__ import annotations

from typing import Any

from estimators.prometheus import PrometheusSource
from estimators.promql import RULES_MARKER_MODEL, RULES_SIGNAL, SIGNAL_LABEL
from estimators.types import ModelQuery, Observation

NOW = 1_700_000_000.0
RECORDED = "governor:ttft_bucket:rate60s"


def _row(signal: str, value: float, model: str = "m") -> dict[str, Any]:
    return {"metric": {"model_name": model, SIGNAL_LABEL: signal}, "value": [NOW, str(value)]}


class FakeClient:
    """Answers the demand and state queries (marker or not), nothing else."""

    def __init__(self) -> None:
        self.marker = False
        self.sent: list[str] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        self.sent.append(query)
        if "arrival_rps" in query:  # the demand query
            rows = [_row("arrival_rps", 3.0)]
            return rows + ([_row(RULES_SIGNAL, 1.0, RULES_MARKER_MODEL)] if self.marker else [])
        if "gauge_sample_ts" in query:  # the state query
            return [_row("gauge_sample_ts", NOW - 1.0), _row("running", 2.0)]
        return []


def test_recorded_series_exactly_on_ticks_with_the_marker() -> None:
    client = FakeClient()
    src = PrometheusSource("http://p", client=client)
    models = [ModelQuery("m", ttft_sla_s=0.5, itl_sla_s=0.05)]
    for marker in (False, True, True, False):
        client.marker = marker
        client.sent.clear()
        out = src.observe(models, NOW)
        assert isinstance(out["m"], Observation) and out["m"].running == 2.0
        assert src.queries_last_tick == len(client.sent) == 8
        after_demand = " ".join(client.sent[1:])
        assert src.rules_in_use is marker
        assert (RECORDED in after_demand) is marker
        assert ("rate(vllm:time_to_first_token_seconds_bucket" in after_demand) is not marker
        assert RULES_SIGNAL in client.sent[0]  # the marker is asked for on every tick


def test_rules_off_never_asks_for_the_marker() -> None:
    client = FakeClient()
    client.marker = True  # even if a Prometheus answered with it
    src = PrometheusSource("http://p", client=client, recording_rules=False)
    src.observe([ModelQuery("m")], NOW)
    assert RULES_SIGNAL not in client.sent[0] and not src.rules_in_use
    assert RECORDED not in " ".join(client.sent)


def test_recorded_series_are_read_only_while_fresh() -> None:
    """Every read of a recorded series keeps only the series whose newest sample is at
    most three scrape (rule evaluation) intervals old: a failing rule's last samples,
    answered by Prometheus for 5 minutes, are not read (tests/integration)."""
    import re

    import pytest

    from estimators.promql import QueryBuilder

    client = FakeClient()
    client.marker = True
    src = PrometheusSource("http://p", client=client, scrape_interval_s=10.0)
    src.observe([ModelQuery("m", ttft_sla_s=0.5, itl_sla_s=0.05)], NOW)
    after_demand = " ".join(client.sent[1:])
    reads = re.findall(r"le\) \((governor:\w+)([^ ]*) (\S+)", after_demand)
    assert len(reads) == 17 + 3  # each quantile, each SLA-edge histogram
    assert all(op == "and" for _n, _sel, op in reads), reads
    fresh = re.findall(r"\(timestamp\((governor:\w+)([^ ]*)\) > time\(\) - 30\)", after_demand)
    assert fresh == [(n, sel) for n, sel, _op in reads]
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="recorded_max_age_s"):
            QueryBuilder(recorded=True, recorded_max_age_s=bad)
