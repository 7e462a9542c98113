"""Bad input, fuzzed with hypothesis against a live server on loopback (real gRPC):
every request message of every service (admin calls authenticated, so they reach the
handlers), KEDA scalerMetadata maps, raw protobuf bytes (random and malformed), config
files through `governor check-config`, and operator CLI arguments.

What must hold for every case: a clear answer (OK, or a client error code with a
non-empty message of at most 1,024 characters; never UNKNOWN or INTERNAL, which mean an
unhandled exception; the CLI exits 0 or 2, never 1 with a reachable server, never a
traceback), the server stays up (health SERVING afterwards), and a refused request
changes no stored target (the targets revision is unchanged)."""

from __future__ import annotations

import contextlib
import io
import string
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from governor_api import externalscaler_pb2 as es
from governor_api import governor_v1_pb2 as pb
from service.cli import main as cli_main
from service.core import ServiceCore
from service.security import AdminToken
from service.store import MemoryStore
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import ServerThread

TOKEN = "fuzz-admin-token-9d8c7b6a5f4e3d2c"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
CLEAR = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNAVAILABLE,  # KEDA before a model's first decision: "keep as is"
    grpc.StatusCode.UNIMPLEMENTED,  # StreamMetricSpec, documented
}
WRITES = {"SetTarget", "DeleteTarget", "PauseActuation", "ResumeActuation"}
EXAMPLES = 120
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)


