"""Step-time model of a continuous-batching engine, and the profiles it is read from.

The model (docs/ARCHITECTURE.md, Plant model) gives the wall time of one engine iteration in
milliseconds from what the iteration does. Profiles are YAML data files under
`estimators/profiles/` so another model or GPU is a new file, not new code. The same
object serves the simulator (the plant) and the decider (the controller's model of
the plant), so the two can only disagree where the controller's inputs are wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

DEFAULT_PROFILE = "llama-3.1-8b-h100"


class StepTimeCoefficients(BaseModel):
    """Coefficients of the step-time formula; all in milliseconds (per unit named)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    floor_ms: PositiveFloat
    base_ms: float = Field(ge=0)
    per_token_ms: PositiveFloat
    fixed_ms: float = Field(ge=0)
    per_sampled_seq_ms: float = Field(ge=0)
    per_decode_kv_token_ms: float = Field(ge=0)
    prefill_attention_ms_per_token2: float = Field(ge=0)


class MemoryProfile(BaseModel):
    """GPU memory facts used to size the KV cache (bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_memory_bytes: PositiveInt
    gpu_memory_utilization: float = Field(gt=0, le=1)
    weights_bytes: PositiveInt
    kv_bytes_per_token: PositiveInt
    block_size_tokens: PositiveInt = 16


class EngineDefaults(BaseModel):
    """The engine's own knob defaults on this GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_batched_tokens: PositiveInt
    max_num_seqs: PositiveInt


class Profile(BaseModel):
    """One model-on-GPU profile: step time, memory, context limit, cold start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model: str
    gpu: str
    tensor_parallel: PositiveInt = 1
    dtype: str = "bfloat16"
    source: str
    step_time: StepTimeCoefficients
    memory: MemoryProfile
    max_model_len: PositiveInt
    engine_defaults: EngineDefaults
    cold_start_s: PositiveFloat
    request_overhead_ms: float = Field(default=0.0, ge=0)
    """Server time per request before its first step: HTTP, tokenization, scheduling
    hand-off (detokenization is in the step time). Added to TTFT, ms."""

    @property
    def kv_capacity_tokens(self) -> int:
        """KV-cache capacity in tokens, rounded down to whole blocks.

        (GPU memory x utilization - weights) / bytes per token. For the default profile:
        (85.52e9 x 0.9 - 16.06e9) / 131072 = 464,688 tokens (29,043 blocks of 16).
        """
        mem = self.memory
        free = mem.gpu_memory_bytes * mem.gpu_memory_utilization - mem.weights_bytes
        blocks = int(free // mem.kv_bytes_per_token) // mem.block_size_tokens
        return blocks * mem.block_size_tokens

    @property
    def kv_capacity_blocks(self) -> int:
        """KV-cache capacity in blocks."""
        return self.kv_capacity_tokens // self.memory.block_size_tokens

    def step_model(self) -> StepTimeModel:
        """The step-time model for this profile."""
        return StepTimeModel(self.step_time)


class StepTimeModel:
    """Milliseconds per engine iteration as a function of what the iteration does."""

    __slots__ = ("_c", "attn", "base", "fixed", "floor", "per_kv", "per_seq", "per_token")

    def __init__(self, coefficients: StepTimeCoefficients) -> None:
        self._c = coefficients
        # Plain attributes: the simulator calls step_ms millions of times.
        self.floor = coefficients.floor_ms
        self.base = coefficients.base_ms
        self.per_token = coefficients.per_token_ms
        self.fixed = coefficients.fixed_ms
        self.per_seq = coefficients.per_sampled_seq_ms
        self.per_kv = coefficients.per_decode_kv_token_ms
        self.attn = coefficients.prefill_attention_ms_per_token2

    @property
    def coefficients(self) -> StepTimeCoefficients:
        return self._c

    def step_ms(
        self,
        num_tokens: int,
        num_sampling_seqs: int,
        decode_kv_tokens: int,
        prefill_attention_units: float = 0.0,
    ) -> float:
        """Time of one iteration, ms.

        `prefill_attention_units` is sum over chunks of c * (k + c/2) (token^2); see
        `chunk_attention_units`.
        """
        linear = self.base + self.per_token * num_tokens
        return (
            (linear if linear > self.floor else self.floor)
            + self.fixed
            + self.per_seq * num_sampling_seqs
            + self.per_kv * decode_kv_tokens
            + self.attn * prefill_attention_units
        )

    @staticmethod
    def chunk_attention_units(chunks: Iterable[tuple[int, int]]) -> float:
        """Sum of c * (k + c/2) over prefill chunks given as (c, k) pairs, token^2."""
        return sum(c * (k + c / 2.0) for c, k in chunks)

    def decode_step_ms(self, num_seqs: int, total_kv_tokens: float) -> float:
        """A pure-decode iteration of `num_seqs` sequences holding `total_kv_tokens`, ms.

        Single stream at 1,000 tokens of context: max(6.6, 2.3 + 0.0218) + 0.7 + 0.015
        + 0.05 = 7.365 ms.
        """
        return self.step_ms(num_seqs, num_seqs, int(total_kv_tokens))

    def prefill_ms(self, tokens: int) -> float:
        """A single prompt of `tokens` prefilled in one iteration from empty, ms.

        2,048 tokens: 2.3 + 44.65 + 0.7 + 0.015 + 1.31e-6 * 2048 * 1024 = 50.4 ms.
        """
        return self.step_ms(tokens, 1, 0, tokens * tokens / 2.0)

    def max_tokens_within(
        self, budget_ms: float, decode_seqs: int, decode_kv_tokens: float, chunk_context: float
    ) -> int:
        """Largest prefill chunk c (tokens) whose mixed step with the given decodes fits
        `budget_ms`; the chunk starts `chunk_context` tokens into its prompt. 0 if none.

        Solves attn/2 * c^2 + (per_token + attn * k) * c + fixed_part <= budget (the
        linear branch of the max; the floor branch only adds room).
        """
        fixed_part = (
            self.base
            + self.per_token * decode_seqs
            + self.fixed
            + self.per_seq * (decode_seqs + 1)
            + self.per_kv * decode_kv_tokens
        )
        fixed_part = max(fixed_part, self.floor + self.fixed + self.per_seq * (decode_seqs + 1))
        room = budget_ms - fixed_part
        if room <= 0:
            return 0
        a = self.attn / 2.0
        b = self.per_token + self.attn * chunk_context
        if a == 0:
            return int(room / b)
        return int((-b + math.sqrt(b * b + 4 * a * room)) / (2 * a))


def profiles_dir() -> Path:
    """Folder holding the shipped profile YAML files."""
    return Path(str(resources.files("estimators") / "profiles"))


@cache
def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    """Load a profile by shipped name (`llama-3.1-8b-h100`) or by YAML file path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = profiles_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in profiles_dir().glob("*.yaml"))
        raise FileNotFoundError(f"profile {name_or_path!r} not found (shipped: {', '.join(known)})")
    with path.open() as fh:
        data = yaml.safe_load(fh)
    return Profile.model_validate(data)
