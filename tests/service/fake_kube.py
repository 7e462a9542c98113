"""A fake Kubernetes API server: a threaded HTTP server on 127.0.0.1 that follows the
published API contract for the few endpoints llm-governor uses, so the real `kubernetes`
client can be tested against it.

Implemented (JSON only):
- apps/v1 deployments/{name}/scale: GET, PUT, PATCH (merge patch; a
  metadata.resourceVersion in the body is a precondition -> 409 Conflict on mismatch);
- apps/v1 deployments/{name}: GET, PATCH (merge patch with the same precondition; a
  change of spec bumps metadata.generation and, for a pod-template change, starts a
  roll-out that stays in progress until `finish_rollout`);
- core/v1 pods: list in a namespace (any labelSelector: tests/service/fake_pods.py),
  PATCH (merge patch); a Deployment's pods are its ReplicaSet's (ownerReference,
  pod-template-hash label); a scale-down deletes pods as the ReplicaSet controller ranks
  them (fewest `controller.kubernetes.io/pod-deletion-cost` first, then the newest), a
  scale-up adds pods; `add_pod` adds one of no Deployment;
- autoscaling/v2 horizontalpodautoscalers: list in a namespace;
- core/v1 configmaps: GET, PUT (resourceVersion precondition when given), POST (409
  AlreadyExists), validated as the API server's `ValidateConfigMap` does: the values of
  `data` (bytes of the UTF-8 string) and of `binaryData` (decoded bytes; base64 on the
  wire) may total at most 1 MiB (`MaxSecretSize`, 1,048,576 bytes; keys do not count), a
  key may not be in both, a binaryData value must be valid base64 -> 422 Invalid with
  the API server's message otherwise; LIST in a namespace
  (`fieldSelector=metadata.name=NAME`, the list's resourceVersion) and WATCH as the API
  server does it (`watch=true`): from a given `resourceVersion`, every later ADDED /
  MODIFIED / DELETED event in order, then new ones as they happen, until
  `timeoutSeconds`, when the server ends the stream; without a resourceVersion, ADDED
  for each existing object first; a resourceVersion older than the retained event
  history answers an ERROR event carrying a 410 Gone Status ("too old resource
  version"); `allowWatchBookmarks=true` gets a BOOKMARK with the current resourceVersion
  at the end of each stream. `compact_configmap_history()` drops the history (what etcd
  compaction does), `delete_configmap` deletes;
- coordination.k8s.io/v1 leases: GET, PUT (resourceVersion precondition), POST.

Every write bumps a cluster-wide resourceVersion counter, like etcd's revision. Missing
objects answer 404 with a Status body. Fault injection: `inject(method, path_part,
status, times)` answers the next matching requests with `status` (e.g. 409, 500), or
with status "timeout": hold the request for `timeout_delay_s` and then fail it without
applying anything (the client has given up by then), or with status "garbage": a 200
whose body is an HTML page, not an API object (what a misrouting proxy answers), of
content type `content_type` (default `text/html`). `hold(method, path_part, times)`
makes the API slow on cue: the next matching requests wait until the test sets the
returned `Hold`'s `release` event (`arrived` is set when one comes in), then are served
as usual.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from tests.service import fake_pods as fp

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
CONFIGMAP_MAX_BYTES = 1024 * 1024
"""`MaxSecretSize` of the API server's core validation: the most `data` + `binaryData`
of one ConfigMap (or Secret) may hold, bytes of the values."""
HOLD_MAX_S = 30.0
"""The longest a held request waits for its `release`, seconds (a test that forgets to
release one fails instead of hanging)."""


@dataclass
class Hold:
    """A slow API on cue: `arrived` is set when a held request comes in; the requests
    are served once the test sets `release`."""

    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class Fault:
    method: str
    path_part: str
    status: int | str
    times: int
    content_type: str = "text/html"  # of a "garbage" answer
    hold: Hold | None = None  # status "hold"


DEFAULT_STRATEGY = {
    "type": "RollingUpdate",
    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
}
"""A Deployment's spec.strategy after the API server's defaulting (apps/v1)."""


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def configmap_problem(obj: dict[str, Any]) -> str | None:
    """Why the API server's `ValidateConfigMap` refuses `obj`, or None: the values of
    `data` and (decoded) `binaryData` total over `CONFIGMAP_MAX_BYTES`, a key in both, or
    a binaryData value that is not base64."""
    name = (obj.get("metadata") or {}).get("name", "")
    data = obj.get("data") or {}
    binary = obj.get("binaryData") or {}
    total = 0
    for key, value in data.items():
        if key in binary:
            return (
                f'ConfigMap "{name}" is invalid: data[{key}]: duplicate of key present in '
                "binaryData"
            )
        total += len(str(value).encode())
    for key, value in binary.items():
        try:
            total += len(base64.b64decode(str(value), validate=True))
        except binascii.Error:
            return f'ConfigMap "{name}" is invalid: binaryData[{key}]: illegal base64 data'
    if total > CONFIGMAP_MAX_BYTES:
        return (
            f'ConfigMap "{name}" is invalid: []: Too long: may not be more than '
            f"{CONFIGMAP_MAX_BYTES} bytes"
        )
    return None


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch."""
    out = copy.deepcopy(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class FakeKubeAPI:
    """Start with `with FakeKubeAPI() as api:`; `api.url` is the host for the client."""

    def __init__(self, timeout_delay_s: float = 1.0) -> None:
        self.timeout_delay_s = timeout_delay_s
        self._lock = threading.RLock()
        self._rv = 100
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        self.hpas: dict[str, list[dict[str, Any]]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted_pods: list[str] = []
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []
        # configmap events (resourceVersion, type, object) since `_cm_compacted`
        self._cm_events: list[tuple[int, str, dict[str, Any]]] = []
        self._cm_compacted = 0
        self._cm_changed = threading.Condition(self._lock)
        self.watches = 0  # configmap WATCH requests served
        self.send_bookmarks = True  # the API server may send them, or not
        self._closing = False
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"null") if n else None

            def _send(self, code: int, obj: Any, ctype: str = "application/json") -> None:
                data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: Any) -> None:
                """A watch answer: one JSON event per line, until the events end."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in events:
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def _handle(self, method: str) -> None:
                path, _, query = self.path.partition("?")
                body = self._body() if method in ("PUT", "POST", "PATCH") else None
                with api._lock:
                    api.requests.append(
                        (method, path + ("?watch" if "watch=true" in query else ""))
                    )
                fault = api._take_fault(method, path)
                if fault is not None and fault.hold is not None:
                    fault.hold.arrived.set()
                    fault.hold.release.wait(HOLD_MAX_S)
                    fault = None  # then served as usual
                if fault is not None:
                    if fault.status == "timeout":
                        time.sleep(api.timeout_delay_s)
                        self._send(504, _status(504, "Timeout", "injected timeout"))
                        return
                    if fault.status == "garbage":
                        self._send(200, b"<html>proxy login</html>", fault.content_type)
                        return
                    code = int(fault.status)
                    reason = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable"}
                    self._send(code, _status(code, reason.get(code, "Injected"), "injected"))
                    return
                ctype = self.headers.get("Content-Type", "")
                watch = re.fullmatch(r"/api/v1/namespaces/([^/]+)/configmaps", path)
                if method == "GET" and watch and "watch=true" in query:
                    self._stream(api._watch_configmaps(watch.group(1), parse_qs(query)))
                    return
                code, obj = api._route(method, path, body, ctype, query)
                self._send(code, obj)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._closing = True
            for f in self.faults:
                if f.hold is not None:
                    f.hold.release.set()
            self._cm_changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ test controls
    def inject(
        self,
        method: str,
        path_part: str,
        status: int | str,
        times: int = 1,
        content_type: str = "text/html",
    ) -> None:
        """Answer the next `times` matching requests with `status` (see module doc);
        `content_type`: of a "garbage" answer."""
        with self._lock:
            self.faults.append(Fault(method, path_part, status, times, content_type))

    def hold(self, method: str, path_part: str, times: int = 1) -> Hold:
        """Hold the next `times` matching requests until the returned `release` is set
        (at most `HOLD_MAX_S` seconds), then serve them as usual."""
        held = Hold()
        with self._lock:
            self.faults.append(Fault(method, path_part, "hold", times, hold=held))
        return held

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.method == method and f.path_part in path and f.times > 0:
                    f.times -= 1
                    return f
        return None

    def count(self, method: str, path_part: str = "") -> int:
        with self._lock:
            return sum(1 for m, p in self.requests if m == method and path_part in p)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def add_deployment(
        self,
        namespace: str,
        name: str,
        replicas: int,
        labels: dict[str, str] | None = None,
        selector: dict[str, Any] | None = None,
        strategy: dict[str, Any] | None = None,
    ) -> None:
        """A Deployment whose pods carry `labels` (default app=<name>); `selector`: its
        spec.selector as the API writes it (default matchLabels: `labels`); `strategy`:
        its spec.strategy (default as the API server's defaulting writes it:
        RollingUpdate, maxSurge and maxUnavailable 25 %)."""
        labels = dict(labels or {"app": name})
        with self._lock:
            self.deployments[(namespace, name)] = {
                "replicas": replicas,
                "rv": self._next_rv(),
                "generation": 1,
                "observed_generation": 1,
                "updated": replicas,
                "labels": labels,
                "selector": {"matchLabels": labels} if selector is None else selector,
                "annotations": {},
                "strategy": copy.deepcopy(strategy or DEFAULT_STRATEGY),
            }
            for _ in range(replicas):
                self._add_pod(namespace, name)

    def _add_pod(self, ns: str, deployment: str) -> None:
        d = self.deployments[(ns, deployment)]
        seq = d["pod_seq"] = d.get("pod_seq", 0) + 1
        name = f"{deployment}-{seq}"
        labels = {**d["labels"], fp.POD_TEMPLATE_HASH: fp.template_hash(deployment)}
        owner = fp.replicaset_of(deployment)
        self.pods[(ns, name)] = fp.pod_object(ns, name, labels, self._next_rv(), seq, owner)

    def add_pod(
        self, namespace: str, name: str, labels: dict[str, str], owner: str | None = None
    ) -> None:
        """A pod of no Deployment here: bare, or controlled by ReplicaSet `owner`."""
        with self._lock:
            rv = self._next_rv()
            self.pods[(namespace, name)] = fp.pod_object(namespace, name, labels, rv, 0, owner)

    def pods_of(self, namespace: str, deployment: str) -> list[str]:
        """Names of the Deployment's pods (its ReplicaSet's), sorted."""
        owner = fp.replicaset_of(deployment)
        with self._lock:
            pods = self.pods.items()
            return sorted(n for (ns, n), p in pods if ns == namespace and fp.owned_by(p, owner))

    def _resize(self, ns: str, deployment: str, replicas: int) -> None:
        """The ReplicaSet controller's part: delete the lowest pod-deletion-cost pods first
        (then the newest), or add pods."""
        pods = self.pods_of(ns, deployment)
        for _ in range(replicas - len(pods)):
            self._add_pod(ns, deployment)

        def rank(name: str) -> tuple[int, int]:
            meta = self.pods[(ns, name)]["metadata"]
            cost = int(meta["annotations"].get(DELETION_COST, "0"))
            return (cost, -int(name.rsplit("-", 1)[1]))  # newer first on equal cost

        for name in sorted(pods, key=rank)[: max(0, len(pods) - replicas)]:
            del self.pods[(ns, name)]
            self.deleted_pods.append(name)

    def scale_to(self, namespace: str, name: str, replicas: int) -> None:
        """Another writer (e.g. KEDA's HPA) sets the Deployment's replicas."""
        with self._lock:
            d = self.deployments[(namespace, name)]
            d.update(replicas=replicas, rv=self._next_rv())
            d["updated"] = min(d["updated"], replicas)
            self._resize(namespace, name, replicas)

    def set_available(self, namespace: str, name: str, available: int | None) -> None:
        """`available` of the Deployment's pods are ready (e.g. the rest of a scale-up
        still loading the model); None: all of them."""
        with self._lock:
            d = self.deployments[(namespace, name)]
            if available is None:
                d.pop("available", None)
            else:
                d["available"] = available
            d["rv"] = self._next_rv()

    def set_strategy(self, namespace: str, name: str, strategy: dict[str, Any]) -> None:
        """The Deployment's spec.strategy is edited (e.g. `kubectl edit`)."""
        with self._lock:
            d = self.deployments[(namespace, name)]
            d.update(strategy=copy.deepcopy(strategy), rv=self._next_rv())

    def template_annotations(self, namespace: str, name: str) -> dict[str, str]:
        with self._lock:
            return dict(self.deployments[(namespace, name)]["annotations"])

    def start_rollout(self, namespace: str, name: str) -> None:
        """Someone else (e.g. `kubectl rollout restart`) started a roll-out."""
        with self._lock:
            d = self.deployments[(namespace, name)]
            d["generation"] += 1
            d["updated"] = 0
            d["rv"] = self._next_rv()

    def finish_rollout(self, namespace: str, name: str) -> None:
        """The Deployment controller finished the roll-out: every pod updated."""
        with self._lock:
            d = self.deployments[(namespace, name)]
            d["observed_generation"] = d["generation"]
            d["updated"] = d["replicas"]
            d["rv"] = self._next_rv()

    def rollout_in_progress(self, namespace: str, name: str) -> bool:
        with self._lock:
            d = self.deployments[(namespace, name)]
            return d["observed_generation"] < d["generation"] or d["updated"] < d["replicas"]

    def replicas(self, namespace: str, name: str) -> int:
        with self._lock:
            return int(self.deployments[(namespace, name)]["replicas"])

    def add_hpa(self, namespace: str, name: str, deployment: str, kind: str = "Deployment") -> None:
        with self._lock:
            self.hpas.setdefault(namespace, []).append(
                {
                    "apiVersion": "autoscaling/v2",
                    "kind": "HorizontalPodAutoscaler",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {
                        "scaleTargetRef": {
                            "apiVersion": "apps/v1",
                            "kind": kind,
                            "name": deployment,
                        },
                        "minReplicas": 1,
                        "maxReplicas": 10,
                    },
                }
            )

    def edit_configmap(self, namespace: str, name: str, data: dict[str, str]) -> str:
        """What `kubectl apply` / Helm does: replace the data (creating the ConfigMap if
        needed), bumping its resourceVersion. Returns the new resourceVersion."""
        with self._lock:
            cm = self.configmaps.get((namespace, name)) or {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace},
            }
            cm = copy.deepcopy(cm)
            cm["data"] = dict(data)
            kind = "MODIFIED" if (namespace, name) in self.configmaps else "ADDED"
            cm["metadata"]["resourceVersion"] = self._next_rv()
            self.configmaps[(namespace, name)] = cm
            self._cm_event(kind, cm)
            return str(cm["metadata"]["resourceVersion"])

    def delete_configmap(self, namespace: str, name: str) -> None:
        """What `kubectl delete configmap` does (a DELETED event for watchers)."""
        with self._lock:
            cm = self.configmaps.pop((namespace, name))
            cm = copy.deepcopy(cm)
            cm["metadata"]["resourceVersion"] = self._next_rv()
            self._cm_event("DELETED", cm)

    def compact_configmap_history(self) -> None:
        """Forget the event history (etcd compaction): a watch from an older
        resourceVersion is answered 410 Gone from now on."""
        with self._lock:
            self._cm_events.clear()
            self._cm_compacted = self._rv

    # ------------------------------------------------------------------ configmap watch
    def _cm_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            rv = int(obj["metadata"]["resourceVersion"])
            self._cm_events.append((rv, kind, copy.deepcopy(obj)))
            self._cm_changed.notify_all()

    @staticmethod
    def _selected(obj: dict[str, Any], ns: str, q: dict[str, list[str]]) -> bool:
        meta = obj.get("metadata") or {}
        if meta.get("namespace") != ns:
            return False
        for sel in (q.get("fieldSelector") or [""])[0].split(","):
            key, _, value = sel.partition("=")
            if key == "metadata.name" and meta.get("name") != value:
                return False
        return True

    def _list_configmaps(self, ns: str, q: dict[str, list[str]]) -> dict[str, Any]:
        items = [copy.deepcopy(c) for c in self.configmaps.values() if self._selected(c, ns, q)]
        return {
            "apiVersion": "v1",
            "kind": "ConfigMapList",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _watch_configmaps(self, ns: str, q: dict[str, list[str]]) -> Any:
        """The events of one watch request (a generator: it waits for new ones)."""
        timeout_s = float((q.get("timeoutSeconds") or ["1800"])[0])
        deadline = time.monotonic() + timeout_s
        rv_text = (q.get("resourceVersion") or [""])[0]
        with self._lock:
            self.watches += 1
            if rv_text in ("", "0"):
                pending = [
                    {"type": "ADDED", "object": copy.deepcopy(c)}
                    for c in self.configmaps.values()
                    if self._selected(c, ns, q)
                ]
                last = self._rv
            elif int(rv_text) < self._cm_compacted:
                gone = _status(410, "Expired", f"too old resource version: {rv_text}")
                pending, last = [{"type": "ERROR", "object": gone}], None
            else:
                pending, last = [], int(rv_text)
        yield from pending
        while last is not None:
            with self._lock:
                events = [e for e in self._cm_events if e[0] > last]
                if not events:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closing:
                        break
                    self._cm_changed.wait(min(left, 0.5))
                    continue
            for rv, kind, obj in events:
                last = rv
                if self._selected(obj, ns, q):
                    yield {"type": kind, "object": copy.deepcopy(obj)}
        bookmarks = (q.get("allowWatchBookmarks") or ["false"])[0] == "true"
        if last is not None and bookmarks and self.send_bookmarks:
            meta = {"resourceVersion": str(self._rv)}
            yield {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": meta}}

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self.leases.get((namespace, name)))

    # ------------------------------------------------------------------ routing
    def _route(
        self, method: str, path: str, body: Any, ctype: str, query: str = ""
    ) -> tuple[int, Any]:
        with self._lock:
            m = re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)/scale", path)
            if m:
                return self._scale(method, m.group(1), m.group(2), body, ctype)
            m = re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)", path)
            if m:
                return self._deployment(method, m.group(1), m.group(2), body, ctype)
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?", path)
            if m:
                return self._pods(method, m.group(1), m.group(2), body, query)
            m = re.fullmatch(
                r"/apis/autoscaling/v2/namespaces/([^/]+)/horizontalpodautoscalers", path
            )
            if m and method == "GET":
                return 200, {
                    "apiVersion": "autoscaling/v2",
                    "kind": "HorizontalPodAutoscalerList",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": copy.deepcopy(self.hpas.get(m.group(1), [])),
                }
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?", path)
            if m:
                ns, name = m.group(1), m.group(2)
                if method == "GET" and name is None:
                    return 200, self._list_configmaps(ns, parse_qs(query))
                problem = configmap_problem(body or {}) if method in ("PUT", "POST") else None
                if problem is not None:
                    return 422, _status(422, "Invalid", problem)
                code, obj = self._object(self.configmaps, "ConfigMap", method, ns, name, body)
                if code in (200, 201) and method in ("PUT", "POST"):
                    self._cm_event("ADDED" if method == "POST" else "MODIFIED", obj)
                return code, obj
            m = re.fullmatch(
                r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?", path
            )
            if m:
                return self._object(self.leases, "Lease", method, m.group(1), m.group(2), body)
            return 404, _status(404, "NotFound", f"no route for {method} {path}")

    def _scale_obj(self, ns: str, name: str) -> dict[str, Any]:
        d = self.deployments[(ns, name)]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": d["rv"]},
            # ScaleSpec.replicas is `omitempty`: the API server leaves it out at 0
            "spec": {"replicas": d["replicas"]} if d["replicas"] else {},
            "status": {"replicas": d["replicas"]},
        }

    def _scale(self, method: str, ns: str, name: str, body: Any, ctype: str) -> tuple[int, Any]:
        if (ns, name) not in self.deployments:
            return 404, _status(404, "NotFound", f'deployments.apps "{name}" not found')
        current = self._scale_obj(ns, name)
        if method == "GET":
            return 200, current
        if method == "PATCH":
            if "json-patch" in ctype:
                return 415, _status(415, "UnsupportedMediaType", "use a merge patch")
            new = _merge(current, body or {})
        elif method == "PUT":
            new = body or {}
        else:
            return 405, _status(405, "MethodNotAllowed", method)
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            return 409, _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on deployments.apps "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        replicas = (new.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            return 422, _status(422, "Invalid", f"spec.replicas: invalid value {replicas!r}")
        d = self.deployments[(ns, name)]
        old = d["replicas"]
        d.update(replicas=replicas, rv=self._next_rv())
        if "labels" in d:
            d["updated"] = (
                min(d["updated"], replicas) if replicas < old else d["updated"] + (replicas - old)
            )
            self._resize(ns, name, replicas)
        return 200, self._scale_obj(ns, name)

    def _deployment_obj(self, ns: str, name: str) -> dict[str, Any]:
        d = self.deployments[(ns, name)]
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": ns,
                "resourceVersion": d["rv"],
                "generation": d["generation"],
            },
            "spec": {
                "replicas": d["replicas"],
                "selector": copy.deepcopy(d["selector"]),
                "strategy": copy.deepcopy(d["strategy"]),
                "template": {
                    "metadata": {
                        "labels": dict(d["labels"]),
                        "annotations": dict(d["annotations"]),
                    },
                    "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
                },
            },
            "status": {
                "observedGeneration": d["observed_generation"],
                "replicas": d["replicas"],
                "updatedReplicas": d["updated"],
                "readyReplicas": d.get("available", d["replicas"]),
                "availableReplicas": d.get("available", d["replicas"]),
            },
        }

    def _deployment(
        self, method: str, ns: str, name: str, body: Any, ctype: str
    ) -> tuple[int, Any]:
        if (ns, name) not in self.deployments or "labels" not in self.deployments[(ns, name)]:
            return 404, _status(404, "NotFound", f'deployments.apps "{name}" not found')
        current = self._deployment_obj(ns, name)
        if method == "GET":
            return 200, current
        if method != "PATCH":
            return 405, _status(405, "MethodNotAllowed", method)
        if "json-patch" in ctype:
            return 415, _status(415, "UnsupportedMediaType", "use a merge patch")
        new = _merge(current, body or {})
        rv = (new.get("metadata") or {}).get("resourceVersion")
        if rv != current["metadata"]["resourceVersion"]:
            return 409, _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on deployments.apps "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        d = self.deployments[(ns, name)]
        annotations = new["spec"]["template"]["metadata"].get("annotations") or {}
        if annotations != d["annotations"]:
            d["annotations"] = dict(annotations)
            d["generation"] += 1
            d["updated"] = 0  # a new ReplicaSet: no pod updated yet
        d["rv"] = self._next_rv()
        return 200, self._deployment_obj(ns, name)

    def _pods(
        self, method: str, ns: str, name: str | None, body: Any, query: str
    ) -> tuple[int, Any]:
        if name is None and method == "GET":
            selector = (parse_qs(query).get("labelSelector") or [""])[0]
            try:
                items = [
                    copy.deepcopy(pod)
                    for (pns, _), pod in sorted(self.pods.items())
                    if pns == ns and fp.selector_matches(selector, pod["metadata"]["labels"])
                ]
            except ValueError as exc:
                return 400, _status(400, "BadRequest", str(exc))
            meta = {"resourceVersion": str(self._rv)}
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": meta, "items": items}
        if name is None or (ns, name) not in self.pods:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if method != "PATCH":
            return 405, _status(405, "MethodNotAllowed", method)
        pod = _merge(self.pods[(ns, name)], body or {})
        pod["metadata"]["resourceVersion"] = self._next_rv()
        self.pods[(ns, name)] = pod
        return 200, copy.deepcopy(pod)

    def _object(
        self,
        store: dict[tuple[str, str], dict[str, Any]],
        kind: str,
        method: str,
        ns: str,
        name: str | None,
        body: Any,
    ) -> tuple[int, Any]:
        plural = kind.lower() + "s"
        if method == "POST" and name is None:
            obj = copy.deepcopy(body or {})
            oname = (obj.get("metadata") or {}).get("name")
            if not oname:
                return 422, _status(422, "Invalid", "metadata.name: Required value")
            if (ns, oname) in store:
                return 409, _status(409, "AlreadyExists", f'{plural} "{oname}" already exists')
            obj.setdefault("metadata", {})["namespace"] = ns
            obj["metadata"]["resourceVersion"] = self._next_rv()
            store[(ns, oname)] = obj
            return 201, copy.deepcopy(obj)
        if name is None:
            return 405, _status(405, "MethodNotAllowed", method)
        current = store.get((ns, name))
        if method == "GET":
            if current is None:
                return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
            return 200, copy.deepcopy(current)
        if method == "PUT":
            if current is None:
                return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
            obj = copy.deepcopy(body or {})
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            obj.setdefault("metadata", {})["namespace"] = ns
            obj["metadata"]["name"] = name
            obj["metadata"]["resourceVersion"] = self._next_rv()
            store[(ns, name)] = obj
            return 200, copy.deepcopy(obj)
        return 405, _status(405, "MethodNotAllowed", method)
