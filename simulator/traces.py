"""simulator.traces: request traces as compact numpy arrays, loaders and generators.

Owns the `Trace` type (arrival times in seconds from 0, prompt and output token counts),
loaders for the Azure LLM inference CSVs (`TIMESTAMP` as `YYYY-MM-DD HH:MM:SS.fffffff`,
`ContextTokens`, `GeneratedTokens`), generic CSV (timestamp in seconds or the Azure
format; column names recognised case-insensitively) and JSONL (`timestamp` in ms,
`input_length`, `output_length`), seeded synthetic generators addressable as
`synthetic:NAME[:key=value,...]`, the rate multiplier and truncation.

Rate multiplier K (`Trace.scaled`): keeps the trace's shape and span. Every arrival
stays where it is with its own lengths and brings floor(K - 1) extra arrivals plus one
more with probability frac(K - 1) (Bernoulli), each at a uniformly random time inside
the gap to the next arrival, with (prompt, output) pairs resampled from the whole trace.
So K=1 is the identity and K=16 gives ~16x the requests over the same span. K < 1 thins
(each arrival kept with probability K). Deterministic for a seed.

Azure traces: CC-BY-4.0, cite Splitwise (Patel et al., ISCA 2024); see
`shared/data/traces/README.md`.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TRACES_ENV = "GOVERNOR_TRACES_DIR"
MAX_RATE_MULTIPLIER = 100.0
"""The largest rate multiplier K (`Trace.scaled`): the scaled trace is built whole in
memory, ~70 bytes a request while scaling and more in the simulation, before a duration
cuts it (K=100 makes azure:conv's 19,366 requests 1.9 million; K=3,000 ran out of memory
with a traceback). A higher rate belongs in a synthetic trace's own parameters."""
MAX_TOKENS = 10_000_000
"""The longest prompt or output a trace file may give a request, tokens: past any
context window served today, and within int64 (a count of 1e30 had overflowed with a
traceback)."""
MAX_SYNTHETIC_REQUESTS = 2_000_000
"""The most requests a synthetic trace may expect (its peak rate x its duration): the
size of the largest scaled trace (`MAX_RATE_MULTIPLIER` x azure:conv), built whole in
memory like it."""
BUNDLED_TRACES = Path(__file__).resolve().parent / "data" / "traces"
AZURE_FILES = {
    "conv": "AzureLLMInferenceTrace_conv.csv",
    "code": "AzureLLMInferenceTrace_code.csv",
}


@dataclass(frozen=True, slots=True)
class Trace:
    """A request trace: `arrival_s` (float64, sorted, seconds from the first arrival),
    `prompt_tokens` and `output_tokens` (int64, >= 1)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("arrival_s, prompt_tokens and output_tokens differ in length")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @staticmethod
    def from_arrays(
        arrival_s: np.ndarray | list[float],
        prompt_tokens: np.ndarray | list[int],
        output_tokens: np.ndarray | list[int],
        name: str = "",
        *,
        rebase: bool = True,
    ) -> Trace:
        """Build a trace: sorted by time (stable), shifted to start at 0 when `rebase`,
        token counts clipped to >= 1."""
        t = np.asarray(arrival_s, dtype=np.float64)
        p = np.asarray(prompt_tokens, dtype=np.int64)
        o = np.asarray(output_tokens, dtype=np.int64)
        if not (len(t) == len(p) == len(o)):
            raise ValueError("arrival_s, prompt_tokens and output_tokens differ in length")
        if len(t) and not np.all(np.isfinite(t)):
            raise ValueError("arrival times must be finite")
        order = np.argsort(t, kind="stable")
        t, p, o = t[order], p[order], o[order]
        if rebase and len(t):
            t = t - t[0]
        return Trace(t, np.maximum(p, 1), np.maximum(o, 1), name)

    @property
    def span_s(self) -> float:
        """Time from the first to the last arrival, seconds."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def mean_rate_rps(self) -> float:
        """Requests per second over the span."""
        return len(self) / self.span_s if self.span_s > 0 else 0.0

    def truncated(self, duration_s: float) -> Trace:
        """Arrivals in [0, duration_s)."""
        k = int(np.searchsorted(self.arrival_s, duration_s, side="left"))
        return Trace(self.arrival_s[:k], self.prompt_tokens[:k], self.output_tokens[:k], self.name)

    def scaled(self, k: float, seed: int = 0) -> Trace:
        """K times the requests over the same span (see the module docstring)."""
        if not math.isfinite(k) or not 0 < k <= MAX_RATE_MULTIPLIER:
            raise ValueError(
                f"rate multiplier must be in (0, {MAX_RATE_MULTIPLIER:g}], got {k:g} "
                "(the scaled trace is built whole in memory)"
            )
        n = len(self)
        if n == 0 or k == 1.0:
            return self
        rng = np.random.default_rng(seed)
        if k < 1.0:
            keep = rng.random(n) < k
            return Trace(
                self.arrival_s[keep],
                self.prompt_tokens[keep],
                self.output_tokens[keep],
                f"{self.name}x{k:g}",
            )
        extra = k - 1.0
        whole = math.floor(extra)
        frac = extra - whole
        counts = np.full(n, whole, dtype=np.int64)
        if frac > 0:
            counts += (rng.random(n) < frac).astype(np.int64)
        src = np.repeat(np.arange(n), counts)
        t = self.arrival_s
        gaps = np.diff(t, append=t[-1])
        new_t = t[src] + rng.random(len(src)) * gaps[src]
        pick = rng.integers(0, n, size=len(src))
        at = np.concatenate([t, new_t])
        order = np.argsort(at, kind="stable")
        return Trace(
            at[order],
            np.concatenate([self.prompt_tokens, self.prompt_tokens[pick]])[order],
            np.concatenate([self.output_tokens, self.output_tokens[pick]])[order],
            f"{self.name}x{k:g}",
        )

    def describe(self) -> dict[str, float]:
        """Count, span, rate and length statistics (mean / p50 / p95)."""
        out: dict[str, float] = {
            "requests": float(len(self)),
            "span_s": self.span_s,
            "rate_rps": self.mean_rate_rps,
        }
        for label, arr in (("prompt", self.prompt_tokens), ("output", self.output_tokens)):
            if len(arr):
                out[f"{label}_mean"] = float(arr.mean())
                out[f"{label}_p50"] = float(np.percentile(arr, 50))
                out[f"{label}_p95"] = float(np.percentile(arr, 95))
        return out


