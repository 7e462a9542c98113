"""How `PrometheusSource` maps failures and bad data to typed outcomes.

Transport failures use the real default client against tiny local HTTP servers (a
closed port, a server slower than the timeout, garbage answers); data problems use an
injected fake client with canned answers. Contract: the source unreadable ->
`SourceError` (with the query); a model without a finite demand -> `NoDataError`;
optional signals NaN/Inf/missing -> None, never 0.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
import pytest
import requests

from estimators.prometheus import PrometheusSource
from estimators.promql import SIGNAL_LABEL, Signal
from estimators.types import ModelQuery, NoDataError, Observation, SourceError
from tests.integration.promserver import free_port

NOW = 1_800_000_000.0
A, B = "model-a", "model-b"
MODELS = [ModelQuery(A, ttft_sla_s=0.1, itl_sla_s=0.05), ModelQuery(B)]


# --- fake client -------------------------------------------------------------------------


def tagged(model: str, signal: Signal | str, value: str | float) -> dict[str, Any]:
    """One sample of a multi-signal answer."""
    return {
        "metric": {"model_name": model, SIGNAL_LABEL: str(signal)},
        "value": [NOW, str(value)],
    }


def buckets(
    model: str, pairs: list[tuple[str, str | float]], hist: str = "itl"
) -> list[dict[str, Any]]:
    """An SLA-edge bucket answer: (le, rate) pairs of histogram `hist` for one model."""
    return [
        {"metric": {"model_name": model, "le": le, SIGNAL_LABEL: hist}, "value": [NOW, str(v)]}
        for le, v in pairs
    ]


ITL_OK = [("0.05", 9.0), ("+Inf", 10.0)]  # the SLA edge (50 ms) and the count


def healthy_answers() -> dict[str, Any]:
    """Both models fully present."""
    state: list[dict[str, Any]] = []
    for m in (A, B):
        state += [
            tagged(m, Signal.RUNNING, 8),
            tagged(m, Signal.WAITING, 1),
            tagged(m, Signal.KV_USAGE_FRAC, 0.5),
            tagged(m, Signal.READY_REPLICAS, 2),
            tagged(m, Signal.GAUGE_SAMPLE_TS, NOW - 1.5),
            tagged(m, Signal.COUNTER_SAMPLE_TS, NOW - 2.5),
            tagged(m, Signal.TARGETS_UP, 2),
            tagged(m, Signal.TARGETS_KNOWN, 3),
            tagged(m, Signal.TARGETS_SEEN, 4),  # one left discovery: neither up nor down
        ]
    return {
        "demand": [tagged(m, Signal.ARRIVAL_RPS, 12.5) for m in (A, B)]
        + [tagged(m, Signal.COMPLETIONS_RPS, 12.0) for m in (A, B)],
        "state": state,
        "rates": [tagged(m, Signal.PREFIX_CACHE_HIT_FRAC, 0.25) for m in (A, B)],
        "itl_quantiles": [tagged(m, "itl_p95", 0.065625) for m in (A, B)],
        "sla_buckets": buckets(A, ITL_OK) + buckets(B, ITL_OK),
    }


class FakeClient:
    """Answers each query of the source by name (see `TickQueries`) from `answers`.

    A value that is an exception is raised; a missing name answers an empty vector.
    """

    def __init__(self, answers: Mapping[str, Any]) -> None:
        self.answers = dict(answers)
        self.src: PrometheusSource | None = None
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def bind(self, src: PrometheusSource) -> PrometheusSource:
        self.src = src
        return src

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        assert self.src is not None
        # Read at call time: the SLA-edge query follows the models' SLAs.
        name = {text: name for name, text in self.src.queries.items()}[query]
        self.calls.append((name, dict(params or {})))
        answer = self.answers.get(name, [])
        if isinstance(answer, Exception):
            raise answer
        return answer


def fake_source(answers: Mapping[str, Any], **kwargs: Any) -> tuple[PrometheusSource, FakeClient]:
    client = FakeClient(answers)
    return client.bind(PrometheusSource("http://fake:9090", client=client, **kwargs)), client


def test_healthy_answer_maps_every_field() -> None:
    src, client = fake_source(healthy_answers(), window_s=30)
    obs = src.observe(MODELS, NOW)[A]
    assert isinstance(obs, Observation)
    assert obs.arrival_rate_rps == 12.5
    assert obs.extra == {"completions_rps": 12.0}
    assert (obs.running, obs.waiting, obs.kv_usage_frac, obs.ready_replicas) == (8, 1, 0.5, 2)
    assert obs.staleness_s == pytest.approx(1.5)  # newest of the gauge and counter samples
    assert obs.itl_p95_ms == pytest.approx(65.625)  # PromQL's quantile, seconds -> ms
    assert obs.itl_dist is not None and obs.itl_dist.p50_ms is None  # only p95 answered
    assert obs.itl_attainment_frac == pytest.approx(0.9)
    assert obs.ttft_attainment_frac is None  # no TTFT buckets answered
    assert obs.ttft_p95_ms is None and obs.ttft_dist is None and obs.prompt_tokens_mean is None
    assert obs.preemption_rate_per_s is None
    assert (obs.targets_up, obs.targets_down) == (2, 1)
    assert {params["time"] for _, params in client.calls} == {f"{NOW:.3f}"}
    assert src.queries_last_tick == len(client.calls) == 8


def test_model_missing_from_demand_is_no_data_while_the_other_is_observed() -> None:
    answers = healthy_answers()
    answers["demand"] = [tagged(A, Signal.ARRIVAL_RPS, 3.0)]
    results = fake_source(answers)[0].observe(MODELS, NOW)
    assert isinstance(results[A], Observation)
    err = results[B]
    assert isinstance(err, NoDataError)
    assert (err.model, err.signal) == (B, "arrival_rate")


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_non_finite_demand_is_no_data_never_zero(bad: str) -> None:
    answers = healthy_answers()
    answers["demand"] = [tagged(A, Signal.ARRIVAL_RPS, bad), tagged(B, Signal.ARRIVAL_RPS, 4)]
    results = fake_source(answers)[0].observe(MODELS, NOW)
    err = results[A]
    assert isinstance(err, NoDataError) and err.signal == "arrival_rate"
    assert isinstance(results[B], Observation)


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_non_finite_optional_signals_are_none_never_zero(bad: str) -> None:
    answers = healthy_answers()
    answers["state"] = [
        tagged(A, s, bad)
        for s in (
            Signal.RUNNING,
            Signal.WAITING,
            Signal.KV_USAGE_FRAC,
            Signal.READY_REPLICAS,
            Signal.GAUGE_SAMPLE_TS,
            Signal.TARGETS_UP,
            Signal.TARGETS_KNOWN,
            Signal.TARGETS_SEEN,
        )
    ] + [tagged(A, Signal.COUNTER_SAMPLE_TS, NOW - 2.0)]
    answers["demand"] += [
        tagged(A, Signal.ARRIVAL_SHORT_RPS, bad),
        tagged(A, Signal.ARRIVAL_SEED_RPS, bad),
    ]
    answers["rates"] = [
        tagged(A, s, bad)
        for s in (
            Signal.PREFIX_CACHE_HIT_FRAC,
            Signal.PREEMPTION_RATE_PER_S,
            Signal.PROMPT_TOKENS_MEAN,
            Signal.DECODE_TIME_MEAN_S,
            Signal.STEP_TOKENS_MEAN,
        )
    ]
    answers["itl_quantiles"] = [tagged(A, "itl_p95", bad)]
    answers["ttft_quantiles"] = [tagged(A, "ttft_p50", bad)]
    answers["other_quantiles"] = [tagged(A, "decode_p95", bad)]
    answers["sla_buckets"] = buckets(A, [("0.05", bad), ("0.1", 10.0), ("+Inf", 10.0)])
    obs = fake_source(answers, window_s=30)[0].observe(MODELS, NOW)[A]
    assert isinstance(obs, Observation)
    for name in (
        "running",
        "waiting",
        "kv_usage_frac",
        "ready_replicas",
        "prefix_cache_hit_frac",
        "preemption_rate_per_s",
        "prompt_tokens_mean",
        "decode_time_mean_ms",
        "step_tokens_mean",
        "itl_p95_ms",
        "itl_dist",
        "ttft_dist",
        "decode_time_p95_ms",
        "itl_attainment_frac",
        "arrival_rate_short_rps",
        "arrival_rate_5m_rps",
        "targets_up",
        "targets_down",
    ):
        assert getattr(obs, name) is None, name
    assert obs.staleness_s == 2.0  # the counter's sample time is still good


def test_no_current_sample_is_no_data() -> None:
    """Every engine series stale-marked (targets down): the window's rates still decay,
    but without a sample time there is no current data."""
    answers = healthy_answers()
    answers["state"] = [s for s in answers["state"] if s["metric"]["model_name"] == B]
    results = fake_source(answers)[0].observe(MODELS, NOW)
    err = results[A]
    assert isinstance(err, NoDataError) and err.signal == "staleness", err
    assert isinstance(results[B], Observation)


def test_samples_older_than_the_limit_are_no_data() -> None:
    answers = healthy_answers()
    src = fake_source(answers, max_staleness_s=1.0)[0]
    err = src.observe(MODELS, NOW)[A]  # newest sample 1.5 s old
    assert isinstance(err, NoDataError) and err.signal == "staleness"
    assert "1.5 s old (limit 1 s)" in str(err)
    assert isinstance(
        fake_source(answers, max_staleness_s=2.0)[0].observe(MODELS, NOW)[A], Observation
    )


@pytest.mark.parametrize("up", ["0", "NaN", None])
def test_every_target_down_or_gone_is_no_data(up: str | None) -> None:
    """Down (up 0), unreadable, or gone from discovery (no `up` series left: only the
    lookback still sees the targets): no data, never a decaying demand."""
    answers = healthy_answers()
    gone = {"targets_up", "targets_known"} if up is None else {"targets_up"}
    answers["state"] = [
        s
        for s in answers["state"]
        if not (s["metric"]["model_name"] == A and s["metric"][SIGNAL_LABEL] in gone)
    ] + ([] if up is None else [tagged(A, Signal.TARGETS_UP, up)])
    results = fake_source(answers)[0].observe(MODELS, NOW)
    err = results[A]
    assert isinstance(err, NoDataError) and err.signal == "targets_up", err
    assert "0 of 4 up" in str(err)
    assert isinstance(results[B], Observation)


def test_targets_gone_are_the_cause_after_the_rate_window_empties() -> None:
    """Every target gone and the rate window empty (no demand row left): the cause read
    stays `targets_up` for the whole lookback, not `arrival_rate`."""
    answers = healthy_answers()
    answers["demand"] = [s for s in answers["demand"] if s["metric"]["model_name"] != A]
    answers["state"] = [
        s
        for s in answers["state"]
        if not (
            s["metric"]["model_name"] == A
            and s["metric"][SIGNAL_LABEL] in {"targets_up", "targets_known"}
        )
    ]
    err = fake_source(answers)[0].observe(MODELS, NOW)[A]
    assert isinstance(err, NoDataError) and err.signal == "targets_up", err


def test_idle_histogram_gives_none_not_zero() -> None:
    answers = healthy_answers()
    answers["itl_quantiles"] = [tagged(A, "itl_p95", "NaN")]  # PromQL: no requests in window
    answers["sla_buckets"] = buckets(A, [("0.05", 0.0), ("0.1", 0.0), ("+Inf", 0.0)])
    obs = fake_source(answers)[0].observe(MODELS, NOW)[A]
    assert isinstance(obs, Observation)
    assert obs.itl_p95_ms is None and obs.itl_attainment_frac is None


def test_bucket_noise_is_made_monotonic_like_promql() -> None:
    answers = healthy_answers()
    # Rates of cumulative buckets can dip by noise (float error; `rate()`'s extrapolation
    # of young series); PromQL takes the running maximum, so the count reads 10.05 and
    # the attainment 10.05 / 10.05 = 1 (without it: 10.05 / 10 = 1.005, or a clamp
    # hiding the noise). A dip past BUCKET_NOISE is no histogram: read as noise, 10.5
    # over 10 was a share of 1 whatever the requests did.
    answers["sla_buckets"] = buckets(A, [("0.05", 10.05), ("+Inf", 10.0)])
    obs = fake_source(answers)[0].observe(MODELS, NOW)[A]
    assert isinstance(obs, Observation)
    assert obs.itl_attainment_frac == 1.0
    answers["sla_buckets"] = buckets(A, [("0.05", 10.5), ("+Inf", 10.0)])
    obs = fake_source(answers)[0].observe(MODELS, NOW)[A]
    assert isinstance(obs, Observation)
    assert obs.itl_attainment_frac is None


def test_sla_edge_query_follows_the_models_slas() -> None:
    answers = healthy_answers()
    answers["sla_buckets"] += buckets(A, [("0.1", 9.5), ("+Inf", 10.0)], hist="tpot")
    src, _ = fake_source(answers)
    obs = src.observe(MODELS, NOW)[A]
    assert isinstance(obs, Observation) and obs.tpot_attainment_frac is None  # no 50 ms edge
    assert "0\\.05" in src.queries.sla_buckets and "0\\.2" not in src.queries.sla_buckets
    text = src.queries.sla_buckets
    src.observe([ModelQuery(A, itl_sla_s=0.1), ModelQuery(B, itl_sla_s=0.2)], NOW)
    assert src.queries.sla_buckets != text and "0\\.2" in src.queries.sla_buckets
    assert src.queries_last_tick == 8  # still eight queries
    obs = src.observe([ModelQuery(A, itl_sla_s=0.1)], NOW)[A]
    assert isinstance(obs, Observation)
    assert obs.tpot_attainment_frac == pytest.approx(0.95)  # 9.5 of 10 at 100 ms
    assert obs.itl_attainment_frac is None  # no ITL bucket at 100 ms answered


def test_models_not_asked_for_are_ignored_and_empty_asks_nothing() -> None:
    answers = healthy_answers()
    answers["demand"].append(tagged("other", Signal.ARRIVAL_RPS, 1.0))
    src, client = fake_source(answers)
    assert set(src.observe([ModelQuery(A)], NOW)) == {A}
    client.calls.clear()
    assert src.observe([], NOW) == {}
    assert client.calls == [] and src.queries_last_tick == 0


@pytest.mark.parametrize(
    "answer",
    [
        {"resultType": "vector"},  # not a list
        [NOW, "1"],  # a scalar's result
        [{"metric": {"job": "j"}, "value": [NOW, "abc"]}],  # not a number, no model named
        [{"metric": {"model_name": None}, "value": "90"}],  # no pair, no model named
        [{"value": [NOW, "1"]}],  # no labels
        [{"metric": "x", "value": [NOW, "1"]}],
        None,
    ],
)
def test_malformed_results_are_source_errors(answer: Any) -> None:
    """An answer that is not a vector, or a malformed sample that names no model: the
    answer as a whole is unreadable."""
    answers = healthy_answers()
    answers["state"] = answer
    src, _ = fake_source(answers)
    with pytest.raises(SourceError) as info:
        src.observe(MODELS, NOW)
    assert info.value.query == src.queries.state


def _sample(signal: Signal, value: Any, key: str = "value") -> dict[str, Any]:
    return {"metric": {"model_name": A, SIGNAL_LABEL: signal.value}, key: value}


@pytest.mark.parametrize(
    ("group", "sample", "wrong"),
    [
        ("demand", _sample(Signal.ARRIVAL_RPS, "90"), "'90' is not a [timestamp, number] pair"),
        ("demand", _sample(Signal.ARRIVAL_RPS, 90), "90 is not a [timestamp, number] pair"),
        ("demand", _sample(Signal.ARRIVAL_RPS, [NOW, True]), "True is not a number"),
        ("demand", _sample(Signal.ARRIVAL_RPS, [NOW, "abc"]), "'abc' is not a number"),
        ("state", _sample(Signal.WAITING, [NOW, None]), "None is not a number"),
        ("state", _sample(Signal.WAITING, [NOW, "1", "2"]), "is not a [timestamp, number] pair"),
        ("state", _sample(Signal.RUNNING, [[NOW, "1"]], key="values"), "no value"),  # a matrix
        ("sla_buckets", {**buckets(A, [("0.05", "x")])[0]}, "'x' is not a number"),
    ],
    ids=["bare-string", "bare-number", "boolean", "text", "null", "three", "matrix", "bucket"],
)
def test_a_malformed_sample_is_no_data_for_its_model_only(
    group: str, sample: dict[str, Any], wrong: str
) -> None:
    """A sample naming a model but malformed fails that model, never reads as a number
    (a bare "90" was unpacked as "9", "0" and read 0 req/s: an 8-replica fleet scaled
    to 1; `[ts, true]` read 1.0), and never fails the tick of the other models (it was a
    SourceError for all). Crafted answers through the fake client: a real Prometheus
    never writes these; the parser is what is checked."""
    answers = healthy_answers()
    answers[group] = [*answers[group], sample]
    results = fake_source(answers)[0].observe(MODELS, NOW)
    err = results[A]
    assert isinstance(err, NoDataError), err
    signal = sample["metric"][SIGNAL_LABEL]
    assert err.signal == signal and "malformed sample" in err.detail and wrong in err.detail
    assert isinstance(results[B], Observation) and results[B].arrival_rate_rps == 12.5


@pytest.mark.parametrize(
    "signal",
    [
        Signal.ARRIVAL_RPS,
        Signal.INGRESS_RPS,
        Signal.TARGETS_UP,
        Signal.TARGETS_KNOWN,
        Signal.TARGETS_SEEN,
        Signal.GAUGE_SAMPLE_TS,
        Signal.COUNTER_SAMPLE_TS,
    ],
)
def test_a_duplicated_decisive_signal_is_no_data_never_the_last_series(signal: Signal) -> None:
    """Two series of one signal the outcome is decided on (two answers where the query
    aggregates to one): neither is read (the last one won: arrival 40 and 0 read 0 req/s)
    and the model is no data naming the signal; the other model is observed. Fake
    client, crafted answers (the parser is what is checked)."""
    answers = healthy_answers()
    group = "demand" if signal in (Signal.ARRIVAL_RPS, Signal.INGRESS_RPS) else "state"
    own = {"model_name": A, SIGNAL_LABEL: signal.value}
    answers[group] = [s for s in answers[group] if s["metric"] != own]
    answers[group] += [tagged(A, signal, 40.0), tagged(A, signal, 0)]
    results = fake_source(answers)[0].observe(MODELS, NOW)
    err = results[A]
    assert isinstance(err, NoDataError) and err.signal == signal.value, err
    assert "duplicated series" in str(err)
    assert isinstance(results[B], Observation) and results[B].arrival_rate_rps == 12.5


def test_a_duplicated_optional_signal_reads_as_absent() -> None:
    """A second series of an optional signal: that signal is None (not the last one's
    value: a backlog of 300 read as 0), the rest of the model is observed."""
    answers = healthy_answers()
    answers["state"] += [tagged(A, Signal.WAITING, 300), tagged(A, Signal.WAITING, 0)]
    answers["itl_quantiles"] += [tagged(A, "itl_p95", 0.5)]
    results = fake_source(answers)[0].observe(MODELS, NOW)
    obs, other = results[A], results[B]
    assert isinstance(obs, Observation) and isinstance(other, Observation)
    assert obs.waiting is None and obs.itl_p95_ms is None and obs.itl_dist is None
    assert (obs.arrival_rate_rps, obs.running) == (12.5, 8)
    assert (other.waiting, other.itl_p95_ms) == (1, pytest.approx(65.625))


def test_a_repeated_bucket_voids_the_histogram_and_spellings_are_summed() -> None:
    """A repeated (model, histogram, `le`) bucket: no attainment (summed, 90 % read
    100 %); one bound spelled two ways ("0.05", "5e-2": the name policies' spellings)
    is still summed. Fake client, crafted answers (the parser is what is checked)."""
    answers = healthy_answers()
    answers["sla_buckets"] += buckets(A, [("0.05", 9.0)])
    results = fake_source(answers)[0].observe(MODELS, NOW)
    obs = results[A]
    assert isinstance(obs, Observation) and obs.itl_attainment_frac is None
    answers["sla_buckets"] = buckets(A, [("0.05", 4.0), ("5e-2", 5.0), ("+Inf", 10.0)])
    answers["sla_buckets"] += buckets(B, ITL_OK)
    results = fake_source(answers)[0].observe(MODELS, NOW)
    obs = results[A]
    assert isinstance(obs, Observation) and obs.itl_attainment_frac == pytest.approx(0.9)


def test_a_negative_bucket_rate_is_no_attainment_never_zero() -> None:
    """A negative SLA-bucket rate (no rate of a counter is: broken data) is no data, not
    the running maximum's 0 (attainment 0 %). Fake client, crafted answer."""
    answers = healthy_answers()
    answers["sla_buckets"] = buckets(A, [("0.05", -3.0), ("+Inf", 10.0)]) + buckets(B, ITL_OK)
    results = fake_source(answers)[0].observe(MODELS, NOW)
    obs = results[A]
    assert isinstance(obs, Observation) and obs.itl_attainment_frac is None
    assert isinstance(results[B], Observation)


def test_client_exceptions_are_source_errors_with_the_query() -> None:
    answers = healthy_answers()
    answers["rates"] = RuntimeError("boom")
    src, client = fake_source(answers)
    with pytest.raises(SourceError, match="boom") as info:
        src.observe(MODELS, NOW)
    assert info.value.query == src.queries.rates
    assert src.queries_last_tick == len(client.calls) == 3  # demand, state, rates


def test_non_finite_now_is_refused() -> None:
    with pytest.raises(ValueError, match="now_s"):
        fake_source(healthy_answers())[0].observe(MODELS, float("nan"))


# --- real client, tiny servers -----------------------------------------------------------

Behaviour = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture
def tiny_server() -> Iterator[Callable[[Behaviour], tuple[str, list[str]]]]:
    """Start a loopback HTTP server whose GET and POST handler is `behaviour`; returns
    (url, requests), each request as "METHOD path" with a POST's form body after a `?`
    (the parameters read alike whichever way they came)."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(behaviour: Behaviour) -> tuple[str, list[str]]:
        paths: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                paths.append(f"GET {self.path}")
                with contextlib.suppress(OSError):  # the client gave up (timeout test)
                    behaviour(self)

            def do_POST(self) -> None:
                form = self.headers.get("Content-Type") == "application/x-www-form-urlencoded"
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                paths.append(f"POST {self.path}?{body}" if form else f"POST {self.path}")
                with contextlib.suppress(OSError):
                    behaviour(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", paths

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def reply(status: int, body: bytes, ctype: str = "application/json") -> Behaviour:
    def behaviour(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return behaviour


EMPTY_VECTOR = json.dumps(
    {"status": "success", "data": {"resultType": "vector", "result": []}}
).encode()


def test_connection_refused_is_a_source_error_without_backoff() -> None:
    src = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(SourceError, match="ConnectionError") as info:
        src.observe(MODELS, NOW)
    assert info.value.query == src.queries.demand
    # PrometheusConnect's default Retry would sleep 0 + 2 + 4 s here; ours does not retry.
    assert time.monotonic() - started < 3.0


def test_slow_server_past_the_timeout_is_a_source_error(tiny_server: Any) -> None:
    def slow(h: http.server.BaseHTTPRequestHandler) -> None:
        time.sleep(1.0)
        reply(200, EMPTY_VECTOR)(h)

    url, paths = tiny_server(slow)
    src = PrometheusSource(url, timeout_s=0.25)
    with pytest.raises(SourceError) as info:
        src.observe(MODELS, NOW)
    assert isinstance(info.value.__cause__, requests.Timeout)
    assert len(paths) == 1  # not retried
    assert "timeout=0.25" in paths[0]  # and Prometheus is told the evaluation deadline


def test_healthy_empty_server_gives_no_data(tiny_server: Any) -> None:
    url, paths = tiny_server(reply(200, EMPTY_VECTOR))
    src = PrometheusSource(url, timeout_s=1.0)
    results = src.observe(MODELS, NOW)
    assert all(isinstance(r, NoDataError) for r in results.values())
    assert len(paths) == src.queries_last_tick == 8
    assert all(f"time={NOW:.3f}" in p for p in paths)


def test_default_client_hands_bodies_to_the_decoder(
    tiny_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source reads each answer's HTTP body and decodes it itself (estimators.decode);
    `custom_query` (the drain's query) still decodes with orjson."""
    import estimators.decode as dec
    import estimators.prometheus as prom

    bodies: list[bytes] = []
    decoded: list[bytes] = []
    samples = dec.AnswerDecoder.samples

    def counting_samples(self: dec.AnswerDecoder, body: bytes) -> Any:
        bodies.append(body)
        return samples(self, body)

    class CountingOrjson:
        @staticmethod
        def loads(body: bytes) -> Any:
            decoded.append(body)
            return orjson.loads(body)

    monkeypatch.setattr(dec.AnswerDecoder, "samples", counting_samples)
    monkeypatch.setattr(prom, "orjson", CountingOrjson)
    url, paths = tiny_server(reply(200, EMPTY_VECTOR))
    src = PrometheusSource(url, timeout_s=1.0)
    src.observe(MODELS, NOW)
    assert len(bodies) == len(paths) == 8 and bodies[0] == EMPTY_VECTOR
    assert decoded == []  # every body took the fast path
    client = prom.http_query_client(url, 1.0, False, 0)
    assert client.custom_query("up") == [] and decoded == [EMPTY_VECTOR]
    # TLS verification follows disable_ssl, as PrometheusConnect's own session does.
    assert prom.http_query_client(url, 1.0, True, 0)._session.verify is False  # type: ignore[attr-defined]
    assert client._session.verify is True  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "behaviour",
    [
        reply(200, b"<html>not json</html>", "text/html"),
        reply(200, b'{"status": "success"}'),  # no data
        reply(200, b'{"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}'),
        reply(400, b'{"status": "error", "errorType": "bad_data", "error": "parse error"}'),
        reply(500, b"internal error", "text/plain"),
        reply(503, b"unavailable", "text/plain"),
    ],
    ids=["garbage", "no-data-key", "scalar", "http-400", "http-500", "http-503"],
)
def test_unreadable_answers_are_source_errors(tiny_server: Any, behaviour: Behaviour) -> None:
    url, paths = tiny_server(behaviour)
    src = PrometheusSource(url, timeout_s=1.0)
    with pytest.raises(SourceError) as info:
        src.observe(MODELS, NOW)
    assert info.value.query == src.queries.demand
    assert len(paths) == 1  # failed fast, not retried


