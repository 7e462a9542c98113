"""The state ConfigMap within the API server's 1 MiB: gzip-compressed state in
binaryData, the plain form of earlier versions still read, and a clear refusal when even
compressed it does not fit. The real `kubernetes` client against `FakeKubeAPI`, which
validates a ConfigMap's size as the API server does (data + decoded binaryData values
<= 1,048,576 bytes, else 422)."""

from __future__ import annotations

import base64
import gzip
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from actuators.kubeapi import KubeCallError, api_client, call_with_retries
from service.cmstore import CONFIGMAP_MAX_BYTES, STATE_GZ_KEY, ConfigMapStore
from service.store import MAX_STATE_BYTES, STATE_KEY, PublishedDoc, StateDoc, StoreError
from tests.service.fake_kube import FakeKubeAPI

NS = "llm"
STATE_CM = "governor-targets-state"
T0 = 1_796_040_000.4447474  # a wall time, Unix seconds


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI(timeout_delay_s=0.6) as fake:
        yield fake


def _store(api: FakeKubeAPI) -> ConfigMapStore:
    return ConfigMapStore(
        k8s.CoreV1Api(api_client(api.url)),
        NS,
        "governor-targets",
        request_timeout_s=2.0,
        backoff_s=0.05,
        sleep=lambda s: None,
    )


def _model_state(rng: random.Random, ticks: int = 60) -> dict[str, Any]:
    """One model's saved state as the leader writes it after a full 300 s stabilization
    window at 5 s ticks (60 recommendations), every measured value distinct per model
    (full-precision floats: the least compressible case)."""
    f = rng.random
    times = [T0 + 5.0 * i for i in range(ticks)]
    return {
        "replicas": rng.randint(1, 64),
        "knobs": {"max_num_seqs": rng.randint(8, 512), "max_num_batched_tokens": 8192},
        "last_scale_up_s": times[-3],
        "recommendations": [[t, rng.randint(1, 64)] for t in times],
        "actions": [],
        "panic_until_s": None,
        "idle_since_s": None,
        "no_data_ticks": 0,
        "last_good_s": times[-1],
        "burst_rps": None,
        "burst_at_s": None,
        "first_good_s": times[0],
        "load": {"level": 100 * f(), "trend": f() / 1000, "at_s": times[-1]},
        "capacity_correction": 0.4 + f(),
        "knob_candidate": None,
        "knob_candidate_since_s": None,
        "knob_changes": 1,
        "lengths": {
            "prompt_mean": 1000 * f(),
            "prompt_p95": 2000 * f(),
            "output_mean": 100 * f(),
            "output_p95": 400 * f(),
        },
        "knob_running": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
        "knob_running_replicas": 3,
        "knob_running_until_s": times[-1] + 140,
        "short_rps": 100 * f(),
        "short_at_s": times[-1],
        "plant_speed": 0.5 + 3 * f(),
        "plant_speed_samples": 66,
    }


def _published(rng: random.Random) -> PublishedDoc:
    q = [round(1000 * rng.random(), 1) for _ in range(12)]
    return PublishedDoc.model_validate(
        {
            "max_num_seqs": 120,
            "max_num_batched_tokens": 768,
            "generation": 1,
            "replicas": 3,
            "reason": "KNOBS_UNCHANGED",
            "decided_at_unix_s": T0 + 300 * rng.random(),
            "latency": {
                "ttft": q[0:4],
                "itl": q[4:8],
                "e2e": q[8:12],
                "observed_at_unix_s": T0 + 300,
            },
        }
    )


def state_doc(n: int, seed: int = 1) -> StateDoc:
    """The state document of `n` models (see `_model_state`)."""
    rng = random.Random(seed)
    names = [f"model-{i:05d}" for i in range(n)]
    return StateDoc(
        saved_at_unix_s=T0 + 300,
        leader="governor-0",
        models={name: _model_state(rng) for name in names},
        published={name: _published(rng) for name in names},
    )


