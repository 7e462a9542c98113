"""The engines' scrape interval as Prometheus reports it (estimators.scrape), and the
start-up check that raises the short (panic) window to two of them. Real Prometheus
(1 s scrapes, see conftest); a closed port for the unreachable case."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from controller.config import GovernorConfig, PrometheusSettings
from estimators.scrape import ENGINE_JOBS_QUERY, engine_scrape_interval_s, parse_duration_s
from service.run import checked_scrape_interval_s, short_window_for
from tests.conftest import make_model, make_policy
from tests.integration.conftest import VllmWorld
from tests.integration.promserver import free_port


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_real_prometheus_reports_the_engine_targets_interval(
    vllm_world: VllmWorld, method: str
) -> None:
    assert engine_scrape_interval_s(vllm_world.url, method=method) == 1.0


def test_the_check_asks_as_the_settings_say() -> None:
    """`checked_scrape_interval_s` asks Prometheus with the loop's query method and TLS
    setting (it asked with GET and verified certificates whatever the settings said, so
    a Prometheus with a self-signed certificate and `disable_ssl` never answered)."""
    import service.run as run

    sent: list[tuple[str, str, Any, bool]] = []
    jobs = _answers([{"labels": {"job": "vllm"}, "scrapeInterval": "30s"}])

    def request(method: str, url: str, **kw: Any) -> _Answer:
        sent.append((method, url.rsplit("/", 1)[1], kw.get("data"), kw["verify"]))
        return jobs(method, url, **kw)

    settings = PrometheusSettings(
        url="https://p:9090", disable_ssl=True, query_method="POST", scrape_interval_s=15.0
    )
    config = _config().model_copy(update={"prometheus": settings})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            "estimators.scrape.deadline_session", lambda _v: SimpleNamespace(request=request)
        )
        assert run.checked_scrape_interval_s(config) == 30.0
    assert sent == [
        ("POST", "query", {"query": ENGINE_JOBS_QUERY}, False),
        ("GET", "targets", None, False),
    ]


def test_unreachable_prometheus_is_no_answer() -> None:
    assert engine_scrape_interval_s(f"http://127.0.0.1:{free_port()}", timeout_s=1.0) is None


class _Answer:
    def __init__(self, body: Any) -> None:
        self.body = body

    def json(self) -> Any:
        return self.body


def _answers(targets: Any) -> Any:
    """A `request` answering the jobs query with job "vllm" and the targets API with
    `targets` as `activeTargets` (crafted answers: a fake `request`, no Prometheus)."""
    jobs = {"data": {"result": [{"metric": {"job": "vllm"}, "value": [1, "2"]}]}}

    def request(_method: str, url: str, **_kw: Any) -> _Answer:
        return _Answer(jobs if url.endswith("/query") else {"data": {"activeTargets": targets}})

    return request


@pytest.mark.parametrize(
    ("targets", "seconds"),
    [
        (None, None),  # AttributeError/TypeError at start-up before
        ("x", None),
        ([{"labels": None, "scrapeInterval": "15s"}], None),
        ([None, {"labels": {"job": "vllm"}, "scrapeInterval": "15s"}], 15.0),
        ([{"labels": None}, {"labels": {"job": "vllm"}, "scrapeInterval": "30s"}], 30.0),
        ([{"labels": {"job": ["vllm"]}, "scrapeInterval": "5s"}], None),
        ([{"labels": {"job": "vllm"}, "scrapeInterval": None}], None),
    ],
)
def test_odd_targets_answers_are_no_answer_never_a_raise(
    targets: Any, seconds: float | None
) -> None:
    """The docstring's promise: every failure is None (a target without labels is
    skipped, the others still read)."""
    assert engine_scrape_interval_s("http://p", request=_answers(targets)) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("", None),
        ("15", None),
        ("x1s", None),
        ("1" + "0" * 400 + "s", None),  # read as infinity: a traceback at start
        ("1y2w3d4h5m6s7ms", 33019506.007),
        ("0s", None),
        # Outside Prometheus's grammar (whole numbers, units largest first, once each),
        # which the parser had summed:
        ("30s1m", None),
        ("1.5m", None),
        ("1s1s", None),
        ("500ms1s", None),
        ("\u0661\u0665s", None),  # Arabic-Indic digits, which \\d had read as 15
    ],
)
def test_durations(text: str, seconds: float | None) -> None:
    assert parse_duration_s(text) == seconds


def _config() -> GovernorConfig:
    return GovernorConfig(
        models=(make_model(),),
        policy=make_policy(window_s=120.0, panic_window_s=10.0),
        prometheus=PrometheusSettings(scrape_interval_s=15.0),
    )


def _short_window_s(reported: float | None) -> float:
    config = _config()
    return short_window_for(config, checked_scrape_interval_s(config, lambda _settings: reported))


def test_a_longer_reported_interval_raises_the_short_window() -> None:
    assert _short_window_s(45.0) == 90.0
    assert _short_window_s(90.0) == 120.0  # <= window_s


@pytest.mark.parametrize("reported", [None, 5.0, 15.0])
def test_the_configured_window_stands_otherwise(reported: float | None) -> None:
    assert _short_window_s(reported) == 30.0


@pytest.mark.parametrize(("reported", "lookback_s"), [(None, 15.0), (5.0, 15.0), (45.0, 45.0)])
def test_the_gauges_lookback_follows_the_slower_reported_scrape(
    reported: float | None, lookback_s: float
) -> None:
    """A lookback of two configured scrapes (30 s) would read one missed scrape of an
    engine scraped every 45 s as a dead target."""
    from service.run import prometheus_source

    source = prometheus_source(_config(), lambda _settings: reported)
    assert source.scrape_interval_s == lookback_s


@pytest.mark.parametrize(
    ("reported", "event", "used"),
    [
        (None, "scrape_interval_unchecked", 15.0),  # it said nothing at all
        (3600.0, "scrape_interval_unusable", 15.0),  # a pod dead 2 h read as up
        (300.0, "scrape_interval_mismatch", 300.0),  # the slowest a config may say
    ],
)
def test_a_reported_interval_is_used_only_within_the_configs_bound(
    reported: float | None, event: str, used: float
) -> None:
    """What Prometheus reports had been adopted whatever it was, and its absence was
    silent: a reported 1 h stretched the gauges' lookback to 2 h, where the config itself
    refuses past MAX_SCRAPE_INTERVAL_S; now it is logged and the configured one is used."""
    from structlog.testing import capture_logs

    from controller.config import MAX_SCRAPE_INTERVAL_S

    assert MAX_SCRAPE_INTERVAL_S == 300
    with capture_logs() as logs:
        assert checked_scrape_interval_s(_config(), lambda _settings: reported) == used
    assert [entry["event"] for entry in logs] == [event]
