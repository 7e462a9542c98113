"""Pods for `FakeKubeAPI` (tests/service/fake_kube.py), following the published API
contract: the objects a Deployment's ReplicaSet creates, and label selectors as a pod
list's `labelSelector` parameter takes them.

A Deployment's ReplicaSet is named `<deployment>-<pod-template-hash>`; its pods carry
the label `pod-template-hash=<hash>` and an ownerReference to it (controller: true).

Label-selector syntax (apimachinery's `labels.Parse`), requirements joined by commas:
`k=v` / `k==v` (k has value v), `k!=v` (k absent or another value), `k in (a,b)` (k
has one of the values), `k notin (a,b)` (k absent or none of them), `k` (k present),
`!k` (k absent). The empty selector selects every pod. Anything else: ValueError (the
API server answers 400).
"""

from __future__ import annotations

import re
import zlib
from typing import Any

POD_TEMPLATE_HASH = "pod-template-hash"
_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET = re.compile(rf"({_KEY})\s+(in|notin)\s+\(([^()]*)\)")
_EQ = re.compile(rf"({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)")
_EXISTS = re.compile(rf"(!?)\s*({_KEY})")


def template_hash(deployment: str) -> str:
    """The pod-template-hash of a Deployment's (only) ReplicaSet in the fake."""
    return format(zlib.crc32(deployment.encode()), "x")


def replicaset_of(deployment: str) -> str:
    """The name of that ReplicaSet, as the Deployment controller names it."""
    return f"{deployment}-{template_hash(deployment)}"


def pod_object(
    namespace: str, name: str, labels: dict[str, str], rv: str, seq: int, owner: str | None
) -> dict[str, Any]:
    """A running pod; `owner`: the ReplicaSet that controls it (None: a bare pod)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "annotations": {},
        "resourceVersion": rv,
        "creationTimestamp": f"2026-01-01T00:00:{seq % 60:02d}Z",
    }
    if owner is not None:
        ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": owner}
        meta["ownerReferences"] = [{**ref, "controller": True, "blockOwnerDeletion": True}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
        "status": {"phase": "Running"},
    }


def owned_by(pod: dict[str, Any], replicaset: str) -> bool:
    """Whether ReplicaSet `replicaset` controls `pod`."""
    refs = pod["metadata"].get("ownerReferences") or []
    return any(r["kind"] == "ReplicaSet" and r["name"] == replicaset for r in refs)


def _requirements(selector: str) -> list[str]:
    """The selector split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    return [p.strip() for p in parts]


def _matches_one(req: str, labels: dict[str, str]) -> bool:
    if m := _SET.fullmatch(req):
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        return (labels.get(key) in values) == (op == "in")
    if m := _EQ.fullmatch(req):
        key, op, value = m.groups()
        return (labels.get(key) == value) == (op != "!=")
    if m := _EXISTS.fullmatch(req):
        return (m.group(2) in labels) == (m.group(1) == "")
    raise ValueError(f"unable to parse requirement: {req!r}")


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Whether `labels` satisfy every requirement of `selector` (see module doc)."""
    if not selector.strip():
        return True
    return all(_matches_one(req, labels) for req in _requirements(selector))
