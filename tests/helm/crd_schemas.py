"""JSON schemas for the custom resources the chart renders, which kubernetes-validate does
not ship: KEDA's ScaledObject and TriggerAuthentication (keda.sh/v1alpha1) and the
Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule
(monitoring.coreos.com/v1).

Written for this project from the field names and types of those CRDs (KEDA 2.16+,
prometheus-operator 0.7x+), covering the fields the chart uses and closed
(`additionalProperties: false`) everywhere, so a misspelt or misplaced field fails the
same way the API server's structural-schema pruning would silently drop it. Enums and
ranges are the CRDs' own (e.g. HPA scaling-policy periodSeconds 1..1800).
"""

from __future__ import annotations

from typing import Any

import jsonschema

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Prometheus duration (model.Duration), e.g. 30s, 5m, 1h30m.
DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)

STRING_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}

OBJECT_META: dict[str, Any] = {
    "type": "object",
    "required": ["name", "namespace"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": DNS_SUBDOMAIN, "maxLength": 63},
        "namespace": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

LABEL_SELECTOR: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}

# autoscaling/v2 HorizontalPodAutoscalerBehavior, as KEDA's CRD embeds it.
_SCALING_RULES: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["type", "value", "periodSeconds"],
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "exclusiveMinimum": 0},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
            },
        },
        # Kubernetes >= 1.33 (HPAConfigurableTolerance); a Quantity. In KEDA's CRD from
        # 2.18 on (SCALED_OBJECT_KEDA_2_17 below lacks it).
        "tolerance": {"type": ["string", "number"], "pattern": r"^[0-9]+(\.[0-9]+)?$"},
    },
}

SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string", "pattern": DNS_SUBDOMAIN},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {
                        "failureThreshold": {"type": "integer", "minimum": 1},
                        "replicas": {"type": "integer", "minimum": 0},
                        # KEDA >= 2.15
                        "behavior": {
                            "enum": [
                                "static",
                                "currentReplicas",
                                "currentReplicasIfHigher",
                                "currentReplicasIfLower",
                            ]
                        },
                    },
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "scaleUp": _SCALING_RULES,
                                        "scaleDown": _SCALING_RULES,
                                    },
                                },
                            },
                        },
                        "scalingModifiers": {"type": "object"},
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string", "minLength": 1},
                            "name": {"type": "string"},
                            # KEDA's trigger metadata is map[string]string: a number or a
                            # bool here is refused by the API server.
                            "metadata": STRING_MAP,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string", "pattern": DNS_SUBDOMAIN},
                                    "kind": {
                                        "enum": [
                                            "TriggerAuthentication",
                                            "ClusterTriggerAuthentication",
                                        ]
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

SERVICE_MONITOR: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "jobLabel": {"type": "string"},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}

POD_MONITOR: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "selector": LABEL_SELECTOR,
                "namespaceSelector": SERVICE_MONITOR["properties"]["spec"]["properties"][
                    "namespaceSelector"
                ],
                "jobLabel": {"type": "string"},
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}

_RULE: dict[str, Any] = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    # Exactly one of record / alert.
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
    "properties": {
        "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
        "alert": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"},
        "expr": {"type": "string", "minLength": 1},
        "for": {"type": "string", "pattern": DURATION},
        "keep_firing_for": {"type": "string", "pattern": DURATION},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

PROMETHEUS_RULE: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": DURATION},
                            "rules": {"type": "array", "items": _RULE},
                        },
                    },
                },
            },
        },
    },
}


def _without_tolerance(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_tolerance(v) for k, v in node.items() if k != "tolerance"}
    if isinstance(node, list):
        return [_without_tolerance(v) for v in node]
    return node


# KEDA 2.17's ScaledObject: its HPA scaling rules have no `tolerance` (added in 2.18); the
# API server's strict field validation (Helm 4) refuses the field there.
SCALED_OBJECT_KEDA_2_17: dict[str, Any] = _without_tolerance(SCALED_OBJECT)

TRIGGER_AUTHENTICATION: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "TriggerAuthentication"},
        "metadata": OBJECT_META,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["parameter", "name", "key"],
                        "additionalProperties": False,
                        "properties": {
                            "parameter": {"type": "string", "minLength": 1},
                            "name": {"type": "string", "pattern": DNS_SUBDOMAIN},
                            "key": {"type": "string", "minLength": 1},
                        },
                    },
                },
            },
        },
    },
}

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): TRIGGER_AUTHENTICATION,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)
