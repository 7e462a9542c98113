"""The engine's live batching limits under the governor: pure logic, no vLLM import.

`LiveLimits` turns the governor's latest knobs into the two values the scheduler uses,
never above the values the engine started with (its ceilings: start the engine with the
largest knobs the governor may choose and let the governor lower them):
- `max_num_seqs` -> the admission cap (vLLM's `max_num_active_reqs`): at least 1;
- `max_num_batched_tokens` -> the step token budget (`max_num_scheduled_tokens`): at
  least the admission cap (vLLM's own rule for the flag), and, when chunked prefill is
  off, at least the longest prompt the engine accepts (`min_tokens`), so a prompt never
  waits for a budget it cannot fit in.
`EngineSettings` finds the governor's address and the model name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from governor_engine.follower import MODEL_ENV, SERVER_ENV, TLS_CA_ENV, KnobUpdate


@dataclass(frozen=True, slots=True)
class Limits:
    """Admission cap (sequences) and step token budget (tokens)."""

    max_num_seqs: int
    max_num_batched_tokens: int


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
        """Settings from the engine's config, then the environment."""
        e = os.environ if env is None else env
        extra = additional_config if isinstance(additional_config, Mapping) else {}
        server = str(extra.get("governor_server") or e.get(SERVER_ENV, "")).strip()
        model = str(extra.get("governor_model") or e.get(MODEL_ENV, "") or served_model_name)
        tls = extra.get("governor_tls_ca_file") or e.get(TLS_CA_ENV) or None
        engine_id = e.get("POD_NAME") or e.get("HOSTNAME") or ""
        return cls(server, model.strip(), str(tls) if tls else None, engine_id)
