"""The engine's live batching limits under the governor: pure logic, no vLLM import.

`LiveLimits` turns the governor's latest knobs into the two values the scheduler uses,
never above the values the engine started with (its ceilings: start the engine with the
largest knobs the governor may choose and let the governor lower them):
- `max_num_seqs` -> the admission cap (vLLM's `max_num_active_reqs`): at least 1;
- `max_num_batched_tokens` -> the step token budget (`max_num_scheduled_tokens`): at
  least the admission cap (vLLM's own rule for the flag), and at least what a request
  the scheduler must schedule whole needs (`token_floor`: a prompt without chunked
  prefill, a multimodal item without chunked multimodal input, a padded speculative
  decode step), so a request never waits for a budget it cannot fit in.
`EngineSettings` finds the governor's address and the model name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from governor_engine.follower import LOG, MODEL_ENV, SERVER_ENV, TLS_CA_ENV, KnobUpdate


@dataclass(frozen=True, slots=True)
class Limits:
    """Admission cap (sequences) and step token budget (tokens)."""

    max_num_seqs: int
    max_num_batched_tokens: int


def token_floor(
    *,
    chunked_prefill: bool,
    max_model_len: int,
    chunked_mm_input: bool,
    encoder_input_tokens: int,
    spec_tokens: int,
    lookahead_tokens: int,
) -> int:
    """The smallest step token budget (tokens) that leaves no request unschedulable in
    vLLM 0.32's scheduler (`vllm/v1/core/sched/scheduler.py`), which schedules whole:

    - a prompt, without chunked prefill: `max_model_len`;
    - a multimodal item, without chunked multimodal input (`--disable-chunked-mm-input`,
      forced for encoder-decoder models): it rolls a step back to before an item that
      does not fit, so a budget below the item schedules nothing of the request, ever.
      `encoder_input_tokens` is the scheduler's encoder compute budget, at least the
      largest item (vLLM refuses to start with a budget below that item; a budget the
      governor lowered under it had stalled the waiting queue's head);
    - a padded speculative decode step, 1 + `spec_tokens` + `lookahead_tokens`: a
      resumed request is not scheduled rather than scheduled unpadded.

    Example: chunked prefill on, chunked multimodal input off with an encoder budget of
    2,048, 3 speculative tokens -> 2,048."""
    floor = 1
    if not chunked_prefill:
        floor = max(floor, max_model_len)
    if not chunked_mm_input and encoder_input_tokens > 0:
        floor = max(floor, encoder_input_tokens)
    if spec_tokens > 0:
        floor = max(floor, 1 + spec_tokens + lookahead_tokens)
    return floor


class LiveLimits:
    """Clamps governor knobs into the engine's start ceilings; remembers what it applied."""

    def __init__(self, ceiling: Limits, min_tokens: int = 1) -> None:
        if ceiling.max_num_seqs < 1 or ceiling.max_num_batched_tokens < 1:
            raise ValueError(f"ceilings must be >= 1, got {ceiling}")
        self.ceiling = ceiling
        self.min_tokens = max(1, min(min_tokens, ceiling.max_num_batched_tokens))
        self.current = ceiling
        self.generation: int | None = None

    def clamp(self, seqs: int, tokens: int) -> Limits:
        """The limits the engine may run with for the requested knobs."""
        s = max(1, min(seqs, self.ceiling.max_num_seqs))
        floor = max(s, self.min_tokens)
        t = max(floor, min(tokens, self.ceiling.max_num_batched_tokens))
        return Limits(s, min(t, self.ceiling.max_num_batched_tokens))

    def update(self, latest: KnobUpdate | None) -> Limits | None:
        """The new limits when `latest` changes them, else None (nothing to apply)."""
        if latest is None:
            return None
        wanted = self.clamp(latest.max_num_seqs, latest.max_num_batched_tokens)
        self.generation = latest.generation
        if wanted == self.current:
            return None
        self.current = wanted
        return wanted


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Where the governor is and which model to follow.

    From vLLM's `--additional-config` JSON (`governor_server`, `governor_model`,
    `governor_tls_ca_file`), else `$GOVERNOR_SERVER`, `$GOVERNOR_MODEL`,
    `$GOVERNOR_TLS_CA_FILE`; the model defaults to the engine's served model name.
    An empty `server` means "no governor": the engine runs at its start values.
    """

    server: str
    model: str
    tls_ca_file: str | None
    engine_id: str

    @classmethod
    def resolve(
        cls,
        additional_config: Mapping[str, Any] | None,
        served_model_name: str,
        env: Mapping[str, str] | None = None,
    ) -> EngineSettings:
        """Settings from the engine's config, then the environment; a blank setting is
        not given (a blank $GOVERNOR_MODEL had won over the served model name, and the
        engine then failed to start on "the model name is empty")."""
        e = os.environ if env is None else env
        extra = additional_config if isinstance(additional_config, Mapping) else {}

        def first(key: str, env_name: str) -> str:
            return _text(extra.get(key)) or _text(e.get(env_name))

        tls = first("governor_tls_ca_file", TLS_CA_ENV)
        return cls(
            server=first("governor_server", SERVER_ENV),
            model=first("governor_model", MODEL_ENV) or served_model_name.strip(),
            tls_ca_file=tls or None,
            engine_id=_text(e.get("POD_NAME")) or _text(e.get("HOSTNAME")),
        )


def preempt_over_cap(additional_config: Mapping[str, Any] | None) -> bool:
    """`governor_preempt_over_cap` of `--additional-config` (governor_engine.scheduler):
    true/false, as a JSON boolean or its spelling in a string ("false", "0", "no",
    "off"); anything else is warned about, naming the key, and read as the default,
    true. Only the scheduler reads it (the API server's middleware resolves the
    `EngineSettings` too, and had warned about a bad value a second time)."""
    extra = additional_config if isinstance(additional_config, Mapping) else {}
    return _flag(extra, "governor_preempt_over_cap", True)


def _text(value: Any) -> str:
    """A setting's text, blank when unset (None) or only whitespace."""
    return "" if value is None else str(value).strip()


def _flag(extra: Mapping[str, Any], key: str, default: bool) -> bool:
    """A boolean setting of `--additional-config`: a JSON boolean or its spelling in a
    string (a quoted Helm value); anything else warned about and `default`."""
    value = extra.get(key, default)
    if isinstance(value, bool):
        return value
    text = _text(value).lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    LOG.warning("governor: %s=%r is not true or false; using %s", key, value, default)
    return default
