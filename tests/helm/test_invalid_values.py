"""Bad values fail at install with a message that names the value: through
values.schema.json (what `helm install` checks first) and, for an install that skips the
schema (--skip-schema-validation), through the templates' own checks (_validate.tpl).
Checks a JSON schema cannot express (min <= max, uniqueness, cross-references) live only in
the templates and fail either way."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import (
    CHART,
    MODEL_8B,
    MODEL_CODE,
    chart_copy,
    helm,
    render_files,
    values,
)


def _without(model: dict[str, Any], key: str) -> dict[str, Any]:
    out = copy.deepcopy(model)
    del out[key]
    return out


def _with(model: dict[str, Any], **kw: Any) -> dict[str, Any]:
    out = copy.deepcopy(model)
    out.update(kw)
    return out


# id -> (values, fragment the schema's message has, fragment the template's message has).
# A None schema fragment: the schema cannot express it, the template check answers both.
CASES: dict[str, tuple[dict[str, Any], str | None, str]] = {
    "missing-model-name": (
        values(models=[_without(MODEL_8B, "name")]),
        "missing property 'name'",
        "models[0].name: required",
    ),
    "min-greater-than-max": (
        values(models=[_with(MODEL_8B, replicas={"min_replicas": 5, "max_replicas": 2})]),
        None,
        "models[0] (meta-llama/Llama-3.1-8B-Instruct): replicas.min_replicas (5) must be <= "
        "replicas.max_replicas (2)",
    ),
    "min-greater-than-default-max": (
        values(models=[_with(MODEL_8B, replicas={"min_replicas": 12})]),
        None,
        "replicas.min_replicas (12) must be <= replicas.max_replicas (10)",
    ),
    "grpc-and-metrics-on-one-port": (
        values(ports={"grpc": 9464, "metrics": 9464}),
        None,
        "ports.grpc and ports.metrics are both 9464",
    ),
    "client-ca-without-a-secret": (
        values(tls={"clientCA": True}),
        None,
        "tls.clientCA: true needs tls.existingSecret",
    ),
    "unknown-mode": (
        values(mode="daemonset"),
        "/mode",
        "mode: must be standalone or sidecar (got daemonset)",
    ),
    "unknown-scaling": (
        values(scaling={"via": "vpa"}),
        "/scaling/via",
        "scaling.via: must be keda, kubernetes or hpa (got vpa)",
    ),
    "no-models": (values(models=[]), None, "models: at least one model is required"),
    "missing-deployment": (
        values(models=[_without(MODEL_8B, "deployment")]),
        "missing property 'deployment'",
        "deployment is required",
    ),
    "missing-sla": (
        values(models=[_without(MODEL_8B, "sla")]),
        "missing property 'sla'",
        "sla.ttft_p95_ms and sla.itl_p95_ms are required",
    ),
    "duplicate-model": (
        values(models=[MODEL_8B, _with(MODEL_CODE, name=MODEL_8B["name"])]),
        None,
        "model name appears more than once",
    ),
    "two-models-one-deployment": (
        values(models=[MODEL_8B, _with(MODEL_CODE, deployment="llama-8b")]),
        None,
        "deployment llm/llama-8b is also scaled for model meta-llama/Llama-3.1-8B-Instruct",
    ),
    "fallback-above-max": (
        values(models=[_with(MODEL_8B, fallback_replicas=40)]),
        None,
        "fallback_replicas (40) must be <= replicas.max_replicas (16)",
    ),
    "sidecar-in-engine-with-scale-to-zero": (
        values(mode="sidecar"),
        None,
        "models[1] (code-assistant): replicas.min_replicas is 0, but in sidecar mode",
    ),
    "two-replicas-without-leader-election": (
        values(leaderElection={"enabled": False}),
        None,
        "leaderElection.enabled: must be true with standalone.replicas 2",
    ),
    "pdb-blocks-every-drain": (
        values(standalone={"replicas": 1}, leaderElection={"enabled": False}),
        None,
        "standalone.podDisruptionBudget.minAvailable (1) must be < standalone.replicas (1)",
    ),
    "hpa-without-recording-rule": (
        values(scaling={"via": "hpa"}),
        None,
        "scaling.via=hpa needs monitoring.prometheusRule.enabled=true",
    ),
    "example-engine-unknown-model": (
        values(exampleEngine={"enabled": True, "model": "gpt-5"}),
        None,
        'exampleEngine.model: "gpt-5" is not the name of a model in models',
    ),
    "hpa-without-service-monitor": (
        values(scaling={"via": "hpa"}, monitoring={"prometheusRule": {"enabled": True}}),
        None,
        "scaling.via=hpa needs monitoring.serviceMonitor.enabled=true",
    ),
    "existing-serviceaccount-without-name": (
        values(serviceAccount={"create": False}),
        None,
        "serviceAccount.name: required when serviceAccount.create=false",
    ),
    "unknown-tolerance-switch": (
        values(scaling={"zeroTolerance": "yes"}),
        "/scaling/zeroTolerance",
        "scaling.zeroTolerance: must be auto, true or false (got yes)",
    ),
    "example-engine-deployment-starts-with-a-digit": (
        values(models=[_with(MODEL_8B, deployment="8b-llama")], exampleEngine={"enabled": True}),
        None,
        'exampleEngine: model meta-llama/Llama-3.1-8B-Instruct\'s deployment "8b-llama" names '
        "the example engine's Service",
    ),
    "example-engine-deployment-over-63-characters": (
        values(models=[_with(MODEL_8B, deployment="d" * 64)], exampleEngine={"enabled": True}),
        None,
        "at most 63 characters (RFC 1035); got 64 characters",
    ),
    "admin-listen-on-the-grpc-port": (
        values(governor={"adminListen": "127.0.0.1:50051"}),
        None,
        "governor.adminListen (127.0.0.1:50051) is on port 50051, which ports.grpc already "
        "takes: the governor listens on 0.0.0.0:50051",
    ),
    "admin-listen-on-the-metrics-port": (
        values(ports={"grpc": 7000, "metrics": 7001}, governor={"adminListen": "[::1]:7001"}),
        None,
        "which ports.metrics already takes",
    ),
    "admin-listen-past-the-last-port": (
        values(governor={"adminListen": "127.0.0.1:65536"}),
        "/governor/adminListen",
        "governor.adminListen: the port must be 1-65535 (got 65536",
    ),
    "admin-listen-on-port-zero": (
        values(governor={"adminListen": "127.0.0.1:0"}),
        "/governor/adminListen",
        "governor.adminListen: the port must be 1-65535 (got 0",
    ),
    "grpc-port-past-the-last-port": (
        values(ports={"grpc": 70000}),
        "/ports/grpc",
        "ports.grpc: must be a port number, 1-65535 (got 70000)",
    ),
    "zero-scrape-interval": (
        values(monitoring={"serviceMonitor": {"enabled": True, "interval": "0s"}}),
        "/monitoring/serviceMonitor/interval",
        "monitoring.serviceMonitor.interval (0s) must be longer than zero",
    ),
    "zero-sla-short-window": (
        values(monitoring={"prometheusRule": {"slaShortWindow": "0s"}}),
        "/monitoring/prometheusRule/slaShortWindow",
        "monitoring.prometheusRule.slaShortWindow: must be a Prometheus duration longer than "
        'zero, units largest first (e.g. 5m, 1h30m; got "0s")',
    ),
    "zero-sla-long-window": (
        values(monitoring={"prometheusRule": {"slaLongWindow": "0h0m"}}),
        "/monitoring/prometheusRule/slaLongWindow",
        "monitoring.prometheusRule.slaLongWindow: must be a Prometheus duration longer than "
        'zero, units largest first (e.g. 5m, 1h30m; got "0h0m")',
    ),
    "zero-actuation-gap-window": (
        values(monitoring={"prometheusRule": {"actuationGapWindow": "0m"}}),
        "/monitoring/prometheusRule/actuationGapWindow",
        "monitoring.prometheusRule.actuationGapWindow: must be a Prometheus duration longer "
        'than zero, units largest first (e.g. 5m, 1h30m; got "0m")',
    ),
    "zero-tail-window": (
        values(monitoring={"prometheusRule": {"tailWindow": "00s"}}),
        "/monitoring/prometheusRule/tailWindow",
        "which drops the whole rule group",
    ),
    "alert-window-units-out-of-order": (
        values(monitoring={"prometheusRule": {"tailWindow": "30m1h"}}),
        "/monitoring/prometheusRule/tailWindow",
        "monitoring.prometheusRule.tailWindow: must be a Prometheus duration longer than zero, "
        'units largest first (e.g. 5m, 1h30m; got "30m1h")',
    ),
    "alert-for-units-out-of-order": (
        values(monitoring={"prometheusRule": {"slaFor": "1m1h"}}),
        "/monitoring/prometheusRule/slaFor",
        "monitoring.prometheusRule.slaFor: must be a Prometheus duration, units largest first "
        '(e.g. 10m, 1h30m; 0s fires on the first evaluation that matches; got "1m1h")',
    ),
    "alert-for-a-unit-twice": (
        values(monitoring={"prometheusRule": {"actuationGapFor": "5m5m"}}),
        "/monitoring/prometheusRule/actuationGapFor",
        "monitoring.prometheusRule.actuationGapFor: must be a Prometheus duration, units "
        "largest first (e.g. 10m, 1h30m; 0s fires on the first evaluation that matches; "
        'got "5m5m")',
    ),
    "unknown-trigger-type": (
        values(scaling={"keda": {"triggerType": "prometheus"}}),
        "/scaling/keda/triggerType",
        "scaling.keda.triggerType: must be external or external-push (got prometheus)",
    ),
    "watch-streams-not-below-max-concurrent-rpcs": (
        values(governor={"maxWatchStreams": 2048}),
        None,
        "governor.maxWatchStreams (2048) must be below governor.maxConcurrentRpcs (2048)",
    ),
    "watch-streams-per-client-above-watch-streams": (
        values(governor={"maxWatchStreams": 10, "maxWatchStreamsPerClient": 11}),
        None,
        "governor.maxWatchStreamsPerClient (11) must be <= governor.maxWatchStreams (10)",
    ),
    "watch-streams-per-client-above-the-default-watch-streams": (
        values(governor={"maxConcurrentRpcs": 100, "maxWatchStreamsPerClient": 51}),
        None,
        "governor.maxWatchStreamsPerClient (51) must be <= governor.maxWatchStreams (null: "
        "the governor's default is 50, the smaller of 1024 and half of "
        "governor.maxConcurrentRpcs (100))",
    ),
    "zero-watch-streams": (
        values(governor={"maxWatchStreams": 0}),
        "/governor/maxWatchStreams",
        "governor.maxWatchStreams: must be >= 1 or null",
    ),
    "zero-watch-streams-per-client": (
        values(governor={"maxWatchStreamsPerClient": 0}),
        "/governor/maxWatchStreamsPerClient",
        "governor.maxWatchStreamsPerClient: must be >= 1 or null",
    ),
}

# Refused by the schema only (the governor would refuse them at start; the schema is
# generated from its config models).
SCHEMA_ONLY: dict[str, tuple[dict[str, Any], str]] = {
    "model-key-typo": (
        values(models=[_with(MODEL_8B, cold_start_seconds=30)]),
        "additional properties 'cold_start_seconds' not allowed",
    ),
    "zero-itl-target": (
        values(models=[_with(MODEL_8B, sla={"ttft_p95_ms": 500, "itl_p95_ms": 0})]),
        "/models/0/sla/itl_p95_ms",
    ),
    "bad-namespace": (
        values(models=[_with(MODEL_8B, namespace="LLM_Prod")]),
        "/models/0/namespace",
    ),
    "unknown-batching-policy": (
        values(models=[_with(MODEL_8B, batching_policy="fast")]),
        "/models/0/batching_policy",
    ),
    "policy-key-typo": (values(policy={"tick_interval": 5}), "'tick_interval' not allowed"),
    "chart-key-typo": (values(mdoe="sidecar"), "additional properties 'mdoe' not allowed"),
    "pdb-eviction-policy": (
        values(standalone={"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "Sometimes"}}),
        "/standalone/podDisruptionBudget/unhealthyPodEvictionPolicy",
    ),
    "scrape-timeout": (
        values(monitoring={"serviceMonitor": {"scrapeTimeout": "five seconds"}}),
        "/monitoring/serviceMonitor/scrapeTimeout",
    ),
    "admin-listen-without-port": (
        values(governor={"adminListen": "127.0.0.1"}),
        "/governor/adminListen",
    ),
    "model-policy-key-typo": (
        values(models=[_with(MODEL_8B, policy={"scale_down_stabilisation_s": 600})]),
        "additional properties 'scale_down_stabilisation_s' not allowed",
    ),
    "model-policy-global-only-key": (
        values(models=[_with(MODEL_8B, policy={"tick_interval_s": 10})]),
        "additional properties 'tick_interval_s' not allowed",
    ),
    "watch-streams-past-a-c-int": (
        values(governor={"maxConcurrentRpcs": 2**31 - 1, "maxWatchStreams": 2**31}),
        "/governor/maxWatchStreams",
    ),
    "watch-streams-per-client-past-a-c-int": (
        values(governor={"maxWatchStreamsPerClient": 2**31}),
        "/governor/maxWatchStreamsPerClient",
    ),
    "max-concurrent-rpcs-past-a-c-int": (
        values(governor={"maxConcurrentRpcs": 2**31}),
        "/governor/maxConcurrentRpcs",
    ),
    "admin-listen-with-a-five-digit-port": (
        values(governor={"adminListen": "127.0.0.1:99999"}),
        "/governor/adminListen",
    ),
    # a health service the governor does not serve: the probe never passes
    "readiness-probe-of-an-unknown-service": (
        values(probes={"readiness": {"service": "externalscaler.ExternalScalar"}}),
        "/probes/readiness/service",
    ),
    # unquoted: the alert's PromQL does not parse and the whole rule group fails to load
    "kube-state-metrics-selector-unquoted": (
        values(monitoring={"prometheusRule": {"kubeStateMetricsSelector": "job=ksm"}}),
        "/monitoring/prometheusRule/kubeStateMetricsSelector",
    ),
    "kube-state-metrics-selector-with-a-brace": (
        values(monitoring={"prometheusRule": {"kubeStateMetricsSelector": 'job="k"} or up{'}}),
        "/monitoring/prometheusRule/kubeStateMetricsSelector",
    ),
}


@pytest.fixture(scope="module")
def schemaless_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chart_copy(tmp_path_factory.mktemp("chart"), drop_schema=True)


def _error(
    vals: dict[str, Any], chart: Path | None = None, namespace: str = "llm", name: str = "gov"
) -> str:
    kw: dict[str, Any] = {"namespace": namespace, "name": name}
    if chart is not None:
        kw["chart"] = chart
    with pytest.raises(helm.HelmError) as err:
        render_files(vals, **kw)
    return str(err.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_at_install_with_a_message(case: str) -> None:
    vals, schema_msg, template_msg = CASES[case]
    message = _error(vals)
    assert (schema_msg or template_msg) in message, message


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_by_the_templates_when_the_schema_is_skipped(
    case: str, schemaless_chart: Path
) -> None:
    vals, _, template_msg = CASES[case]
    message = _error(vals, chart=schemaless_chart)
    assert template_msg in message, message


@pytest.mark.parametrize("case", sorted(SCHEMA_ONLY))
def test_refused_by_the_schema(case: str) -> None:
    vals, fragment = SCHEMA_ONLY[case]
    message = _error(vals)
    assert "values don't meet the specifications of the schema" in message, message
    assert fragment in message, message


def test_example_engine_in_sidecar_mode_must_share_the_release_namespace() -> None:
    vals = values(
        mode="sidecar",
        models=[MODEL_8B],
        exampleEngine={"enabled": True},
    )
    message = _error(vals, namespace="governor")
    assert "model meta-llama/Llama-3.1-8B-Instruct is in namespace llm" in message, message
    # The same values install into the model's namespace.
    assert render_files(vals, namespace="llm")


def test_valid_values_render() -> None:
    """The baseline every case above changes one thing of."""
    files = render_files(values())
    assert any(path.endswith("scaledobject.yaml") and text.strip() for path, text in files.items())


@pytest.mark.parametrize(
    ("release", "override"),
    [("1gov", {}), ("gov", {"fullnameOverride": "1-governor"}), ("gov", {"nameOverride": "Gov"})],
)
def test_release_name_that_is_no_service_name_is_refused(
    release: str, override: dict[str, Any]
) -> None:
    """The governor's Service is named after the release (or fullnameOverride): a Service
    name must start with a letter (RFC 1035), which Helm's release names need not."""
    message = _error(values(**override), name=release)
    assert f'the release name "{release}"' in message, message
    assert "not a valid Service name" in message, message


