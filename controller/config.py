"""Configuration and SLA targets: pydantic models, YAML loading, environment overrides.

Units are in field names (`_ms`, `_s`, `_frac`). Unknown keys are errors everywhere, so
a typo cannot silently drop a setting. `load_config` returns a `GovernorConfig` or
raises `ConfigError` carrying one message per problem, each naming the field and value.

Environment overrides: `GOVERNOR_<PATH>` where PATH is the key path joined by `__`,
list items by index, case-insensitive; e.g. `GOVERNOR_POLICY__TICK_INTERVAL_S=10`,
`GOVERNOR_MODELS__0__REPLICAS__MAX_REPLICAS=8`. Values are parsed as YAML scalars. A
name without `__` is never an override (every top-level key is a section, never a
scalar): `GOVERNOR_ADMIN_TOKEN_FILE`, `GOVERNOR_SERVER` and the like are the command
line's own variables and must not fail the config as unknown keys.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from controller.rules import ScaleOutRule, check_unique_names
from controller.strictmodel import StrictModel as _Strict
from estimators.promql import check_ingress_query, check_labels
from estimators.stepmodel import DEFAULT_PROFILE

ENV_PREFIX = "GOVERNOR_"
# Kubernetes object names (RFC 1123 label); model names as vLLM's model_name label allows.
K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,252}$"


MAX_REPLICAS = 10_000
"""The most replicas a model may be given: past any fleet one model runs, and the
queueing model's cost grows with the fleet (10**6 took one decide 2.7 s)."""
MAX_SCRAPE_INTERVAL_S = 300
"""The slowest engine scrape the governor runs with, seconds (`prometheus.
scrape_interval_s`, and what Prometheus reports at start): past it every window and
lookback is stretched past usefulness (a reported 1 h read a pod dead for 2 h as up)."""
INT32_MAX = 2**31 - 1
"""The largest count the API's int32 fields carry (the batching knobs' bounds)."""


class DuplicateKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with a key twice (PyYAML keeps the last,
    so `replicas:` written twice silently dropped the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if isinstance(key, list | dict):
                continue  # not hashable: the base class reports it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads a float without a dot or an exponent sign (`5e2`, `1.5e3`) as a
# string, which a number field now refuses (controller.strictmodel): read it as YAML 1.2
# and every other parser do, a number.
DuplicateKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """`text` parsed as YAML like yaml.safe_load, but a key given twice in one mapping
    is a yaml.YAMLError naming it and its line, and so are a value the constructors
    cannot read (ValueError: an integer past Python's 4,300-digit limit, a date of month
    13) and nesting past the recursion limit (RecursionError): every reader handles
    yaml.YAMLError, and those had stopped every tick from a targets ConfigMap edit."""
    try:
        return yaml.load(text, Loader=DuplicateKeyLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    except ValueError as exc:
        raise yaml.YAMLError(f"a value it cannot read: {exc}".split(";")[0]) from None


MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""The largest config or targets file read, bytes: four times what a ConfigMap holds
(1 MiB), far past any fleet's models; `check-config /dev/zero` had read until memory ran
out."""


def read_config_text(path: Path) -> str:
    """The text of the file at `path`; OSError or ValueError (past MAX_CONFIG_BYTES, or
    not UTF-8, naming the byte offset) for the caller to report."""
    with path.open("rb") as fh:
        data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: not a config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


class SLA(_Strict):
    """A model's service-level objective."""

    ttft_p95_ms: PositiveFloat = Field(le=600_000, description="p95 time to first token, ms")
    itl_p95_ms: PositiveFloat = Field(le=60_000, description="p95 inter-token latency, ms")
    e2e_p99_ms: PositiveFloat | None = Field(
        default=None, le=3_600_000, description="optional p99 end-to-end latency, ms"
    )
    e2e_p95_ms: PositiveFloat | None = Field(
        default=None,
        le=3_600_000,
        description="p95 end-to-end latency target, ms: the `seed` policy's SLA (required there)",
    )
    attainment_goal_frac: float = Field(
        default=0.99,
        gt=0,
        lt=1,
        description="fraction of requests that must meet the SLA (< 1: a goal of every "
        "request has no quantile to size for)",
    )


class ReplicaBounds(_Strict):
    """Replica count bounds. `min_replicas` 0 allows scale to zero after the idle period."""

    min_replicas: NonNegativeInt = Field(default=1, le=MAX_REPLICAS)
    max_replicas: PositiveInt = Field(default=10, le=MAX_REPLICAS)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        return self


class KnobBounds(_Strict):
    """Bounds and defaults of the engine batching knobs (vLLM flag names)."""

    max_num_seqs_min: PositiveInt = Field(default=8, le=INT32_MAX)
    max_num_seqs_max: PositiveInt = Field(default=1024, le=INT32_MAX)
    max_num_batched_tokens_min: PositiveInt = Field(default=256, le=INT32_MAX)
    max_num_batched_tokens_max: PositiveInt = Field(default=65_536, le=INT32_MAX)
    default_max_num_seqs: PositiveInt = Field(default=256, le=INT32_MAX)
    default_max_num_batched_tokens: PositiveInt = Field(default=8192, le=INT32_MAX)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        problems = []
        if self.max_num_seqs_min > self.max_num_seqs_max:
            problems.append(
                f"max_num_seqs_min ({self.max_num_seqs_min}) must be <= "
                f"max_num_seqs_max ({self.max_num_seqs_max})"
            )
        if self.max_num_batched_tokens_min > self.max_num_batched_tokens_max:
            problems.append(
                f"max_num_batched_tokens_min ({self.max_num_batched_tokens_min}) must be <= "
                f"max_num_batched_tokens_max ({self.max_num_batched_tokens_max})"
            )
        if not self.max_num_seqs_min <= self.default_max_num_seqs <= self.max_num_seqs_max:
            problems.append(
                f"default_max_num_seqs ({self.default_max_num_seqs}) must lie in "
                f"[{self.max_num_seqs_min}, {self.max_num_seqs_max}]"
            )
        lo, hi = self.max_num_batched_tokens_min, self.max_num_batched_tokens_max
        if not lo <= self.default_max_num_batched_tokens <= hi:
            problems.append(
                f"default_max_num_batched_tokens ({self.default_max_num_batched_tokens}) "
                f"must lie in [{lo}, {hi}]"
            )
        # vLLM refuses a token budget below max_num_seqs: some pair must be valid, and
        # the defaults must be one (they are what engines start on).
        if self.max_num_batched_tokens_max < self.max_num_seqs_min:
            problems.append(
                f"max_num_batched_tokens_max ({hi}) must be >= max_num_seqs_min "
                f"({self.max_num_seqs_min}): vLLM refuses a token budget below max_num_seqs"
            )
        if self.default_max_num_batched_tokens < self.default_max_num_seqs:
            problems.append(
                f"default_max_num_batched_tokens ({self.default_max_num_batched_tokens}) must "
                f"be >= default_max_num_seqs ({self.default_max_num_seqs}): vLLM refuses a "
                "token budget below max_num_seqs"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class RateLimit(_Strict):
    """HPA-style scaling policy: change by at most `value` pods or percent per `period_s`."""

    type: Literal["pods", "percent"]
    value: PositiveInt
    period_s: PositiveFloat = Field(le=1800)


class ScalingPolicy(_Strict):
    """Control-loop and hysteresis settings (global; a model may override any field)."""

    tick_interval_s: PositiveFloat = Field(default=5.0, le=300)
    window_s: PositiveFloat = Field(default=60.0, le=3600, description="PromQL rate window")
    panic_window_s: PositiveFloat = Field(default=10.0, le=600)
    tolerance_frac: float = Field(default=0.1, ge=0, lt=1)
    scale_up_stabilization_s: NonNegativeFloat = Field(default=0.0, le=3600)
    scale_down_stabilization_s: NonNegativeFloat = Field(default=300.0, le=3600)
    scale_up_limits: tuple[RateLimit, ...] = (
        RateLimit(type="percent", value=100, period_s=15),
        RateLimit(type="pods", value=4, period_s=15),
    )
    scale_down_limits: tuple[RateLimit, ...] = (RateLimit(type="percent", value=100, period_s=15),)
    cooldown_after_scale_up_s: NonNegativeFloat = Field(
        default=600.0,
        le=3600,
        description=(
            "no scale-down within this many s of the last scale-up, so a scale-up is "
            "never reversed within the window that counts a reversal as a flap (10 min)"
        ),
    )
    falling_release_after_s: NonNegativeFloat | None = Field(
        default=600.0,
        le=86_400,
        description=(
            "a load that kept falling far past its noise over the scale-down window is "
            "released after window_s instead, once the last scale-up is this old (s); "
            "null: never"
        ),
    )
    panic_threshold_frac: float = Field(default=2.0, gt=1, le=100)
    panic_hold_s: NonNegativeFloat = Field(default=60.0, le=3600)
    burst_memory_half_life_s: NonNegativeFloat = Field(
        default=1800.0, le=86_400, description="half-life of the panic-burst memory; 0 = off"
    )
    scale_to_zero_idle_s: PositiveFloat = Field(default=600.0, le=86_400)
    no_data_ticks_before_fallback: PositiveInt = Field(default=3, le=1000)
    max_staleness_s: PositiveFloat = Field(
        default=90.0, le=3600, description="an observation whose newest sample is older is no data"
    )
    target_utilization_frac: float = Field(default=0.85, gt=0, le=1)
    itl_margin_frac: float = Field(default=0.85, gt=0, le=1)
    forecast_alpha: float = Field(default=0.3, gt=0, le=1)
    forecast_beta: float = Field(default=0.05, ge=0, le=1)
    backlog_drain_s: PositiveFloat = Field(default=30.0, le=3600)
    lengths_half_life_s: PositiveFloat = Field(
        default=300.0, le=86_400, description="smoothing of request-length statistics"
    )
    knob_min_gain_frac: float = Field(default=0.1, ge=0, le=10)
    knob_rollout_gain_frac: float = Field(
        default=0.25, ge=0, le=10, description="knob change that is worth a rolling restart"
    )
    knob_sustain_s: NonNegativeFloat = Field(default=120.0, le=86_400)
    knobs_live: bool = Field(
        default=False,
        description=(
            "the engines follow knob changes live (the scheduler plugin, `governor "
            "engine-args --live`): a change reaches every replica at its next step and "
            "no roll-out is asked for; false: the knobs apply at engine start only"
        ),
    )
    rollout_min_interval_s: NonNegativeFloat = Field(
        default=900.0,
        le=86_400,
        description="at most one knob roll-out (rolling restart) per model per this many s",
    )

    @model_validator(mode="after")
    def _windows(self) -> Self:
        if self.panic_window_s > self.window_s:
            raise ValueError(
                f"panic_window_s ({self.panic_window_s}) must be <= window_s ({self.window_s})"
            )
        if not self.scale_up_limits:
            raise ValueError("scale_up_limits must hold at least one limit")
        if not self.scale_down_limits:
            raise ValueError("scale_down_limits must hold at least one limit")
        return self


GLOBAL_ONLY_POLICY = frozenset({"tick_interval_s", "window_s", "panic_window_s", "max_staleness_s"})
"""Policy fields a model cannot override: the loop's tick and the metric source's rate
windows and staleness limit are one for every model (a model's own value was accepted
and half applied: its decider read it, the loop and the source did not)."""


class ModelConfig(_Strict):
    """One served model: identity, SLA, bounds and policy choices."""

    name: str = Field(pattern=MODEL_NAME, description="as in the model_name metric label")
    namespace: str = Field(default="default", pattern=K8S_NAME, max_length=63)
    deployment: str = Field(pattern=K8S_NAME, max_length=253)
    sla: SLA
    replicas: ReplicaBounds = ReplicaBounds()
    knobs: KnobBounds = KnobBounds()
    batching_policy: Literal["slo", "seed", "static"] = "slo"
    cold_start_s: PositiveFloat = Field(default=60.0, le=3600)
    profile: str = DEFAULT_PROFILE
    fallback_replicas: NonNegativeInt | None = Field(
        default=None, description="replicas to hold after repeated missing data, if higher"
    )
    policy: dict[str, Any] = Field(
        default_factory=dict, description="per-model overrides of the global policy fields"
    )
    scale_out_rules: tuple[ScaleOutRule, ...] = Field(
        default=(),
        max_length=32,
        description="composite scale-out rules (controller/rules.py); never lower replicas",
    )

    @field_validator("policy")
    @classmethod
    def _policy_overrides(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if key in GLOBAL_ONLY_POLICY:
                raise ValueError(
                    f"{key} is set in the global policy only: the loop ticks, and the "
                    "source reads its windows and sample ages, once for every model"
                )
            # A NaN or infinity is no setting, and JSON (the state store, the admin API's
            # Struct) cannot carry it: a dump would turn it into null, another setting.
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number (got {value})")
        return v

    @model_validator(mode="after")
    def _fallback_in_bounds(self) -> Self:
        check_unique_names(self.scale_out_rules)
        if self.batching_policy == "seed" and self.sla.e2e_p95_ms is None:
            raise ValueError(
                "batching_policy 'seed' needs sla.e2e_p95_ms (the p95 latency target its "
                "rule divides by the p95 per-request decode time)"
            )
        fb = self.fallback_replicas
        if fb is not None and fb > self.replicas.max_replicas:
            raise ValueError(
                f"fallback_replicas ({fb}) must be <= replicas.max_replicas "
                f"({self.replicas.max_replicas})"
            )
        return self


class PrometheusSettings(_Strict):
    """Where and how to query Prometheus."""

    url: str = Field(default="http://localhost:9090", pattern=r"^https?://\S+$")
    timeout_s: PositiveFloat = Field(
        default=3.0,
        le=60,
        description="seconds: each query's timeout to connect and between two reads, and "
        "Prometheus's own evaluation timeout; a query not fully answered within twice "
        "this is abandoned (its tick has no data), however its answer trickles in",
    )
    disable_ssl: bool = False
    model_label: str = Field(default="model_name", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    namespace_label: str | None = Field(
        default="namespace",
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="the label holding the namespace of the scraped engine (what "
        "Kubernetes service discovery and ServiceMonitors add): each model reads the "
        "series of its own namespace only, and series without the label where there "
        "are none; null: every series of the model's name, whatever its namespace",
    )
    scrape_interval_s: PositiveFloat = Field(
        default=15.0,
        le=MAX_SCRAPE_INTERVAL_S,
        description="how often Prometheus scrapes the engines: a rate window needs at "
        "least two samples, so the short (panic) window is at least two of these",
    )
    query_method: Literal["POST", "GET"] = Field(
        default="POST",
        description="HTTP method of the governor's instant queries: POST sends each query "
        "as a form body (what Grafana does by default; no URL-length limit of a proxy in "
        "between applies), GET in the URL, for a read-only proxy that refuses POST",
    )
    ingress_rate_query: str | None = Field(
        default=None,
        max_length=4096,
        description="PromQL: each model's request rate at the gateway, router or ingress "
        "in front of its engines (req/s), grouped by model_label, with {window} where the "
        "rate window goes. The only demand signal of a model scaled to zero: without it "
        "min_replicas 0 is held at 1 (nothing would report the demand to scale up from "
        "zero). Example: sum by (model_name) (rate(inference_model_request_total[{window}]))",
    )

    @field_validator("ingress_rate_query")
    @classmethod
    def _ingress(cls, v: str | None) -> str | None:
        return None if v is None else check_ingress_query(v)

    @model_validator(mode="after")
    def _labels(self) -> Self:
        check_labels(self.model_label, self.namespace_label)
        return self


class GovernorConfig(_Strict):
    """The whole configuration file."""

    models: tuple[ModelConfig, ...]
    policy: ScalingPolicy = ScalingPolicy()
    prometheus: PrometheusSettings = PrometheusSettings()

    @model_validator(mode="after")
    def _unique_and_policies(self) -> Self:
        # Checked here, not with min_length, so a bad item is not also reported as "empty".
        if not self.models:
            raise ValueError("models: at least one model is required")
        seen: set[str] = set()
        scaled: dict[tuple[str, str], str] = {}
        for m in self.models:
            if m.name in seen:
                raise ValueError(f"model name {m.name!r} appears more than once")
            seen.add(m.name)
            other = scaled.setdefault((m.namespace, m.deployment), m.name)
            if other != m.name:
                raise ValueError(
                    f"models {other!r} and {m.name!r} both scale deployment "
                    f"{m.namespace}/{m.deployment} (their decisions would fight over it)"
                )
        for m in self.models:
            try:
                self.policy_for(m)
            except ValidationError as exc:
                msgs = format_validation_error(exc, prefix=f"models[{m.name}].policy")
                raise ValueError("; ".join(msgs)) from None
        problems = scrape_problems(self.policy, self.prometheus.scrape_interval_s)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def model(self, name: str) -> ModelConfig:
        """The model named `name`; KeyError if none."""
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    @property
    def short_window_s(self) -> float:
        """The short (panic) window the source reads, seconds: `policy.panic_window_s`,
        raised to two scrape intervals (a rate over fewer than two samples is empty).
        Example: panic_window_s 10 at a 15 s scrape -> 30 s."""
        return max(self.policy.panic_window_s, 2.0 * self.prometheus.scrape_interval_s)

    def policy_for(self, model: ModelConfig) -> ScalingPolicy:
        """The global policy with the model's overrides applied (validated)."""
        if not model.policy:
            return self.policy
        merged = self.policy.model_dump()
        merged.update(model.policy)
        return ScalingPolicy.model_validate(merged)


def scrape_problems(policy: ScalingPolicy, scrape_s: float) -> list[str]:
    """What in the global `policy` the engines' scrape interval (`scrape_s`, seconds)
    rules out: a rate window or a staleness limit under two scrapes (empty: nothing).
    Example: window_s 45 at a 30 s scrape -> one problem (a rate needs two samples)."""
    out = []
    if policy.window_s < 2.0 * scrape_s:
        out.append(
            f"policy.window_s ({policy.window_s}) must be >= 2 x "
            f"prometheus.scrape_interval_s ({scrape_s}): a rate needs two samples"
        )
    if policy.max_staleness_s < 2.0 * scrape_s:
        out.append(
            f"policy.max_staleness_s ({policy.max_staleness_s}) must be >= 2 x "
            f"prometheus.scrape_interval_s ({scrape_s}): samples are that old between scrapes"
        )
    return out


class ConfigError(Exception):
    """Invalid configuration: `problems` holds one message per problem."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))


def format_validation_error(exc: ValidationError, prefix: str = "") -> list[str]:
    """One line per pydantic error: `path: message (got VALUE)`; an error of the whole
    document (a cross-field check) is its message alone, which names its own fields."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        if prefix:
            loc = f"{prefix}.{loc}" if loc else prefix
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling)"
        got = err.get("input")
        if not loc:
            lines.append(msg)
        elif err["type"] in ("missing",) or isinstance(got, dict | list):
            lines.append(f"{loc}: {msg}")
        else:
            lines.append(f"{loc}: {msg} (got {got!r})")
    return lines


def _parse_scalar(text: str) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return text


def apply_env_overrides(
    data: dict[str, Any], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, list[str]]]:
    """Apply `GOVERNOR_A__B__0__C=value` overrides to `data` in place.

    Returns the problems found (an index past the end of a list, a path through a
    scalar; unknown keys are left for validation to report) and the overrides applied
    (variable name -> its path of keys, `['models', '0', 'sla', 'ttft_p95_ms']`). Names
    without `__` are not overrides (module doc).
    """
    problems: list[str] = []
    applied: dict[str, list[str]] = {}
    for key in sorted(environ):
        if not key.upper().startswith(ENV_PREFIX) or "__" not in key[len(ENV_PREFIX) :]:
            continue
        path = [p.lower() for p in key[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        node: Any = data
        ok = True
        for i, part in enumerate(path):
            last = i == len(path) - 1
            if isinstance(node, list):
                if not re.fullmatch(r"\d+", part) or int(part) >= len(node):
                    problems.append(
                        f"env {key}: {part!r} is not an index of a {len(node)}-item list"
                    )
                    ok = False
                    break
                if last:
                    node[int(part)] = _parse_scalar(environ[key])
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = _parse_scalar(environ[key])
                else:
                    node = node.setdefault(part, {})
            else:
                problems.append(f"env {key}: cannot set {part!r} inside a scalar")
                ok = False
                break
        if ok:
            applied[key] = path
    return problems, applied


def _blame_env(lines: list[str], applied: dict[str, list[str]], data: dict[str, Any]) -> list[str]:
    """`lines` (validation problems, `path: message`), each whose path an environment
    override set (or lies under) ending `(set by env NAME)`: the file does not hold the
    value it reports. A model entry's path reads `models[NAME]` or `models.INDEX`."""
    models = data.get("models")
    prefixes: list[tuple[str, str]] = []
    for key, path in applied.items():
        prefixes.append((".".join(path), key))
        if path[0] == "models" and len(path) > 1 and isinstance(models, list):
            entry = models[int(path[1])] if path[1].isdigit() else None
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                prefixes.append((".".join([f"models[{entry['name']}]", *path[2:]]), key))
    out = []
    for line in lines:
        field = line.partition(": ")[0]
        keys = sorted(
            {k for p, k in prefixes if field == p or field.startswith((p + ".", p + "["))}
        )
        out.append(f"{line} (set by env {', '.join(keys)})" if keys else line)
    return out


def parse_config(
    data: Any, *, source: str = "config", environ: Mapping[str, str] | None = None
) -> GovernorConfig:
    """Validate already-parsed config `data` (with env overrides) or raise ConfigError."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"<root>: must be a mapping with a 'models:' list (got {type(data).__name__})"], source
        )
    problems, applied = apply_env_overrides(data, os.environ if environ is None else environ)
    entry_problems: list[str] = []
    if isinstance(data.get("models"), list):
        # each entry through the one target validator (controller.targets), so a config
        # file reports a bad model exactly as the Admin API and the ConfigMap do
        from controller.targets import model_problems

        entry_problems = model_problems(data["models"])
    try:
        cfg = GovernorConfig.model_validate(data)
    except ValidationError as exc:
        rest = format_validation_error(exc)
        if entry_problems:  # the entries' own problems are reported once, by name
            rest = [p for p in rest if not p.startswith("models.")]
        found = _blame_env(entry_problems + rest, applied, data)
        raise ConfigError(problems + found, source) from None
    if problems:
        raise ConfigError(problems, source)
    return cfg


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> GovernorConfig:
    """Read, override from the environment, and validate a YAML config file."""
    p = Path(path)
    try:
        text = read_config_text(p)
    except OSError as exc:
        raise ConfigError([f"cannot read file: {exc.strerror or exc}"], str(p)) from None
    except ValueError as exc:
        raise ConfigError([str(exc)], str(p)) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"not valid YAML: {exc}"], str(p)) from None
    return parse_config(data, source=str(p), environ=environ)
