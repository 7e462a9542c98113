"""The strict base of every configuration record (controller.config, controller.rules):
unknown keys are errors, records are frozen, defaults validated, and a boolean where a
number goes is refused (pydantic's lax mode reads a YAML `true` as 1)."""

from __future__ import annotations

import types
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
    """Whether a field of type `annotation` takes numbers but not booleans (int | None
    and Annotated[float, ...] do; bool | int and str do not)."""
    kinds = _kinds(annotation)
    return bool not in kinds and any(issubclass(k, int | float) for k in kinds)


def _kinds(annotation: Any) -> set[type]:
    """The plain types an annotation admits, through Annotated and unions."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    return {annotation} if isinstance(annotation, type) else set()
