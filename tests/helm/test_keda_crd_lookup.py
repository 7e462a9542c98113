"""The chart's `lookup` of the KEDA ScaledObject CRD, against an API server.

Helm's `lookup` returns an empty object only when the API answers NotFound; any other
error, a 403 Forbidden for a user without cluster-scoped `get` on customresourcedefinitions
included, fails the render. scaling.keda.lookupCRD=false makes no lookup at all.

The chart is rendered cluster-aware by the real Helm library (helm.Config.render: only
`lookup` contacts the API server) against a stand-in API server on 127.0.0.1 that serves
the discovery document `lookup` needs and answers the CRD itself as configured.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.helm.chart import CHART, NAMESPACE, RELEASE, find, helm, parse, values

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/scaledobjects.keda.sh"
_DISCOVERY = {
    "kind": "APIResourceList",
    "apiVersion": "v1",
    "groupVersion": "apiextensions.k8s.io/v1",
    "resources": [
        {
            "name": "customresourcedefinitions",
            "singularName": "customresourcedefinition",
            "namespaced": False,
            "kind": "CustomResourceDefinition",
            "verbs": ["get", "list", "watch"],
        }
    ],
}


def _keda_crd() -> dict[str, Any]:
    """The part of a KEDA >= 2.18 scaledobjects.keda.sh that the chart reads: fallback's
    `behavior` (>= 2.15) and the HPA scaling rules' `tolerance` (>= 2.18)."""
    rules = {"properties": {"tolerance": {"x-kubernetes-int-or-string": True}}}
    hpa = {"properties": {"behavior": {"properties": {"scaleUp": rules}}}}
    spec = {
        "properties": {
            "fallback": {"properties": {"behavior": {"type": "string"}}},
            "advanced": {"properties": {"horizontalPodAutoscalerConfig": hpa}},
        }
    }
    schema = {"openAPIV3Schema": {"properties": {"spec": spec}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "scaledobjects.keda.sh"},
        "spec": {"versions": [{"name": "v1alpha1", "schema": schema}]},
    }


@contextmanager
def api_server(crd: dict[str, Any] | None) -> Iterator[tuple[str, list[str]]]:
    """(URL, paths requested) of a stand-in API server: the CRD is `crd`, or 403 Forbidden
    when None (a user without `get` on customresourcedefinitions)."""
    requested: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            requested.append(path)
            if path == "/apis/apiextensions.k8s.io/v1":
                code, body = 200, _DISCOVERY
            elif path == CRD_PATH and crd is not None:
                code, body = 200, crd
            else:
                code, body = (
                    403,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": "Forbidden",
                        "code": 403,
                        "message": f"forbidden: cannot get {path}",
                    },
                )
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def render_against(url: str, vals: dict[str, Any]) -> list[dict[str, Any]]:
    with (
        helm.Config(kube_apiserver=url, namespace=NAMESPACE) as cfg,
        helm.Chart.load(str(CHART)) as chart,
    ):
        files = cfg.render(chart, vals, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return parse(files)


def test_forbidden_crd_read_fails_the_install_unless_the_lookup_is_off() -> None:
    with api_server(crd=None) as (url, requested):
        with pytest.raises(helm.HelmError, match="forbidden"):
            render_against(url, values())
        assert CRD_PATH in requested
        requested.clear()
        objs = render_against(url, values(scaling={"keda": {"lookupCRD": False}}))
        assert requested == [], "scaling.keda.lookupCRD=false still called the API server"
    scaled = find(objs, "ScaledObject")
    assert scaled
    for so in scaled:
        # As with `helm template`: behavior rendered unchecked, tolerance left out.
        assert so["spec"]["fallback"]["behavior"] == "currentReplicasIfHigher"
        behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert "tolerance" not in behavior["scaleUp"]


def test_readable_crd_is_used_by_default() -> None:
    """Not vacuous: with the right to read it, the default lookup reads the CRD and
    zeroTolerance=auto renders the tolerance a KEDA >= 2.18 CRD has."""
    with api_server(crd=_keda_crd()) as (url, requested):
        objs = render_against(url, values())
    assert CRD_PATH in requested
    for so in find(objs, "ScaledObject"):
        behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleUp"]["tolerance"] == "0"