def test_release_name_with_digits_after_a_letter_renders() -> None:
    assert render_files(values(), name="gov1")


@pytest.mark.parametrize(
    ("admin_listen", "accepted"),
    [
        ("127.0.0.1:50052", True),
        ("[::1]:50052", True),
        ("0.0.0.0:9465", True),
        ("127.0.0.1:50051", False),  # the gRPC port, which 0.0.0.0:50051 takes
        ("0.0.0.0:9464", False),  # the metrics port
        ("[::]:50051", False),
    ],
)
def test_admin_listen_agrees_with_governor_run(admin_listen: str, accepted: bool) -> None:
    """What the chart installs, the rendered `governor run` flags start with: an admin
    listener the chart accepts passes the governor's own listener check, one it refuses
    would have failed it (or failed to bind)."""
    from service.cli import build_parser
    from service.run import _check_flags, _RunError
    from tests.helm.chart import container, one, parse

    vals = values(governor={"adminListen": admin_listen})
    if not accepted:
        assert "governor.adminListen" in _error(vals, namespace="llm-system")
        files = render_files(values(), namespace="llm-system")
    else:
        files = render_files(vals, namespace="llm-system")
    pod = one(parse(files), "Deployment", "gov-llm-governor")["spec"]["template"]["spec"]
    args = container(pod, "governor")["args"]
    if not accepted:  # the flags the refused values would have rendered
        args = [*args, "--admin-listen", admin_listen]
    parsed = build_parser().parse_args(args)
    assert parsed.admin_listen == admin_listen
    if accepted:
        _check_flags(parsed)
    else:
        with pytest.raises(_RunError):
            _check_flags(parsed)


