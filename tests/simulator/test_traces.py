"""Trace loading (Azure files, generic CSV, JSONL), rate multiplier, synthetic traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.traces import (
    AZURE_FILES,
    BUNDLED_TRACES,
    SYNTHETIC_DEFAULTS,
    Trace,
    azure_trace_path,
    load_trace,
    parse_synthetic,
    synthetic,
    traces_dir,
)

# The Azure traces are bundled (gzipped) with the package, so no test here skips.


@pytest.mark.parametrize("key", sorted(AZURE_FILES))
def test_bundled_copies_match_the_shared_files(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    bundled = BUNDLED_TRACES / (AZURE_FILES[key] + ".gz")
    shared = traces_dir() / AZURE_FILES[key]
    if shared.is_file():  # beside a checkout that has ../shared: byte-identical
        assert gzip.decompress(bundled.read_bytes()) == shared.read_bytes()
    monkeypatch.setenv("GOVERNOR_TRACES_DIR", "/nonexistent")
    assert azure_trace_path(key) == bundled
    assert len(load_trace(f"azure:{key}")) == {"conv": 19_366, "code": 8_819}[key]


@pytest.mark.parametrize(
    ("key", "rows", "span_s", "prompt_mean", "output_mean"),
    [("conv", 19_366, 3501.7, 1154.7, 211.1), ("code", 8_819, 3435.9, 2047.8, 27.9)],
)
def test_azure_files(
    key: str, rows: int, span_s: float, prompt_mean: float, output_mean: float
) -> None:
    tr = load_trace(f"azure:{key}")
    assert len(tr) == rows
    assert tr.arrival_s[0] == 0.0 and np.all(np.diff(tr.arrival_s) >= 0)
    assert tr.span_s == pytest.approx(span_s, abs=0.1)
    assert tr.prompt_tokens.mean() == pytest.approx(prompt_mean, abs=0.1)
    assert tr.output_tokens.mean() == pytest.approx(output_mean, abs=0.1)
    assert tr.prompt_tokens.dtype == np.int64 and tr.arrival_s.dtype == np.float64


def test_rate_multiplier_keeps_span_and_multiplies_count() -> None:
    tr = load_trace("azure:conv")
    x16 = tr.scaled(16, seed=1)
    assert len(x16) == 16 * len(tr)  # integer K: exact
    assert x16.span_s == pytest.approx(tr.span_s, rel=1e-3)
    assert x16.span_s <= tr.span_s
    # shape kept: per-minute counts scale by 16 (within Poisson-ish noise)
    bins = np.arange(0, tr.span_s + 60, 60)
    base = np.histogram(tr.arrival_s, bins)[0]
    scaled = np.histogram(x16.arrival_s, bins)[0]
    assert np.corrcoef(base, scaled)[0, 1] > 0.9
    # lengths resampled from the trace: same distribution
    assert x16.prompt_tokens.mean() == pytest.approx(tr.prompt_tokens.mean(), rel=0.03)
    assert set(np.unique(x16.output_tokens)) <= set(np.unique(tr.output_tokens))
    # fractional K: Bernoulli for the fractional part
    k = 2.5
    xk = tr.scaled(k, seed=2)
    expect = k * len(tr)
    sd = np.sqrt(len(tr) * 0.25)
    assert abs(len(xk) - expect) < 5 * sd
    assert xk.span_s <= tr.span_s


def test_load_trace_duration_and_multiplier() -> None:
    tr = load_trace("azure:conv", rate_multiplier=4.0, duration_s=600.0, seed=3)
    assert tr.arrival_s.max() < 600.0
    base = load_trace("azure:conv", duration_s=600.0)
    assert len(tr) == pytest.approx(4 * len(base), rel=0.02)


def test_rate_multiplier_is_deterministic_by_seed() -> None:
    tr = synthetic("poisson", seed=0, rate=5.0, duration=100.0)
    a, b, c = tr.scaled(3.3, seed=7), tr.scaled(3.3, seed=7), tr.scaled(3.3, seed=8)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.arrival_s, c.arrival_s[: len(a)]) or len(a) != len(c)
    assert tr.scaled(1.0) is tr  # identity
    thin = tr.scaled(0.5, seed=1)
    assert 0.4 * len(tr) < len(thin) < 0.6 * len(tr)
    with pytest.raises(ValueError):
        tr.scaled(0.0)


def test_generic_csv_and_jsonl(tmp_path: Path) -> None:
    csv_s = tmp_path / "t.csv"
    csv_s.write_text("timestamp,prompt_tokens,output_tokens\n10.5,100,5\n10.0,200,0\n12,50,7\n")
    tr = load_trace(csv_s)
    assert tr.arrival_s.tolist() == [0.0, 0.5, 2.0]
    assert tr.prompt_tokens.tolist() == [200, 100, 50]
    assert tr.output_tokens.tolist() == [1, 5, 7]  # 0 output clipped to 1
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    ta = load_trace(azure)
    assert ta.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)
    jl = tmp_path / "t.jsonl"
    jl.write_text(
        "\n".join(
            json.dumps({"timestamp": ts, "input_length": i, "output_length": o})
            for ts, i, o in [(1000, 10, 2), (3500, 20, 3)]
        )
    )
    tj = load_trace(jl)
    assert tj.arrival_s.tolist() == [0.0, 2.5]
    assert tj.prompt_tokens.tolist() == [10, 20]
    bad = tmp_path / "bad.csv"
    bad.write_text("when,x\n1,2\n")
    with pytest.raises(ValueError, match="no column"):
        load_trace(bad)


@pytest.mark.parametrize("name", sorted(set(SYNTHETIC_DEFAULTS) - {"long-context", "length-shift"}))
def test_synthetic_deterministic_and_conv_like(name: str) -> None:
    a = load_trace(f"synthetic:{name}", seed=5)
    b = load_trace(f"synthetic:{name}", seed=5)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert len(a) > 1000
    assert 700 < np.median(a.prompt_tokens) < 1400
    assert 90 < np.median(a.output_tokens) < 180


def test_long_context_lengths_match_the_spec() -> None:
    """Prompt mean ~12k and p95 ~40k tokens, outputs a few hundred; deterministic."""
    a = load_trace("synthetic:long-context", seed=5)
    assert np.array_equal(
        a.prompt_tokens, load_trace("synthetic:long-context", seed=5).prompt_tokens
    )
    d = a.describe()
    assert d["prompt_mean"] == pytest.approx(12_000, rel=0.1)
    assert d["prompt_p95"] == pytest.approx(40_000, rel=0.1)
    assert 150 < d["output_mean"] < 400 and d["output_p95"] < 1000
    with pytest.raises(ValueError, match="p95/mean too large"):
        load_trace("synthetic:long-context:prompt_mean=100,prompt_p95=100000")


def test_length_shift_multiplies_the_lengths_from_its_shift_on() -> None:
    """A steady rate; from `at` on the outputs 4x longer (the default) or the prompts
    3x; conversation-like lengths before; deterministic; bad factors refused."""
    a = load_trace("synthetic:length-shift", seed=5)
    assert np.array_equal(
        a.output_tokens, load_trace("synthetic:length-shift", seed=5).output_tokens
    )
    before, after = a.arrival_s < 600.0, a.arrival_s >= 600.0
    assert np.sum(after) / np.sum(before) == pytest.approx(1.0, rel=0.1)
    assert 90 < np.median(a.output_tokens[before]) < 180
    ratio = np.mean(a.output_tokens[after]) / np.mean(a.output_tokens[before])
    assert ratio == pytest.approx(4.0, rel=0.1)
    assert np.mean(a.prompt_tokens[after]) / np.mean(a.prompt_tokens[before]) == pytest.approx(
        1.0, rel=0.1
    )
    b = load_trace("synthetic:length-shift:prompt_x=3,output_x=1", seed=5)
    late = b.arrival_s >= 600.0
    assert np.mean(b.prompt_tokens[late]) / np.mean(b.prompt_tokens[~late]) == pytest.approx(
        3.0, rel=0.1
    )
    with pytest.raises(ValueError, match="output_x must be a finite number > 0"):
        load_trace("synthetic:length-shift:output_x=0")


def test_synthetic_shapes() -> None:
    step = synthetic("step", seed=1, low=10, high=40, duration=1000)
    n1 = np.sum(step.arrival_s < 500)
    n2 = np.sum(step.arrival_s >= 500)
    assert n2 / n1 == pytest.approx(4.0, rel=0.15)
    fc = synthetic("flash-crowd", seed=1, base=10, factor=10, at=0.5, spike_s=100, duration=1000)
    spike = np.sum((fc.arrival_s >= 500) & (fc.arrival_s < 600)) / 100
    calm = np.sum(fc.arrival_s < 500) / 500
    assert spike / calm == pytest.approx(10.0, rel=0.15)
    d = synthetic("diurnal", seed=1, mean=20, amplitude=0.8, period=1000, duration=1000)
    trough = np.sum(d.arrival_s < 100)
    peak = np.sum((d.arrival_s >= 450) & (d.arrival_s < 550))
    assert peak > 4 * trough
    p = synthetic("poisson", seed=2, rate=20, duration=500)
    assert len(p) == pytest.approx(10_000, rel=0.05)
    gaps = np.diff(p.arrival_s)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential
    assert parse_synthetic("synthetic:ramp:start_rate=1,end_rate=9") == (
        "ramp",
        {"start_rate": 1.0, "end_rate": 9.0},
    )
    with pytest.raises(ValueError, match="unknown parameter"):
        load_trace("synthetic:poisson:rat=3")
    with pytest.raises(ValueError, match="unknown synthetic"):
        load_trace("synthetic:nope")


def test_truncated_and_describe() -> None:
    tr = Trace.from_arrays([0.0, 1.0, 2.0, 3.0], [1, 2, 3, 4], [5, 6, 7, 8])
    assert len(tr.truncated(2.0)) == 2
    d = tr.describe()
    assert d["requests"] == 4 and d["span_s"] == 3.0 and d["prompt_mean"] == 2.5


_HEADER = "timestamp,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("", "empty file (a header row", id="empty-file"),  # was StopIteration
        pytest.param(_HEADER + "1,2\n", ":2: 2 field(s), the header has 3", id="short-row"),
        pytest.param(  # was OverflowError from numpy's int64
            _HEADER + "1,3,4\n2,1e30,5\n", ":3: token count '1e30' is not a number", id="huge"
        ),
        pytest.param(_HEADER + "1,nan,5\n", ":2: token count 'nan'", id="nan-tokens"),
        pytest.param(_HEADER + "1,3,-4\n", ":2: token count '-4'", id="negative-tokens"),
        pytest.param(_HEADER + "1,3,x\n", ":2: token count 'x'", id="text-tokens"),
        pytest.param(
            _HEADER + "abc,3,5\n", "column 'timestamp' holds neither seconds nor", id="bad-time"
        ),
        pytest.param(_HEADER + '1,"' + "9" * 200_000 + '",5\n', "not CSV", id="huge-field"),
    ],
)
def test_a_broken_csv_trace_names_the_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    """Each of these ended in a traceback (StopIteration, IndexError, OverflowError) or
    a message without the line; now a ValueError naming the file and what is wrong."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_trace(path)
    assert str(path) in str(err.value) and needle in str(err.value), str(err.value)