def _put_raw(api: FakeKubeAPI, body: dict[str, Any]) -> None:
    core = k8s.CoreV1Api(api_client(api.url))
    call_with_retries(lambda: core.create_namespaced_config_map(NS, body), retries=0, what="create")


def test_the_fake_api_server_enforces_the_1_mib_limit_on_data_and_binary_data(
    api: FakeKubeAPI,
) -> None:
    """As the API server's ValidateConfigMap: the values' bytes count (binaryData
    decoded, not its base64), at most 1,048,576; a key in both maps is refused."""
    meta = {"name": "exact", "namespace": NS}
    _put_raw(api, {"metadata": meta, "data": {"a": "x" * (CONFIGMAP_MAX_BYTES - 10)}})
    over = {"name": "over", "namespace": NS}
    with pytest.raises(KubeCallError) as ei:
        _put_raw(
            api,
            {
                "metadata": over,
                "data": {"a": "x" * (CONFIGMAP_MAX_BYTES - 10)},
                "binaryData": {"b": base64.b64encode(b"y" * 11).decode()},
            },
        )
    assert ei.value.status == 422 and "1048576 bytes" in ei.value.reason
    # 900 KiB of bytes travel as 1.2 MB of base64: accepted, the decoded size counts
    big = {"name": "binary", "namespace": NS}
    _put_raw(api, {"metadata": big, "binaryData": {"b": base64.b64encode(b"z" * 921_600).decode()}})
    dup = {"name": "dup", "namespace": NS}
    with pytest.raises(KubeCallError) as ei:
        _put_raw(api, {"metadata": dup, "data": {"k": "1"}, "binaryData": {"k": "MQ=="}})
    assert ei.value.status == 422 and "duplicate" in ei.value.reason
    assert (NS, "exact") in api.configmaps and (NS, "binary") in api.configmaps
    assert (NS, "over") not in api.configmaps and (NS, "dup") not in api.configmaps


def test_the_state_of_1000_models_fits_gzipped_where_plain_json_is_refused(
    api: FakeKubeAPI,
) -> None:
    doc = state_doc(1000)
    plain = json.dumps(doc.model_dump(mode="json"), sort_keys=True)
    assert len(plain) > 2.5 * CONFIGMAP_MAX_BYTES  # ~3 MB: what earlier versions wrote
    with pytest.raises(KubeCallError) as ei:  # ... and the API server refuses
        _put_raw(api, {"metadata": {"name": "plain", "namespace": NS}, "data": {"s": plain}})
    assert ei.value.status == 422

    store = _store(api)
    store.save_state(doc)
    cm = api.configmaps[(NS, STATE_CM)]
    assert STATE_KEY not in (cm.get("data") or {})
    packed = base64.b64decode(cm["binaryData"][STATE_GZ_KEY])
    assert len(packed) < 0.4 * CONFIGMAP_MAX_BYTES  # measured ~0.28 MB: margin for 2.5x more
    assert json.loads(gzip.decompress(packed)) == json.loads(plain)
    assert store.load_state() == doc


def test_the_plain_state_of_earlier_versions_is_read_and_replaced_keeping_other_keys(
    api: FakeKubeAPI,
) -> None:
    old = state_doc(3)
    text = json.dumps(old.model_dump(mode="json"))
    api.edit_configmap(NS, STATE_CM, {STATE_KEY: text, "note": "kept"})
    store = _store(api)
    assert store.load_state() == old
    new = state_doc(3, seed=2)
    store.save_state(new)
    cm = api.configmaps[(NS, STATE_CM)]
    assert cm["data"] == {"note": "kept"}  # the plain key is dropped: one state, not two
    assert set(cm["binaryData"]) == {STATE_GZ_KEY}
    assert store.load_state() == new