# --- file loaders ---------------------------------------------------------------------------

_TIME_COLS = ("timestamp", "arrival_time", "arrival_s", "time", "time_s", "t")
_PROMPT_COLS = (
    "contexttokens",
    "prompt_tokens",
    "input_length",
    "input_tokens",
    "prompt_len",
    "context_tokens",
)
_OUTPUT_COLS = (
    "generatedtokens",
    "output_tokens",
    "output_length",
    "generated_tokens",
    "output_len",
    "completion_tokens",
)


def _pick(header: list[str], names: tuple[str, ...], path: Path) -> int:
    low = [h.strip().lower() for h in header]
    for name in names:
        if name in low:
            return low.index(name)
    raise ValueError(f"{path}: no column among {names} in header {header}")


def _parse_times(values: list[str]) -> np.ndarray:
    """Seconds (float) from numbers or `YYYY-MM-DD HH:MM:SS[.f...]` timestamps."""
    try:
        return np.asarray([float(v) for v in values], dtype=np.float64)
    except ValueError:
        pass
    ts = np.asarray([v.strip() for v in values], dtype="datetime64[ns]")
    secs: np.ndarray = (ts - ts.min()).astype(np.int64) / 1e9
    return secs


def _tokens(value: object) -> int:
    """A token count from a trace file's field (text or a JSON number): finite, in
    [0, MAX_TOKENS] (0 is read as 1 request token later). ValueError naming the value."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or not 0 <= v <= MAX_TOKENS:
        raise ValueError(f"token count {value!r} is not a number in [0, {MAX_TOKENS:,}]")
    return int(v)


def load_csv(path: str | Path, name: str | None = None) -> Trace:
    """Azure-format or generic CSV with a header (timestamp seconds or datetime).

    ValueError naming the file (and the line) for a file without a header, a header
    without the columns, a row shorter than the header, a token count that is not a
    number in [0, MAX_TOKENS] and times that are neither seconds nor timestamps."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    times: list[str] = []
    prompts: list[int] = []
    outputs: list[int] = []
    with opener(path, "rt", newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise ValueError(f"{path}: empty file (a header row names the columns)")
            it, ip, io = (
                _pick(header, _TIME_COLS, path),
                _pick(header, _PROMPT_COLS, path),
                _pick(header, _OUTPUT_COLS, path),
            )
            for row in reader:
                if not row:
                    continue
                if len(row) <= max(it, ip, io):
                    raise ValueError(
                        f"{path}:{reader.line_num}: {len(row)} field(s), the header has "
                        f"{len(header)}"
                    )
                try:
                    prompts.append(_tokens(row[ip]))
                    outputs.append(_tokens(row[io]))
                except ValueError as exc:
                    raise ValueError(f"{path}:{reader.line_num}: {exc}") from None
                times.append(row[it])
        except csv.Error as exc:
            raise ValueError(f"{path}:{reader.line_num}: not CSV ({exc})") from None
    try:
        arrival_s = _parse_times(times)
    except ValueError as exc:
        raise ValueError(
            f"{path}: column {header[it]!r} holds neither seconds nor timestamps ({exc})"
        ) from None
    return Trace.from_arrays(arrival_s, prompts, outputs, name or path.stem)


def load_azure_csv(path: str | Path) -> Trace:
    """One of the Azure LLM inference trace CSVs."""
    return load_csv(path)


def load_jsonl(path: str | Path, name: str | None = None) -> Trace:
    """JSON lines with `timestamp` (ms), `input_length`, `output_length`."""
    path = Path(path)
    t: list[float] = []
    p: list[int] = []
    o: list[int] = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
                t.append(float(rec["timestamp"]) / 1000.0)
                p.append(_tokens(rec["input_length"]))
                o.append(_tokens(rec["output_length"]))
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: bad record ({exc})") from exc
    return Trace.from_arrays(t, p, o, name or path.stem)


def traces_dir() -> Path:
    """Folder of the Azure traces: $GOVERNOR_TRACES_DIR, else `../shared/data/traces`
    next to the repository when it exists, else the gzipped copies bundled with the
    package (`simulator/data/traces`)."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent
    shared = repo.parent / "shared" / "data" / "traces"
    return shared if shared.is_dir() else BUNDLED_TRACES


def azure_trace_path(key: str) -> Path:
    """Path of the Azure trace `key` (`conv` or `code`): plain CSV or its `.gz` copy."""
    if key not in AZURE_FILES:
        raise ValueError(f"unknown Azure trace {key!r} (known: {sorted(AZURE_FILES)})")
    base = traces_dir() / AZURE_FILES[key]
    for candidate in (
        base,
        base.with_name(base.name + ".gz"),
        BUNDLED_TRACES / (AZURE_FILES[key] + ".gz"),
    ):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"Azure trace {key!r} not found in {traces_dir()} (set ${TRACES_ENV})")


# --- synthetic traces -------------------------------------------------------------------------

# Lognormal lengths fitted to the conversation trace's median and p95:
# prompt p50 1020, p95 4083 -> sigma = ln(4083/1020)/1.645; output p50 129, p95 451.
PROMPT_MEDIAN, PROMPT_P95 = 1020.0, 4083.0
OUTPUT_MEDIAN, OUTPUT_P95 = 129.0, 451.0
_Z95 = 1.6448536269514722


def conv_like_lengths(
    n: int, rng: np.random.Generator, max_prompt: int = 16_384, max_output: int = 2_048
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths resembling the Azure conversation trace (lognormal)."""
    sp = math.log(PROMPT_P95 / PROMPT_MEDIAN) / _Z95
    so = math.log(OUTPUT_P95 / OUTPUT_MEDIAN) / _Z95
    p = rng.lognormal(math.log(PROMPT_MEDIAN), sp, n)
    o = rng.lognormal(math.log(OUTPUT_MEDIAN), so, n)
    return (
        np.clip(np.rint(p), 1, max_prompt).astype(np.int64),
        np.clip(np.rint(o), 1, max_output).astype(np.int64),
    )


def lognormal_from_mean_p95(mean: float, p95: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 95th percentile (p95 > mean > 0).

    mean = exp(mu + s^2/2), p95 = exp(mu + z s) -> s^2/2 - z s + ln(p95/mean) = 0, the
    smaller root. Mean 12,000, p95 40,000: s = 1.099, median 6,560.
    """
    if not 0 < mean < p95:
        raise ValueError(f"need 0 < mean < p95, got mean {mean}, p95 {p95}")
    disc = _Z95 * _Z95 - 2.0 * math.log(p95 / mean)
    if disc < 0:
        raise ValueError(f"no lognormal has mean {mean} and p95 {p95} (p95/mean too large)")
    sigma = _Z95 - math.sqrt(disc)
    return math.log(mean) - sigma * sigma / 2.0, sigma


def long_context_lengths(
    n: int, rng: np.random.Generator, cfg: dict[str, float], max_prompt: int = 120_000
) -> tuple[np.ndarray, np.ndarray]:
    """Lognormal prompts with `prompt_mean`/`prompt_p95` and outputs with
    `output_median`/`output_p95` (RAG and document questions: long context, short answers)."""
    mu, sp = lognormal_from_mean_p95(cfg["prompt_mean"], cfg["prompt_p95"])
    so = math.log(cfg["output_p95"] / cfg["output_median"]) / _Z95
    p = rng.lognormal(mu, sp, n)
    o = rng.lognormal(math.log(cfg["output_median"]), so, n)
    return (
        np.clip(np.rint(p), 1, max_prompt).astype(np.int64),
        np.clip(np.rint(o), 1, 4_096).astype(np.int64),
    )


def _nhpp(
    rate: Callable[[np.ndarray], np.ndarray],
    peak: float,
    duration_s: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Non-homogeneous Poisson arrivals on [0, duration_s) by thinning at `peak` rps."""
    n = rng.poisson(peak * duration_s)
    t = np.sort(rng.random(n) * duration_s)
    keep = rng.random(n) * peak < rate(t)
    return t[keep]


SYNTHETIC_DEFAULTS: dict[str, dict[str, float]] = {
    "poisson": {"rate": 20.0, "duration": 1200.0},
    "step": {"low": 10.0, "high": 40.0, "at": 0.5, "duration": 1200.0},
    "ramp": {"start_rate": 5.0, "end_rate": 50.0, "duration": 1200.0},
    "diurnal": {"mean": 25.0, "amplitude": 0.8, "period": 1200.0, "duration": 1200.0},
    "flash-crowd": {
        "base": 10.0,
        "factor": 10.0,
        "at": 0.4,
        "spike_s": 60.0,
        "duration": 1200.0,
    },
    "length-shift": {
        "rate": 10.0,
        "at": 0.5,
        "duration": 1200.0,
        "prompt_x": 1.0,
        "output_x": 4.0,
    },
    "long-context": {
        "mean": 2.0,
        "amplitude": 0.5,
        "period": 1800.0,
        "duration": 1800.0,
        "prompt_mean": 12_000.0,
        "prompt_p95": 40_000.0,
        "output_median": 200.0,
        "output_p95": 600.0,
    },
}
"""Parameters of each generator: rates in requests/s, `duration`/`period`/`spike_s` in
seconds, `at` a fraction of the duration, `amplitude` relative to the mean. Lengths are
conversation-like, except `long-context` (prompt mean/p95 and output median/p95 in
tokens; its rate follows `diurnal`'s curve: trough at 0, peak at half a period) and
`length-shift` (a steady Poisson rate whose conversation-like lengths are multiplied
from `at` on: prompts by `prompt_x`, outputs by `output_x`; by default outputs 4x
longer at the same rate, a replica's capacity falling ~3x within one request)."""


_AT_LEAST_ZERO = frozenset(
    ("rate", "low", "high", "start_rate", "end_rate", "mean", "base", "factor", "spike_s")
)
_FRACTIONS = frozenset(("at", "amplitude"))
"""Parameters in [0, 1]; every other one (durations, periods, the length shift's factors
and the lengths) must be > 0, every rate and `factor`/`spike_s` >= 0."""


def _param_problems(name: str, cfg: dict[str, float]) -> list[str]:
    """What is wrong with generator `name`'s parameters `cfg` (empty: nothing): each must
    be finite and within its range (see `_AT_LEAST_ZERO`, `_FRACTIONS`), a long-context
    output p95 at least its median, and the trace's expected size (peak rate x duration)
    within `MAX_SYNTHETIC_REQUESTS`."""
    out = []
    for key, v in cfg.items():
        if key in _FRACTIONS:
            ok, want = 0 <= v <= 1, "in [0, 1]"
        elif key in _AT_LEAST_ZERO:
            ok, want = 0 <= v < math.inf, ">= 0"
        else:
            ok, want = 0 < v < math.inf, "> 0"
        if not ok:
            out.append(f"{key} must be a finite number {want}, got {v:g}")
    if out:
        return out
    if cfg.get("output_p95", math.inf) < cfg.get("output_median", 0.0):
        out.append(
            f"output_p95 ({cfg['output_p95']:g}) must be >= output_median "
            f"({cfg['output_median']:g})"
        )
    expected = _rate_curve(name, cfg)[1] * cfg["duration"]
    if expected > MAX_SYNTHETIC_REQUESTS:
        out.append(
            f"its peak rate x duration is ~{expected:.3g} requests, past the "
            f"{MAX_SYNTHETIC_REQUESTS:,} a trace is built with in memory"
        )
    return out


def _rate_curve(
    name: str, cfg: dict[str, float]
) -> tuple[Callable[[np.ndarray], np.ndarray], float]:
    """Generator `name`'s rate (requests/s at times in seconds) with parameters `cfg`,
    and the highest rate it reaches."""
    dur = cfg["duration"]
    if name in ("poisson", "length-shift"):
        r = cfg["rate"]
        return (lambda t: np.full_like(t, r)), r
    if name == "step":
        lo, hi, at = cfg["low"], cfg["high"], cfg["at"] * dur
        return (lambda t: np.where(t < at, lo, hi)), max(lo, hi)
    if name == "ramp":
        a, b = cfg["start_rate"], cfg["end_rate"]
        return (lambda t: a + (b - a) * t / dur), max(a, b)
    if name in ("diurnal", "long-context"):
        mean, amp, per = cfg["mean"], cfg["amplitude"], cfg["period"]
        # Starts at the trough: mean * (1 - amp) at t = 0, peak at half a period.
        return (lambda t: mean * (1.0 - amp * np.cos(2.0 * np.pi * t / per))), mean * (1.0 + amp)
    base, fac, at, sp = cfg["base"], cfg["factor"], cfg["at"] * dur, cfg["spike_s"]  # flash-crowd
    return (lambda t: np.where((t >= at) & (t < at + sp), base * fac, base)), base * max(fac, 1.0)


def synthetic(name: str, seed: int = 0, **params: float) -> Trace:
    """A synthetic trace with conversation-like lengths; `params` override the defaults
    in `SYNTHETIC_DEFAULTS[name]`."""
    if name not in SYNTHETIC_DEFAULTS:
        raise ValueError(f"unknown synthetic trace {name!r} (known: {sorted(SYNTHETIC_DEFAULTS)})")
    cfg = dict(SYNTHETIC_DEFAULTS[name])
    unknown = set(params) - set(cfg)
    if unknown:
        raise ValueError(f"synthetic:{name}: unknown parameter(s) {sorted(unknown)}")
    cfg.update({k: float(v) for k, v in params.items()})
    if problems := _param_problems(name, cfg):
        raise ValueError(f"synthetic:{name}: {'; '.join(problems)}")
    dur = cfg["duration"]
    rng = np.random.default_rng(seed)
    rate, peak = _rate_curve(name, cfg)
    t = _nhpp(rate, peak, dur, rng) if peak > 0 else np.zeros(0)
    if name == "long-context":
        p, o = long_context_lengths(len(t), rng, cfg)
    else:
        p, o = conv_like_lengths(len(t), rng)
    if name == "length-shift":
        p, o = _shifted(t >= cfg["at"] * dur, p, o, cfg["prompt_x"], cfg["output_x"])
    return Trace.from_arrays(t, p, o, f"synthetic:{name}", rebase=False)


def _shifted(
    after: np.ndarray, p: np.ndarray, o: np.ndarray, prompt_x: float, output_x: float
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths (tokens) multiplied by `prompt_x` and `output_x` where
    `after`, at least one token each."""

    def scale(x: np.ndarray, f: float) -> np.ndarray:
        return np.where(after, np.maximum(1, np.rint(x * f)), x).astype(np.int64)

    return scale(p, prompt_x), scale(o, output_x)


def parse_synthetic(spec: str) -> tuple[str, dict[str, float]]:
    """`synthetic:NAME[:k=v,k=v]` -> (NAME, params)."""
    body = spec.removeprefix("synthetic:")
    name, _, rest = body.partition(":")
    params: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq:
            raise ValueError(f"{spec!r}: parameter {item!r} is not key=value")
        try:
            params[key.strip()] = float(val)
        except ValueError as exc:
            raise ValueError(f"{spec!r}: parameter {key!r} is not a number: {val!r}") from exc
    return name.strip(), params


def load_trace(
    spec: str | Path,
    *,
    rate_multiplier: float = 1.0,
    duration_s: float | None = None,
    seed: int = 0,
) -> Trace:
    """Load a trace by spec, scale it by `rate_multiplier`, keep arrivals < `duration_s`.

    `spec`: `synthetic:NAME[:k=v,...]`, `azure:conv` / `azure:code` (the shared Azure
    files, see `traces_dir`), or a path to a `.csv` / `.jsonl` file.
    """
    s = str(spec)
    if s.startswith("synthetic:"):
        name, params = parse_synthetic(s)
        trace = synthetic(name, seed=seed, **params)
    elif s.startswith("azure:"):
        key = s.removeprefix("azure:")
        trace = load_csv(azure_trace_path(key), name=f"azure:{key}")
    else:
        path = Path(s)
        if not path.is_file():
            raise FileNotFoundError(f"trace file not found: {path}")
        trace = load_jsonl(path) if path.suffix in (".jsonl", ".ndjson") else load_csv(path)
    if rate_multiplier != 1.0:
        trace = trace.scaled(rate_multiplier, seed=seed)
    if duration_s is not None:
        trace = trace.truncated(duration_s)
    return trace