@pytest.mark.parametrize(("rpcs", "accepted"), [(2**31 - 1, True), (2**31, False)])
def test_max_concurrent_rpcs_bound_is_the_governors(rpcs: int, accepted: bool) -> None:
    """The schema's maximum is where `governor run` stops accepting --max-concurrent-rpcs
    (gRPC's limiter takes a C int)."""
    from service.cli import build_parser
    from service.run import _check_flags, _RunError
    from tests.helm.chart import container, one, parse

    vals = values(governor={"maxConcurrentRpcs": rpcs})
    if accepted:
        files = render_files(vals, namespace="llm-system")
        pod = one(parse(files), "Deployment", "gov-llm-governor")["spec"]["template"]["spec"]
        args = container(pod, "governor")["args"]
        assert args[args.index("--max-concurrent-rpcs") + 1] == str(rpcs)
        _check_flags(build_parser().parse_args(args))
    else:
        assert "/governor/maxConcurrentRpcs" in _error(vals)
        args = ["run", "--config", "c.yaml", "--max-concurrent-rpcs", str(rpcs)]
        with pytest.raises(_RunError):
            _check_flags(build_parser().parse_args(args))


# governor values -> whether `governor run` accepts the flags they render (service/run.py
# _check_flags: --max-watch-streams below --max-concurrent-rpcs, the per-client limit at
# most --max-watch-streams or its default, the smaller of 1024 and half the RPCs).
_STREAM_LIMITS: dict[str, tuple[dict[str, Any], bool]] = {
    "unset": ({}, True),
    "both-set": ({"maxWatchStreams": 600, "maxWatchStreamsPerClient": 600}, True),
    "total-only": ({"maxWatchStreams": 2047}, True),
    "per-client-only-at-the-default-total": ({"maxWatchStreamsPerClient": 1024}, True),
    "per-client-only-at-half-the-rpcs": (
        {"maxConcurrentRpcs": 100, "maxWatchStreamsPerClient": 50},
        True,
    ),
    "total-at-the-rpcs": ({"maxWatchStreams": 2048}, False),
    "per-client-above-the-total": ({"maxWatchStreams": 8, "maxWatchStreamsPerClient": 9}, False),
    "per-client-above-the-default-total": ({"maxWatchStreamsPerClient": 1025}, False),
    "per-client-above-half-the-rpcs": (
        {"maxConcurrentRpcs": 100, "maxWatchStreamsPerClient": 51},
        False,
    ),
}