class Live:
    """The fuzzed server: two models, one decided (so KEDA answers), admin token on."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        log = quiet_logger()
        cfg = make_config(model_entry("demo"), model_entry("meta-llama/Llama-3.1-8B"))
        self.core = ServiceCore(
            cfg, FakeSource({"demo": 20.0}), MemoryStore(), clock=self.clock, logger=log
        )
        self.core.tick(self.clock.advance(5))
        self.thread = ServerThread(
            self.core,
            logger=log,
            admin_token=AdminToken.from_value(TOKEN),
            allow_unauthenticated_admin=False,
        )
        self.calls = 0
        self.codes: dict[str, int] = {}

    def __enter__(self) -> Live:
        self.thread.__enter__()
        self.channel = grpc.insecure_channel(self.thread.address)
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        self.thread.stop()

    def method(self, service: str, name: str, streaming: bool = False) -> Any:
        path = f"/{service}/{name}"
        if streaming:
            return self.channel.unary_stream(path)
        return self.channel.unary_unary(path)

    def call(self, service: str, name: str, payload: bytes, streaming: bool = False) -> Any:
        """Send raw request bytes; returns (code, details)."""
        self.calls += 1
        md = AUTH if service.endswith("AdminService") else ()
        try:
            if streaming:
                stream = self.method(service, name, True)(payload, timeout=5, metadata=md)
                next(iter(stream))
                stream.cancel()
                code, details = grpc.StatusCode.OK, ""
            else:
                self.method(service, name)(payload, timeout=5, metadata=md)
                code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""  # type: ignore[attr-defined]
        except StopIteration:
            code, details = grpc.StatusCode.OK, ""
        self.codes[code.name] = self.codes.get(code.name, 0) + 1
        return code, details

    def check_clear(self, code: grpc.StatusCode, details: str, what: str) -> None:
        assert code in CLEAR, f"{what}: {code.name}: {details[:300]}"
        if code != grpc.StatusCode.OK:
            assert details.strip(), f"{what}: {code.name} without a message"
            assert len(details) <= 1024, f"{what}: {len(details)}-character message"

    def healthy(self) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return resp.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    with Live() as server:
        yield server


# ---------------------------------------------------------------------- strategies
NAMES = ["demo", "meta-llama/Llama-3.1-8B", "", "nope", "Demo", "demo ", "../etc/passwd"]
texts = st.one_of(
    st.sampled_from(NAMES),
    st.text(max_size=40),
    st.text(alphabet=string.printable, min_size=200, max_size=2000),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
)
doubles = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 1e308, -0.0, 5e-324, 50.0, 1000.0]),
)
int32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 2**31 - 1]))
json_leaf = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=20))
json_values = st.recursive(
    json_leaf,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids,
                                                               max_size=4),
    max_leaves=12,
)  # fmt: skip
POLICY_KEYS = ["tick_interval_s", "window_s", "scale_up_limits", "tolerance_frac", "nope"]


@st.composite
def model_targets(draw: Any) -> pb.ModelTarget:
    t = pb.ModelTarget(
        name=draw(texts),
        namespace=draw(st.one_of(st.just(""), texts)),
        deployment=draw(st.one_of(st.just("demo"), texts)),
        batching_policy=draw(st.sampled_from(["", "slo", "seed", "static", "fast"])),
        profile=draw(st.sampled_from(["", "llama-3.1-8b-h100", "missing", "/etc/hosts.yaml"])),
    )
    for field in ("ttft_p95_ms", "itl_p95_ms", "e2e_p99_ms", "attainment_goal_frac"):
        if draw(st.booleans()):
            setattr(t.sla, field, draw(doubles))
    for field in ("min_replicas", "max_replicas"):
        if draw(st.booleans()):
            setattr(t.replicas, field, draw(int32))
    for field in ("max_num_seqs_min", "max_num_seqs_max", "default_max_num_seqs"):
        if draw(st.booleans()):
            setattr(t.knobs, field, draw(int32))
    if draw(st.booleans()):
        t.cold_start_s = draw(doubles)
    if draw(st.booleans()):
        t.fallback_replicas = draw(int32)
    if draw(st.booleans()):
        policy = draw(st.dictionaries(st.sampled_from(POLICY_KEYS) | st.text(max_size=8),
                                      json_values, max_size=3))  # fmt: skip
        s = struct_pb2.Struct()
        with contextlib.suppress(ValueError, TypeError):
            s.update(policy)
        t.policy.CopyFrom(s)
    return t


def _requests() -> st.SearchStrategy[tuple[str, str, bool, Any]]:
    admin = "governor.v1.AdminService"
    batching = "governor.v1.BatchingService"
    keda = "externalscaler.ExternalScaler"
    revision = st.one_of(st.none(), texts)

    def set_target(t: pb.ModelTarget, rev: str | None, dry: bool) -> pb.SetTargetRequest:
        req = pb.SetTargetRequest(target=t, dry_run=dry)
        if rev is not None:
            req.expected_revision = rev
        return req

    def delete(m: str, rev: str | None) -> pb.DeleteTargetRequest:
        req = pb.DeleteTargetRequest(model=m)
        if rev is not None:
            req.expected_revision = rev
        return req

    metadata = st.dictionaries(
        st.one_of(st.sampled_from(["model", "namespace", "scalerAddress"]), st.text(max_size=20)),
        texts,
        max_size=6,
    )
    refs = st.builds(
        lambda n, ns, md: es.ScaledObjectRef(name=n, namespace=ns, scalerMetadata=md),
        texts, texts, metadata,
    )  # fmt: skip
    return st.one_of(
        st.tuples(st.just(admin), st.just("SetTarget"), st.just(False),
                  st.builds(set_target, model_targets(), revision, st.booleans())),
        st.tuples(st.just(admin), st.just("GetTarget"), st.just(False),
                  st.builds(lambda m: pb.GetTargetRequest(model=m), texts)),
        st.tuples(st.just(admin), st.just("ListTargets"), st.just(False),
                  st.just(pb.ListTargetsRequest())),
        st.tuples(st.just(admin), st.just("DeleteTarget"), st.just(False),
                  st.builds(delete, texts, revision)),
        st.tuples(st.just(admin), st.just("GetStatus"), st.just(False),
                  st.builds(lambda ms: pb.GetStatusRequest(models=ms),
                            st.lists(texts, max_size=5))),
        st.tuples(st.just(admin), st.just("Explain"), st.just(False),
                  st.builds(lambda m, n: pb.ExplainRequest(model=m, last=n), texts,
                            st.integers(0, 2**32 - 1))),
        st.tuples(st.just(admin), st.sampled_from(["PauseActuation", "ResumeActuation"]),
                  st.just(False), st.builds(lambda m: pb.PauseRequest(model=m), texts)),
        st.tuples(st.just(batching), st.just("GetBatchingConfig"), st.just(False),
                  st.builds(lambda m, e: pb.GetBatchingConfigRequest(model=m, engine_id=e),
                            texts, texts)),
        st.tuples(st.just(batching), st.just("WatchBatchingConfig"), st.just(True),
                  st.builds(lambda m, e: pb.GetBatchingConfigRequest(model=m, engine_id=e),
                            texts, texts)),
        st.tuples(st.just(keda), st.sampled_from(["GetMetricSpec", "IsActive"]), st.just(False),
                  refs),
        st.tuples(st.just(keda), st.sampled_from(["StreamIsActive", "StreamMetricSpec"]),
                  st.just(True), refs),
        st.tuples(st.just(keda), st.just("GetMetrics"), st.just(False),
                  st.builds(lambda r, n: es.GetMetricsRequest(scaledObjectRef=r, metricName=n),
                            refs, texts)),
    )  # fmt: skip


# ---------------------------------------------------------------------- gRPC messages
@pytest.mark.fault_case(
    "Bad input",
    "hypothesis: every gRPC request message (15 methods of 3 services)",
    "random field values (huge/unicode/empty strings, NaN/inf/negative numbers, random "
    "policy structs, random revisions): a clear code and bounded message, the server "
    "stays up, a refused write changes no target",
)
def test_fuzz_every_request_message(live: Live, fault_note: Any) -> None:
    seen: set[str] = set()
    before = live.calls

    @settings(SETTINGS, max_examples=400)
    @given(_requests())
    def run(case: tuple[str, str, bool, Any]) -> None:
        service, name, streaming, request = case
        seen.add(name)
        revision = live.core.targets_revision
        code, details = live.call(service, name, request.SerializeToString(), streaming)
        live.check_clear(code, details, f"{name}({str(request)[:200]})")
        if code != grpc.StatusCode.OK or name not in WRITES:
            assert live.core.targets_revision == revision, f"{name} refused but changed targets"
        if name == "SetTarget" and code == grpc.StatusCode.OK and request.target.name:
            live.core.delete_target(request.target.name)  # keep the model set small

    run()
    assert live.healthy()
    assert len(seen) == 15, sorted(seen)
    fault_note(f"{live.calls - before} calls over 15 methods, 0 unclear answers, server up")


# ---------------------------------------------------------------------- scalerMetadata
@pytest.mark.fault_case(
    "Bad input",
    "hypothesis: KEDA scalerMetadata maps",
    "random maps (missing/empty/huge/unicode model and namespace, extra keys, up to 300 "
    "entries) on GetMetricSpec, GetMetrics and IsActive: OK only for a configured model, "
    "else INVALID_ARGUMENT or NOT_FOUND with a bounded message",
)
def test_fuzz_scaler_metadata(live: Live, fault_note: Any) -> None:
    before = live.calls
    keys = st.one_of(st.sampled_from(["model", "namespace", "scalerAddress", ""]),
                     st.text(max_size=30))  # fmt: skip
    maps = st.one_of(
        st.dictionaries(keys, texts, max_size=8),
        st.integers(250, 300).map(lambda n: {f"k{i}": "v" for i in range(n)} | {"model": "demo"}),
    )

    @settings(SETTINGS, max_examples=300)
    @given(maps, st.sampled_from(["GetMetricSpec", "GetMetrics", "IsActive"]))
    def run(md: dict[str, str], method: str) -> None:
        ref = es.ScaledObjectRef(scalerMetadata=md)
        req = es.GetMetricsRequest(scaledObjectRef=ref) if method == "GetMetrics" else ref
        code, details = live.call("externalscaler.ExternalScaler", method,
                                  req.SerializeToString())  # fmt: skip
        live.check_clear(code, details, f"{method}({md!r:.200})")
        configured = md.get("model", "").strip() in ("demo", "meta-llama/Llama-3.1-8B")
        if code == grpc.StatusCode.OK:
            assert configured and len(md) <= 256
        elif not configured or len(md) > 256:
            assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), code

    run()
    assert live.healthy()
    fault_note(f"{live.calls - before} maps, 0 unclear answers")


# ---------------------------------------------------------------------- raw bytes
ALL_METHODS = [
    ("governor.v1.AdminService", m, False)
    for m in ("SetTarget", "GetTarget", "ListTargets", "DeleteTarget", "GetStatus", "Explain",
              "PauseActuation", "ResumeActuation")
] + [
    ("governor.v1.BatchingService", "GetBatchingConfig", False),
    ("governor.v1.BatchingService", "WatchBatchingConfig", True),
    ("externalscaler.ExternalScaler", "IsActive", False),
    ("externalscaler.ExternalScaler", "StreamIsActive", True),
    ("externalscaler.ExternalScaler", "GetMetricSpec", False),
    ("externalscaler.ExternalScaler", "GetMetrics", False),
    ("externalscaler.ExternalScaler", "StreamMetricSpec", True),
    ("grpc.health.v1.Health", "Check", False),
]  # fmt: skip
MALFORMED = [
    b"\x08",  # truncated varint
    b"\x0a\x05ab",  # length past the end
    b"\x0f",  # invalid wire type
    b"\x07",  # field number 0
    b"\xff" * 10 + b"\x01",  # over-long varint tag
    b"\x0a\x02\xff\xfe",  # invalid UTF-8 in field 1 (a string for most requests)
]


@pytest.mark.fault_case(
    "Bad input",
    "raw malformed protobuf bytes on every method (16 incl. health)",
    "6 malformed encodings (truncated varint, length past the end, bad wire type, field "
    "0, over-long tag, invalid UTF-8) on every method: INVALID_ARGUMENT naming the method "
    "(grpc alone answers an opaque INTERNAL), plus hypothesis-random bytes: never UNKNOWN "
    "or INTERNAL; the server stays up; no target changes",
)
def test_raw_malformed_bytes(live: Live, fault_note: Any) -> None:
    revision = live.core.targets_revision
    before = live.calls
    for service, method, streaming in ALL_METHODS:
        for payload in MALFORMED:
            code, details = live.call(service, method, payload, streaming)
            if payload == b"\x0a\x02\xff\xfe" and method in ("ListTargets",):
                assert code in CLEAR  # no field 1: the unknown field is skipped
                continue
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, payload, code, details)
            assert "malformed request" in details and method in details

    @settings(SETTINGS, max_examples=500)
    @given(st.binary(max_size=512), st.sampled_from(ALL_METHODS))
    def run(payload: bytes, target: tuple[str, str, bool]) -> None:
        service, method, streaming = target
        if method in WRITES:  # random bytes that parse could be a valid write: dry run
            return
        code, details = live.call(service, method, payload, streaming)
        live.check_clear(code, details, f"{method}({payload!r:.100})")

    run()
    assert live.core.targets_revision == revision
    assert live.healthy()
    fault_note(f"{live.calls - before} raw payloads, 0 unclear answers")


# ---------------------------------------------------------------------- config files
VALID: dict[str, Any] = {
    "models": [
        {
            "name": "m",
            "deployment": "m",
            "sla": {"ttft_p95_ms": 500, "itl_p95_ms": 40},
            "replicas": {"min_replicas": 1, "max_replicas": 8},
        }
    ],
    "policy": {"tick_interval_s": 5},
}
yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=12), kids,
                                                               max_size=3),
    max_leaves=10,
)  # fmt: skip


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    import copy

    out = copy.deepcopy(node)
    cur = out
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return out


def _cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:  # argparse: usage errors exit 2
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue() + err.getvalue()


@pytest.mark.fault_case(
    "Bad input",
    "hypothesis: config files (`governor check-config`)",
    "a valid file with one value replaced by a random YAML value, random YAML documents "
    "and random text: exit 0 (valid) or 2 with FAILED and one line per problem; never a "
    "traceback",
)
def test_fuzz_config_files(fault_note: Any) -> None:
    counts = {0: 0, 2: 0}
    paths = _paths(VALID)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"

        @settings(SETTINGS, max_examples=250)
        @given(
            st.one_of(
                st.builds(lambda i, v: ("mutated", i, v), st.integers(0, len(paths) - 1),
                          yaml_values),
                st.builds(lambda v: ("document", 0, v), yaml_values),
                st.builds(lambda t: ("text", 0, t), st.text(max_size=300)),
            )
        )  # fmt: skip
        def run(case: tuple[str, int, Any]) -> None:
            kind, i, value = case
            if kind == "text":
                path.write_text(value)
            else:
                doc = _replace(VALID, paths[i], value) if kind == "mutated" else value
                path.write_text(yaml.safe_dump(doc))
            code, out = _cli(["check-config", str(path)])
            assert code in (0, 2), (code, out[-500:])
            assert "Traceback" not in out
            if code == 2:
                assert "FAILED" in out and "  - " in out, out[-500:]
            counts[code] += 1

        run()
    assert counts[0] and counts[2]
    fault_note(f"{sum(counts.values())} files: {counts[0]} valid, {counts[2]} refused (exit 2)")


# ---------------------------------------------------------------------- CLI arguments
VOCAB = [
    "target", "set", "get", "list", "delete", "status", "explain", "pause", "resume",
    "engine-args", "demo", "nope", "", "--ttft-p95-ms", "--min-replicas", "--policy",
    "--last", "--model", "--dry-run", "--force", "--output", "json", "--timeout-s", "0",
    "-1", "nan", "--file", "/dev/null", "/nonexistent", "--", "-h", "--bogus", "ünïcode",
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from([
        "0", "-1", "3", "12", "nan", "inf", "-inf", "1e309", "99999999999999999999", "", "x",
        "seed", "slo", "static", "llama-3.1-8b-h100", "/etc/hosts.yaml", "ünï", "demo",
        "tick_interval_s=nan", "window_s=-1", "tolerance_frac=0.2", "scale_up_limits=[1]",
        "a=!!python/object:os.system", "=", "/dev/null", "/nonexistent",
    ]),
    st.text(max_size=15),
)  # fmt: skip
SET_FLAGS = [
    "--deployment", "--namespace", "--ttft-p95-ms", "--itl-p95-ms", "--e2e-p99-ms",
    "--attainment-goal-frac", "--min-replicas", "--max-replicas", "--batching-policy",
    "--cold-start-s", "--profile", "--fallback-replicas", "--policy", "--file",
    "--default-max-num-seqs", "--max-num-batched-tokens-max", "--timeout-s",
]  # fmt: skip
MODEL_ARGS = st.one_of(st.sampled_from(NAMES), st.text(max_size=20))
KINDS = ["set", "set", "set", "get", "list", "delete", "status", "explain", "pause", "resume",
         "engine-args", "random"]  # fmt: skip


@st.composite
def command_lines(draw: Any) -> list[str]:
    kind = draw(st.sampled_from(KINDS))
    model = draw(MODEL_ARGS)
    if kind == "set":
        argv = ["target", "set", model]
        for flag in draw(st.lists(st.sampled_from(SET_FLAGS), max_size=6, unique=True)):
            argv += [flag, draw(VALUES)]
        if draw(st.booleans()):
            argv.append("--dry-run")
    elif kind in ("get", "delete"):
        argv = ["target", kind, model]
    elif kind == "list":
        argv = ["target", "list"]
    elif kind == "status":
        argv = ["status", *draw(st.lists(MODEL_ARGS, max_size=3))]
    elif kind == "explain":
        argv = ["explain", model, "--last", draw(VALUES)]
    elif kind in ("pause", "resume"):
        argv = [kind, model]
    elif kind == "engine-args":
        argv = ["engine-args", "--model", model]
    else:
        argv = draw(st.lists(st.sampled_from(VOCAB) | st.text(max_size=12), max_size=8))
    if draw(st.booleans()):
        argv += ["--output", draw(st.sampled_from(["json", "text", "yaml"]))]
    return argv


@pytest.mark.fault_case(
    "Bad input",
    "hypothesis: operator CLI arguments (target set/get/list/delete, status, explain, "
    "pause, resume, engine-args)",
    "command lines built from each command's flags with bad values (NaN, inf, huge, "
    "negative, empty, unicode, YAML tags, paths) plus random token lists, against the live "
    "server (token sent): exit 0 or 2 (usage errors included), never 1 with a reachable "
    "server, never a traceback; a refused command changes no target",
)
def test_fuzz_cli_arguments(live: Live, fault_note: Any) -> None:
    counts = {0: 0, 2: 0}
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "token"
        token.write_text(TOKEN)
        common = ["--server", live.thread.address, "--token-file", str(token)]

        @settings(SETTINGS, max_examples=250)
        @given(command_lines())
        def run(argv: list[str]) -> None:
            revision = live.core.targets_revision
            models = {m.name for m in live.core.config.models}
            if argv[:1] != ["check-config"]:
                argv = [*argv, *common]
            code, out = _cli(argv)
            assert code in (0, 2), (argv, code, out[-400:])
            assert "Traceback" not in out, out
            if code != 0:
                assert live.core.targets_revision == revision, argv
            for name in {m.name for m in live.core.config.models} - models:
                live.core.delete_target(name)  # a valid `target set` added one: undo
            counts[code] += 1

        run()
    assert counts[0] and counts[2]
    assert live.healthy()
    fault_note(f"{sum(counts.values())} command lines: {counts[0]} exit 0, {counts[2]} exit 2")
