"""One home for SLA-target validation: the typed target document and every check an
operator's edit goes through, whichever way it arrives.

The same functions serve the `governor target set` CLI (before it sends anything), the
Admin API (`SetTarget`), the targets ConfigMap (service.store, on every change seen) and
`governor check-config` (through `controller.config.parse_config`), so a bad edit is
refused with the same message on every path and changes nothing.

- `validate_target(data)`: one model entry alone (field types, ranges, names).
  Problems read `models[NAME].FIELD: MESSAGE (got VALUE)`; an entry without a usable
  name reads `models.INDEX...`.
- `profile_problem(name, allow_paths=...)`: the one profile check: the name's form
  (remote callers may name shipped profiles only, never make the server read a path)
  and whether the profile loads.
- `build_config(base, doc)`: the whole set against the global policy (unique names,
  per-model policy overrides, paused models configured, profiles loadable).
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from controller.config import (
    MODEL_NAME,
    ConfigError,
    GovernorConfig,
    ModelConfig,
    format_validation_error,
)

MAX_PROBLEM_CHARS = 300
_SHIPPED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_GOOD_PROFILES: set[str] = set()


class TargetError(ValueError):
    """An invalid target edit; `problems` holds one message per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class TargetsDoc(BaseModel):
    """The operator-owned target set: validated model entries and the paused models.

    Serialized (store, state document) with each model's defaults left out, so the
    ConfigMap an operator reads holds what was set, not every default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[ModelConfig, ...] = Field(min_length=1)
    paused: tuple[str, ...] = ()

    @field_serializer("models")
    def _compact(self, models: tuple[ModelConfig, ...]) -> list[dict[str, Any]]:
        return [compact_entry(m) for m in models]

    def names(self) -> list[str]:
        return [m.name for m in self.models]


def compact_entry(model: ModelConfig) -> dict[str, Any]:
    """A model entry as stored: set fields only, the name always."""
    return {"name": model.name} | model.model_dump(mode="json", exclude_defaults=True)


def _label(data: Any, index: int | None) -> str:
    name = data.get("name") if isinstance(data, dict) else None
    if isinstance(name, str) and re.fullmatch(MODEL_NAME, name):
        return f"models[{name}]"
    return "target" if index is None else f"models.{index}"


def validate_target(data: Any, index: int | None = None) -> ModelConfig:
    """One model entry (a mapping as in the config file's `models:` list), validated
    alone; TargetError naming each problem (`index`: its place in a list, for entries
    without a usable name)."""
    label = _label(data, index)
    if not isinstance(data, dict):
        raise TargetError([f"{label}: must be a mapping (got {type(data).__name__})"])
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise TargetError(format_validation_error(exc, prefix=label)) from None


def model_problems(entries: Sequence[Any]) -> list[str]:
    """The problems of each entry of a `models:` list, validated alone."""
    problems: list[str] = []
    for i, entry in enumerate(entries):
        try:
            validate_target(entry, i)
        except TargetError as exc:
            problems.extend(exc.problems)
    return problems


def profile_problem(
    model: ModelConfig, *, allow_paths: bool = True, configured: Container[str] = ()
) -> str | None:
    """Why `model.profile` cannot be used, or None.

    `allow_paths` False (the Admin API and the CLI: remote callers): the profile must be
    a shipped profile's name, never a file path (a remote caller may not make the server
    read files), unless it is one already `configured`. Then, on every path: the profile
    must load, or the loop would fail on it at every tick."""
    name = model.profile
    where = f"models[{model.name}].profile"
    if (
        not allow_paths
        and name not in configured
        and not (_SHIPPED_NAME.fullmatch(name) and not name.endswith((".yaml", ".yml")))
    ):
        return f"{where}: must be the name of a shipped profile, not a path (got {name[:80]!r})"
    if name in _GOOD_PROFILES:
        return None
    from estimators.stepmodel import load_profile

    try:
        load_profile(name)
    except FileNotFoundError as exc:
        return f"{where}: {str(exc)[:MAX_PROBLEM_CHARS]}"
    except ValidationError as exc:
        text = "; ".join(format_validation_error(exc))[:MAX_PROBLEM_CHARS]
        return f"{where}: invalid profile: {text}"
    except (OSError, yaml.YAMLError, ValueError, TypeError) as exc:
        return f"{where}: cannot load profile {name[:100]!r}: {type(exc).__name__}"
    _GOOD_PROFILES.add(name)
    return None


def targets_doc(data: Any) -> TargetsDoc:
    """A target document from parsed YAML/JSON; TargetError naming each problem (model
    entries through `validate_target`)."""
    if not isinstance(data, dict):
        raise TargetError(
            [f"<root>: must be a mapping with a 'models:' list (got {type(data).__name__})"]
        )
    entries = data.get("models")
    problems = model_problems(entries) if isinstance(entries, list | tuple) else []
    try:
        doc = TargetsDoc.model_validate(data)
    except ValidationError as exc:
        rest = format_validation_error(exc)
        if problems:  # the entries' own problems are reported once, by name (and not
            # again as `models:` holding no valid entry, min_length's view of the same)
            rest = [p for p in rest if not p.startswith(("models.", "models:"))]
        raise TargetError(problems + rest) from None
    if problems:
        raise TargetError(problems)
    return doc


def config_to_targets(config: GovernorConfig, paused: Iterable[str] = ()) -> TargetsDoc:
    """The target document of a config's models."""
    return TargetsDoc(models=config.models, paused=tuple(sorted(paused)))


def build_config(
    base: GovernorConfig, targets: TargetsDoc, where: str = "targets"
) -> GovernorConfig:
    """`base` with its models replaced by `targets.models`, validated as a whole
    (global policy, unique names, per-model policy overrides, paused models configured,
    profiles loadable). Raises ConfigError (source `where`)."""
    data = base.model_dump(mode="json", exclude={"models"})
    data["models"] = [compact_entry(m) for m in targets.models]
    try:
        cfg = GovernorConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc), where) from None
    names = {m.name for m in cfg.models}
    problems = [
        f"paused: {p!r} is not a configured model" for p in targets.paused if p not in names
    ]
    problems += [p for m in cfg.models if (p := profile_problem(m)) is not None]
    if problems:
        raise ConfigError(problems, where)
    return cfg
