"""The strict base of every configuration record (controller.config, controller.rules):
unknown keys are errors, records are frozen, defaults validated, and a boolean where a
number goes is refused (pydantic's lax mode reads a YAML `true` as 1)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    """Unknown keys refused, frozen, defaults validated, no booleans for numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """A YAML `true` where a number goes is a mistake, not 1 (pydantic's lax mode
        reads it as 1: `ttft_p95_ms: true` was an SLA of 1 ms)."""
        if isinstance(data, Mapping):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(key, str) else None
                if isinstance(value, bool) and field is not None and bool_refused(field.annotation):
                    raise ValueError(f"{key}: expected a number, got a boolean ({value})")
        return data


def bool_refused(annotation: Any) -> bool:
    """Whether a field of type `annotation` takes numbers but not booleans."""
    args = typing.get_args(annotation) or (annotation,)
    flat = {typing.get_origin(a) or a for a in args}
    if bool in flat:
        return False
    return any(isinstance(a, type) and issubclass(a, int | float) for a in flat) or any(
        typing.get_origin(a) is typing.Annotated
        and isinstance(typing.get_args(a)[0], type)
        and issubclass(typing.get_args(a)[0], int | float)
        for a in args
    )