def test_a_state_too_large_even_gzipped_is_refused_with_its_size_and_nothing_written(
    api: FakeKubeAPI,
) -> None:
    store = _store(api)
    small = state_doc(2)
    store.save_state(small)
    puts = api.count("PUT", STATE_CM)
    rng = random.Random(3)
    noise = {  # incompressible: 1.4 MB of random base64 gzips to ~1.06 MB
        f"m{i}": {"noise": base64.b64encode(rng.randbytes(10_500)).decode()} for i in range(100)
    }
    huge = StateDoc(saved_at_unix_s=T0, models=noise)
    with pytest.raises(StoreError) as ei:
        store.save_state(huge)
    msg = str(ei.value)
    assert "100 models" in msg and "gzipped" in msg and "1,048,576 bytes" in msg
    assert f"configmap {NS}/{STATE_CM}" in msg
    assert api.count("PUT", STATE_CM) == puts  # refused before the call: never truncated
    assert store.load_state() == small  # the last state that fitted is still there


def _state_cm(api: FakeKubeAPI, **content: dict[str, str]) -> None:
    """The state ConfigMap holding `content` (its `data` / `binaryData`), as stored."""
    api.configmaps[(NS, STATE_CM)] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": STATE_CM, "namespace": NS, "resourceVersion": "7"},
        **content,
    }


def test_a_corrupt_compressed_state_names_the_key(api: FakeKubeAPI) -> None:
    _state_cm(api, binaryData={STATE_GZ_KEY: base64.b64encode(b"not gzip").decode()})
    with pytest.raises(StoreError) as ei:
        _store(api).load_state()
    assert f"binaryData {STATE_GZ_KEY}" in str(ei.value) and "gzip" in str(ei.value)


def _gz(data: bytes) -> str:
    return base64.b64encode(gzip.compress(data)).decode()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        pytest.param(  # a gzip member whose deflate stream is broken: zlib.error
            lambda: {"binaryData": {STATE_GZ_KEY: _gz(b'{"a": 1}')[:14] + "A" * 20}},
            "not gzip-compressed base64",
            id="corrupt-deflate",
        ),
        pytest.param(
            lambda: {"binaryData": {STATE_GZ_KEY: _gz(b'{"format": 1}')[:-12]}},
            "truncated",
            id="truncated",
        ),
        pytest.param(
            lambda: {"data": {STATE_KEY: "[" * 100_000 + "]" * 100_000}},
            "not JSON: nested too deeply",
            id="nested",
        ),
        pytest.param(  # ~1,000:1: a ConfigMap's 1 MiB would have inflated to ~1 GiB
            lambda: {"binaryData": {STATE_GZ_KEY: _gz(b" " * (MAX_STATE_BYTES + 1))}},
            f"inflates past {MAX_STATE_BYTES} bytes",
            id="gzip-bomb",
        ),
    ],
)
def test_a_corrupt_state_configmap_is_a_store_error(
    api: FakeKubeAPI, content: Callable[[], dict[str, Any]], needle: str
) -> None:
    """A StoreError is what the follower, the takeover and the start handle (logged and
    left out, or `cannot restore state`); these had raised past them on every tick."""
    _state_cm(api, **content())
    with pytest.raises(StoreError) as err:
        _store(api).load_state()
    assert f"configmap {NS}/{STATE_CM}" in str(err.value) and needle in str(err.value)


def test_a_conflicting_state_write_is_not_retried_once_this_instance_no_longer_leads(
    api: FakeKubeAPI,
) -> None:
    """The state's PUT answers 409 (another writer, the new leader, wrote it since our
    read) and the lease lapsed meanwhile: the re-read and retry do not write over the
    new leader's state (they did), and the save fails naming why."""
    store = _store(api)
    store.save_state(StateDoc(saved_at_unix_s=T0, models={}))
    leads = iter([True, False])
    store.set_write_check(lambda: next(leads))
    api.inject("PUT", STATE_CM, 409)
    with pytest.raises(StoreError, match="no longer leads"):
        store.save_state(StateDoc(saved_at_unix_s=T0 + 5.0, models={}))
    assert store.load_state() == StateDoc(saved_at_unix_s=T0, models={})
