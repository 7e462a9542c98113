"""Regenerate the governor-config part of helm/llm-governor/values.schema.json.

The chart's `models`, `policy` and `prometheus` values are the governor's config file
(controller/config.py, GovernorConfig) verbatim, so their JSON schema is generated from the
pydantic models instead of being copied by hand: a value the governor would refuse at
start fails at `helm install` instead, with the same field names and limits.

Only `$defs/governor.*` and `properties.{models,policy,prometheus}` are rewritten; the rest
of the schema (the chart's own values) is hand-written and kept as it is.
tests/helm/test_schema.py fails when this output is stale.

Usage: .venv/bin/python helm/gen_values_schema.py [--check]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "helm" / "llm-governor" / "values.schema.json"
PREFIX = "governor."
CONFIG_KEYS = ("models", "policy", "prometheus")


# Dropped from pydantic's output: `title` is noise in Helm's messages, and `default` is
# documentation Helm never applies (the governor applies its own defaults), which would
# make the schema stale at every change of a default value.
_DROPPED = {"title", "default"}


def _strip(node: Any, *, names: bool = False) -> Any:
    """`node` without _DROPPED keywords; `names`: node maps property names to schemas,
    whose keys are kept whatever they are."""
    if isinstance(node, dict):
        return {
            k: _strip(v, names=(k == "properties" and not names))
            for k, v in node.items()
            if names or k not in _DROPPED
        }
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def model_policy_schema(policy: dict[str, Any], global_only: frozenset[str]) -> dict[str, Any]:
    """The schema of a model's `policy:` overrides, from ScalingPolicy's (`policy`): its
    fields less the `global_only` ones, nothing else. The config model holds the
    overrides as a plain mapping (they are merged into the global policy and validated
    there, controller/config.py GovernorConfig.policy_for), whose own schema would take
    any key: a typo or a global-only key would pass `helm install` and stop the governor."""
    return {
        "additionalProperties": False,
        "description": "per-model overrides of the global policy fields (every field of "
        "`policy` but " + ", ".join(sorted(global_only)) + ", which are global only)",
        "properties": {
            k: _strip(v) for k, v in policy["properties"].items() if k not in global_only
        },
        "type": "object",
    }


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(properties for models/policy/prometheus, $defs named governor.*) from GovernorConfig."""
    sys.path.insert(0, str(ROOT))
    from controller.config import GLOBAL_ONLY_POLICY, GovernorConfig

    raw = GovernorConfig.model_json_schema(ref_template="#/$defs/" + PREFIX + "{model}")
    defs = {PREFIX + name: _strip(d) for name, d in sorted(raw["$defs"].items())}
    defs[PREFIX + "ModelConfig"]["properties"]["policy"] = model_policy_schema(
        raw["$defs"]["ScalingPolicy"], GLOBAL_ONLY_POLICY
    )
    props = {k: _strip(raw["properties"][k]) for k in CONFIG_KEYS}
    props["models"]["description"] = (
        "the governor's models (controller/config.py ModelConfig); at least one is required"
    )
    return props, defs


def render(current: dict[str, Any]) -> dict[str, Any]:
    """`current` with the generated parts replaced."""
    props, defs = config_schema()
    out = dict(current)
    out["properties"] = dict(current.get("properties", {}))
    out["properties"].update(props)
    kept = {k: v for k, v in current.get("$defs", {}).items() if not k.startswith(PREFIX)}
    out["$defs"] = dict(sorted((kept | defs).items()))
    return out


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    current = json.loads(SCHEMA_PATH.read_text())
    text = dumps(render(current))
    if "--check" in argv:
        if text != SCHEMA_PATH.read_text():
            print(f"{SCHEMA_PATH} is stale: run .venv/bin/python helm/gen_values_schema.py")
            return 1
        return 0
    SCHEMA_PATH.write_text(text)
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
