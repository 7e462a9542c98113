"""The controller killed with SIGKILL mid-actuation and restarted: a real service process
(tests/faults/serve_governor.py: production code but the metric source) scaling a
Deployment through a fake Kubernetes API whose scale PATCHes take 0.3 s, so each kill
lands while a PATCH is in flight (and, at 10 ticks per second, around the state
file's writes).

What must hold: the state file is whole after every kill (atomic writes: temp file,
fsync, rename); the targets set through the admin API and the hysteresis memory survive;
the restarted process serves the last published replicas at once; the Deployment ends
at the last decision; no flap (the Deployment's replica writes only ever go up while
load rises, and a load drop right after the last restart scales nothing down inside the
stabilization window)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from governor_api import governor_v1_pb2 as pb
from governor_api import governor_v1_pb2_grpc as pb_grpc
from service.store import FileStore
from tests.faults.helpers import FaultyKubeAPI
from tests.service.harness import ServiceProcess, keda_replicas, wait_until

ROOT = Path(__file__).resolve().parents[2]
NS = "llm"
TOKEN = "crash-test-token-0123456789abcdef"


def _write_rates(path: Path, rate: float | None) -> None:
    """The fake source's rate for "demo", req/s (None: no data, so decisions hold)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"demo": rate}))
    os.replace(tmp, path)


def _start(tmp: Path, kube_url: str) -> ServiceProcess:
    return ServiceProcess(
        [
            "-m",
            "tests.faults.serve_governor",
            "--config",
            str(tmp / "config.yaml"),
            "--state-file",
            str(tmp / "state.json"),
            "--rates-file",
            str(tmp / "rates.json"),
            "--kube-url",
            kube_url,
            "--admin-token-file",
            str(tmp / "token"),
        ],
        cwd=str(ROOT),
    )


AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _await_applied(api: FaultyKubeAPI, channel: grpc.Channel) -> None:
    wait_until(
        lambda: api.replicas(NS, "demo") == keda_replicas(channel), 30, "the decision applied"
    )


@pytest.mark.slow
@pytest.mark.fault_case(
    "Controller crash",
    "SIGKILL mid-actuation (scale PATCH in flight), 3 times, restarted each time",
    "state file whole after every kill; admin-set target and hysteresis intact; the "
    "restarted process serves the last published replicas at once; the Deployment ends at "
    "the last decision; replica writes only go up while load rises; a load drop after the "
    "last restart scales nothing down within the stabilization window (no flap)",
)
def test_sigkill_mid_actuation(tmp_path: Path, fault_note: Any) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    config = {
        "models": [
            {
                "name": "demo",
                "namespace": NS,
                "deployment": "demo",
                "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 50},
                "replicas": {"min_replicas": 1, "max_replicas": 40},
            }
        ],
        "policy": {
            "tick_interval_s": 0.1,
            "cooldown_after_scale_up_s": 0,
            "scale_down_stabilization_s": 120,
            "burst_memory_half_life_s": 0,
            "knob_sustain_s": 0,
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    rates = tmp_path / "rates.json"
    _write_rates(rates, 100.0)
    kills = 0
    with FaultyKubeAPI() as api:
        api.add_deployment(NS, "demo", 1)
        api.patch_delay_s = 0.3
        svc = _start(tmp_path, api.url)
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{svc.port()}")
            wait_until(lambda: api.replicas(NS, "demo") >= 4, 30, "the first scale-up")
            admin = pb_grpc.AdminServiceStub(channel)
            got = admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5, metadata=AUTH)
            got.target.sla.itl_p95_ms = 42
            admin.SetTarget(pb.SetTargetRequest(target=got.target), timeout=5, metadata=AUTH)
            for rate in (160.0, 240.0, 330.0):
                api.patch_started.clear()
                _write_rates(rates, rate)  # more load: a scale-up PATCH starts
                wait_until(api.patch_started.is_set, 20, "a scale PATCH in flight")
                svc.proc.send_signal(signal.SIGKILL)
                svc.proc.wait(10)
                kills += 1
                channel.close()
                # atomic writes: the file is whole and valid, whatever the kill interrupted
                store = FileStore(tmp_path / "state.json")
                state = store.load_state()
                targets = store.load_targets()
                assert state is not None and targets is not None
                assert targets.doc.models[0].sla.itl_p95_ms == 42
                saved = state.published["demo"].replicas
                assert state.models["demo"]["recommendations"], "hysteresis memory lost"
                # No data while the restarted process is first read: its ticks hold, so
                # the check does not race its first decision on a slow machine.
                _write_rates(rates, None)
                svc = _start(tmp_path, api.url)
                channel = grpc.insecure_channel(f"127.0.0.1:{svc.port()}")
                assert keda_replicas(channel) == saved  # the restored decision, served at once
                _write_rates(rates, rate)
                admin = pb_grpc.AdminServiceStub(channel)
                got = admin.GetTarget(pb.GetTargetRequest(model="demo"), timeout=5, metadata=AUTH)
                assert got.target.sla.itl_p95_ms == 42
                # the interrupted actuation is completed by the new process
                _await_applied(api, channel)
            high = keda_replicas(channel)
            assert high is not None
            wait_until(lambda: api.replicas(NS, "demo") == high, 30, "the last decision applied")
            # load drops right after the last restart: nothing scales down in the window
            _write_rates(rates, 1.0)
            deadline = time.monotonic() + 3.0  # 30 ticks
            while time.monotonic() < deadline:
                assert api.replicas(NS, "demo") == high
                assert keda_replicas(channel) == high
                time.sleep(0.1)
            explain = admin.Explain(pb.ExplainRequest(model="demo", last=1), timeout=5,
                                    metadata=AUTH)  # fmt: skip
            last = explain.decisions[-1].summary
            assert last.raw_replicas < high
            held = {"stabilize:SCALE_DOWN_STABILIZED", "panic:PANIC_HOLD"}  # restored memory
            assert held & set(last.stage_reasons), list(last.stage_reasons)
            channel.close()
            svc.proc.send_signal(signal.SIGTERM)
            assert svc.proc.wait(15) == 0
        finally:
            svc.kill()
        writes = [r for _, name, r in api.writes if name == "demo"]
    assert writes == sorted(writes), f"a replica write went down: {writes}"
    assert writes[-1] == high
    fault_note(f"{kills} SIGKILLs mid-PATCH, state whole {kills}/{kills}, writes {writes}")