@pytest.mark.parametrize("case", sorted(_STREAM_LIMITS))
def test_watch_stream_limits_agree_with_governor_run(case: str) -> None:
    """governor.maxWatchStreams / maxWatchStreamsPerClient render --max-watch-streams /
    --max-watch-streams-per-client when set and nothing when null (the governor's
    defaults apply); the chart refuses exactly the combinations `governor run` refuses."""
    from service.cli import build_parser
    from service.run import _check_flags, _RunError
    from tests.helm.chart import container, one, parse

    governor, accepted = _STREAM_LIMITS[case]
    flags = {
        "maxWatchStreams": "--max-watch-streams",
        "maxWatchStreamsPerClient": "--max-watch-streams-per-client",
    }
    vals = values(governor=governor)
    if accepted:
        files = render_files(vals, namespace="llm-system")
        pod = one(parse(files), "Deployment", "gov-llm-governor")["spec"]["template"]["spec"]
        args = container(pod, "governor")["args"]
        for key, flag in flags.items():
            if key in governor:
                assert args[args.index(flag) + 1] == str(governor[key])
            else:
                assert flag not in args
        _check_flags(build_parser().parse_args(args))
    else:
        assert "governor.maxWatchStreams" in _error(vals)
        args = ["run", "--config", "c.yaml"]
        if "maxConcurrentRpcs" in governor:
            args += ["--max-concurrent-rpcs", str(governor["maxConcurrentRpcs"])]
        for key, flag in flags.items():
            if key in governor:
                args += [flag, str(governor[key])]
        with pytest.raises(_RunError):
            _check_flags(build_parser().parse_args(args))


def test_probe_services_are_the_health_names_the_governor_serves() -> None:
    """The schema's probe services are exactly what `governor run` marks SERVING."""
    import json

    from service import listeners

    schema = json.loads((CHART / "values.schema.json").read_text())
    served = {"", listeners._BATCHING, listeners._KEDA, listeners._ADMIN}
    assert set(schema["$defs"]["probe"]["properties"]["service"]["enum"]) == served


@pytest.mark.parametrize(
    "selector", ["", 'job="kube-state-metrics"', 'job="ksm", cluster=~"eu-.*"', 'a!="x\\"y"']
)
def test_a_kube_state_metrics_selector_of_matchers_renders(selector: str) -> None:
    vals = values(
        monitoring={"prometheusRule": {"enabled": True, "kubeStateMetricsSelector": selector}}
    )
    rendered = "".join(render_files(vals).values())
    assert "kube_deployment_spec_replicas{" in rendered
    assert selector in rendered  # verbatim, in a folded block scalar
