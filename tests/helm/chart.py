"""Rendering and validating the chart for the tests in this folder.

The chart is rendered with the real Helm library (helm-python-sdk embeds Helm 4's Go SDK:
the same template engine, values coalescing and values.schema.json validation as
`helm install`), fully offline. Every rendered Kubernetes object is validated against the
Kubernetes OpenAPI schemas that kubernetes-validate ships (strict: unknown fields fail);
the CRD kinds the chart renders (KEDA ScaledObject, Prometheus Operator ServiceMonitor and
PrometheusRule) against the schemas in crd_schemas.py.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm  # helm-python-sdk (test extra): the real, embedded Helm 4
import yaml

from tests.helm import crd_schemas

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "llm-governor"
RELEASE = "gov"
NAMESPACE = "llm-system"
FULLNAME = f"{RELEASE}-llm-governor"  # the release name with the chart name
# Helm's offline render reports Kubernetes v1.36.0 in .Capabilities (test_render checks it);
# validate against that version's schemas.
KUBE_VERSION = "1.36.0"

helm.disable_logging()

MODEL_8B: dict[str, Any] = {
    "name": "meta-llama/Llama-3.1-8B-Instruct",
    "namespace": "llm",
    "deployment": "llama-8b",
    "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 50, "e2e_p99_ms": 30000},
    "replicas": {"min_replicas": 1, "max_replicas": 16},
    "knobs": {"max_num_seqs_max": 512, "default_max_num_seqs": 128},
    "cold_start_s": 45,
    "fallback_replicas": 2,
}
MODEL_CODE: dict[str, Any] = {
    "name": "code-assistant",
    "namespace": "llm",
    "deployment": "code-assistant",
    "sla": {"ttft_p95_ms": 300, "itl_p95_ms": 40},
    "replicas": {"min_replicas": 0, "max_replicas": 8},
    "policy": {"scale_down_stabilization_s": 600},
}
MODEL_OTHER_NS: dict[str, Any] = {
    "name": "qwen-72b",
    "namespace": "research",
    "deployment": "qwen",
    "sla": {"ttft_p95_ms": 2000, "itl_p95_ms": 80},
    "replicas": {"min_replicas": 2, "max_replicas": 4},
}


def values(**overrides: Any) -> dict[str, Any]:
    """Minimal valid values (two models) with `overrides` merged in (dicts deep-merged)."""
    base: dict[str, Any] = {"models": [copy.deepcopy(MODEL_8B), copy.deepcopy(MODEL_CODE)]}
    return deep_merge(base, overrides)


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render_files(
    vals: Mapping[str, Any], chart: Path = CHART, namespace: str = NAMESPACE, name: str = RELEASE
) -> dict[str, str]:
    """Template path -> rendered text (raises helm.HelmError on bad values)."""
    with helm.Chart.load(str(chart)) as c:
        return c.render(dict(vals), name=name, namespace=namespace, is_install=True)


def parse(files: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in the rendered manifests (NOTES.txt excluded)."""
    objs: list[dict[str, Any]] = []
    for path, text in sorted(files.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                assert isinstance(doc, dict), f"{path}: a manifest is not a mapping: {doc!r}"
                objs.append(doc)
    return objs


def render(vals: Mapping[str, Any], **kw: Any) -> list[dict[str, Any]]:
    return parse(render_files(vals, **kw))


def find(
    objs: Iterable[dict[str, Any]], kind: str, name: str | None = None
) -> list[dict[str, Any]]:
    return [
        o for o in objs if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@functools.cache
def _k8s_validator(api_version: str, kind: str) -> Any:
    """A strict validator for one kind, built once: the same files and lookup as
    kubernetes_validate.validate (which re-reads the multi-megabyte definitions on every
    call, too slow for a matrix of renders)."""
    import jsonschema
    import referencing
    from kubernetes_validate import utils

    schema_dir = f"v{KUBE_VERSION}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(
            f"kubernetes-json-schema/{schema_dir}/{kind.lower()}-{group_version}.json",
            KUBE_VERSION,
        )
    except FileNotFoundError:
        raise AssertionError(
            f"no Kubernetes {KUBE_VERSION} schema for {api_version} {kind}"
        ) from None
    defs = utils.schema_contents(
        f"kubernetes-json-schema/{schema_dir}/_definitions.json", KUBE_VERSION
    )
    registry = referencing.Resource.from_contents(defs) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry()
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _crd_validator(api_version: str, kind: str) -> Any:
    return crd_schemas.validator(crd_schemas.SCHEMAS[(api_version, kind)])


def validate(obj: dict[str, Any]) -> None:
    """Validate one object against its schema; AssertionError naming the object and path."""
    kind, api = obj.get("kind"), obj.get("apiVersion")
    where = f"{kind} {obj.get('metadata', {}).get('name')}"
    assert isinstance(kind, str) and isinstance(api, str), f"{where}: no kind/apiVersion"
    schema = crd_schemas.SCHEMAS.get((api, kind))
    if schema is not None:
        validator = _crd_validator(api, kind)
    else:
        validator = _k8s_validator(api, kind)
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path)
        raise AssertionError(f"{where}: {path}: {error.message}")


def chart_copy(tmp: Path, *, drop_schema: bool = False) -> Path:
    """A copy of the chart under `tmp` (optionally without values.schema.json, to test the
    templates' own checks: what an install with --skip-schema-validation gets)."""
    dest = tmp / "llm-governor"
    shutil.copytree(CHART, dest)
    if drop_schema:
        (dest / "values.schema.json").unlink()
    return dest


def container(pod_spec: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    for c in pod_spec.get(key) or []:
        if c["name"] == name:
            return c
    raise AssertionError(
        f"no {key[:-1]} named {name!r} in {[c['name'] for c in pod_spec.get(key) or []]}"
    )


def arg_value(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]
