"""The strict base of every configuration record (controller.config, controller.rules):
unknown keys are errors, records are frozen, defaults validated, and a value of another
kind than its field's is refused (pydantic's lax mode reads a YAML `true` as 1, `1` or
`"yes"` as true, `"5"` as 5)."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class StrictModel(BaseModel):
    """Unknown keys refused, frozen, defaults validated, values of their field's kind."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False
    )

    @model_validator(mode="before")
    @classmethod
    def _values_of_their_kind(cls, data: Any) -> Any:
        """A value of another kind than its field's is a mistake, not a conversion
        (pydantic's lax mode converts): a YAML `true` where a number goes (`ttft_p95_ms:
        true` was an SLA of 1 ms), a number or a string where only true or false goes
        (`knobs_live: 1`, `knobs_live: "yes"` read true), a string where a number goes
        (`scale_down_stabilization_s: "5"`)."""
        if isinstance(data, Mapping):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(key, str) else None
                if field is not None and (problem := wrong_kind(field.annotation, value)):
                    raise ValueError(f"{key}: {problem}")
        return data


def wrong_kind(annotation: Any, value: Any) -> str | None:
    """What is wrong with `value` for a field of type `annotation`, by kind alone (None:
    nothing; its range is the field's own validation)."""
    kinds = _kinds(annotation)
    numbers = any(issubclass(k, int | float) and k is not bool for k in kinds)
    if isinstance(value, bool):
        return f"expected a number, got a boolean ({value})" if bool_refused(annotation) else None
    if kinds and kinds <= {bool, type(None)} and value is not None:
        return f"expected true or false, got {value!r}"
    if isinstance(value, str) and numbers and str not in kinds and _numeric(value):
        return f"expected a number, got a string ({value!r})"
    return None  # (a string no number reads, pydantic refuses under the field's name)


def _numeric(text: str) -> bool:
    """Whether lax mode would read `text` as a number."""
    try:
        float(text)
    except ValueError:
        return False
    return True


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