def test_settings_object_supplies_url_timeout_and_label(tiny_server: Any) -> None:
    from controller.config import PrometheusSettings

    url, paths = tiny_server(reply(200, EMPTY_VECTOR))
    settings = PrometheusSettings(url=url, timeout_s=0.5, model_label="served_model")
    src = PrometheusSource(settings, window_s=20)
    assert (src.timeout_s, src.model_label) == (0.5, "served_model")
    assert "served_model" in src.queries.demand and "[20s]" in src.queries.demand
    src.observe(MODELS, NOW)
    assert all("timeout=0.5" in p for p in paths)


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_queries_go_by_the_configured_method(tiny_server: Any, method: str) -> None:
    """`prometheus.query_method`: POST (the default) sends each query, its evaluation
    time and timeout as a form body to /api/v1/query with nothing in the URL; GET sends
    them in the URL. Either way every query of the tick reaches the server."""
    from controller.config import PrometheusSettings

    url, paths = tiny_server(reply(200, EMPTY_VECTOR))
    kw = {} if method == "POST" else {"query_method": method}
    src = PrometheusSource(PrometheusSettings(url=url, **kw), window_s=20)
    src.observe(MODELS, NOW)
    assert len(paths) == src.queries_last_tick == 8
    for p in paths:
        verb, _, rest = p.partition(" ")
        route, _, params = rest.partition("?")
        assert (verb, route) == (method, "/api/v1/query"), p
        fields = urllib.parse.parse_qs(params)
        assert fields["time"] == [f"{NOW:.3f}"] and "query" in fields, p