def test_a_csv_at_the_token_bound_loads(tmp_path: Path) -> None:
    """MAX_TOKENS itself is a count a file may give, one past it is not."""
    from simulator.traces import MAX_TOKENS

    path = tmp_path / "t.csv"
    path.write_text(_HEADER + f"1,{MAX_TOKENS},0\n")
    assert load_trace(path).prompt_tokens.tolist() == [MAX_TOKENS]
    path.write_text(_HEADER + f"1,{MAX_TOKENS + 1},0\n")
    with pytest.raises(ValueError, match="token count"):
        load_trace(path)


def test_a_jsonl_token_count_past_the_bound_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 5, "output_length": 2}]
    rows.append({"timestamp": 10, "input_length": 1e30, "output_length": 2})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match=r"t\.jsonl:2: bad record \(token count"):
        load_trace(path)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("synthetic:step:at=5", "at must be a finite number in [0, 1], got 5"),
        ("synthetic:step:at=nan", "at must be a finite number in [0, 1], got nan"),
        ("synthetic:flash-crowd:factor=-2", "factor must be a finite number >= 0, got -2"),
        ("synthetic:flash-crowd:spike_s=inf", "spike_s must be a finite number >= 0"),
        ("synthetic:poisson:rate=nan", "rate must be a finite number >= 0, got nan"),
        ("synthetic:ramp:end_rate=-1", "end_rate must be a finite number >= 0"),
        ("synthetic:diurnal:period=0", "period must be a finite number > 0, got 0"),
        ("synthetic:diurnal:amplitude=1.5", "amplitude must be a finite number in [0, 1]"),
        ("synthetic:poisson:duration=nan", "duration must be a finite number > 0"),
        ("synthetic:long-context:output_median=nan", "output_median must be a finite number > 0"),
        ("synthetic:long-context:output_p95=100", "output_p95 (100) must be >= output_median"),
        ("synthetic:length-shift:output_x=0", "output_x must be a finite number > 0, got 0"),
        ("synthetic:poisson:duration=1e12", "~2e+13 requests, past the 2,000,000"),
        ("synthetic:flash-crowd:base=1000,factor=10", "~1.2e+07 requests"),
    ],
)
def test_a_synthetic_parameter_out_of_range_is_refused(spec: str, needle: str) -> None:
    """step:at=5 and flash-crowd:factor=-2 ran a different trace than asked (no step, no
    spike), at=nan and output_median=nan ran a broken one (0.04 % attainment),
    rate=nan said only "no requests", duration=1e12 ran out of memory."""
    with pytest.raises(ValueError) as err:
        load_trace(spec)
    assert needle in str(err.value), str(err.value)


def test_a_synthetic_trace_at_its_size_bound_is_built() -> None:
    """The size bound is on the expected count (peak rate x duration), inclusive."""
    from simulator.traces import MAX_SYNTHETIC_REQUESTS

    assert _expected("poisson", rate=MAX_SYNTHETIC_REQUESTS / 1000.0, duration=1000.0) == []
    assert _expected("poisson", rate=MAX_SYNTHETIC_REQUESTS / 1000.0 + 1, duration=1000.0)


def _expected(name: str, **params: float) -> list[str]:
    from simulator.traces import _param_problems

    return _param_problems(name, {**SYNTHETIC_DEFAULTS[name], **params})
