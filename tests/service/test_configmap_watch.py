"""The targets ConfigMap is watched (list, then watch from its resourceVersion, re-list on
410 Gone), not read every tick. Against FakeKubeAPI (tests/service/fake_kube.py), a fake
of the published list/watch contract: no Kubernetes API server can run here. Ticks are
driven by the test on a fake clock; waits are bounded polls of a condition. A watch
that hears nothing is closed after its read timeout; a black-holed one reads stale."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from urllib3.exceptions import ConnectTimeoutError

from actuators.kubeapi import api_client
from service.cmstore import ConfigMapStore
from service.cmwatch import ConfigMapWatch
from service.core import ServiceCore
from tests.service.fake_kube import FakeKubeAPI
from tests.service.fakes import FakeClock, FakeSource, make_config, model_entry, quiet_logger
from tests.service.harness import wait_until

NS, NAME = "llm", "governor-targets"
OBJECT = f"/api/v1/namespaces/{NS}/configmaps/{NAME}"


def _reads(api: FakeKubeAPI) -> int:
    """GETs of the targets ConfigMap itself (not LIST/WATCH, not the state ConfigMap)."""
    with api._lock:
        return sum(1 for m, p in api.requests if m == "GET" and p == OBJECT)


def _targets(ttft_ms: float) -> dict[str, str]:
    entry = model_entry("demo", sla={"ttft_p95_ms": ttft_ms, "itl_p95_ms": 50})
    return {"targets.yaml": yaml.safe_dump({"models": [entry]})}


@pytest.fixture
def watched() -> Iterator[tuple[FakeKubeAPI, ConfigMapStore, ServiceCore]]:
    with FakeKubeAPI() as api:
        api.edit_configmap(NS, NAME, _targets(1000))
        store = ConfigMapStore(k8s.CoreV1Api(api_client(api.url)), NS, NAME)
        store.start_watch(watch_timeout_s=1, backoff_s=0.05)
        assert store._watch.wait_synced(10)
        core = ServiceCore(
            make_config(model_entry("demo")),
            FakeSource({"demo": 5.0}),
            store,
            clock=FakeClock(),
            logger=quiet_logger(),
        )
        try:
            yield api, store, core
        finally:
            core.close()


def _ttft(core: ServiceCore) -> float:
    return core.config.model("demo").sla.ttft_p95_ms


def _applied(core: ServiceCore, ttft_ms: float) -> Any:
    def check() -> bool:
        core.tick(core.clock.advance(1.0))  # type: ignore[attr-defined]
        return _ttft(core) == ttft_ms

    return check


def test_ticks_read_the_watch_not_the_api_server(
    watched: tuple[FakeKubeAPI, ConfigMapStore, ServiceCore],
) -> None:
    api, _store, core = watched
    reads = _reads(api)
    for _ in range(20):
        core.tick(core.clock.advance(1.0))  # type: ignore[attr-defined]
    assert _reads(api) == reads, "a tick read the ConfigMap"
    # an operator's edit (kubectl apply) arrives through the watch and is applied
    api.edit_configmap(NS, NAME, _targets(700))
    wait_until(_applied(core, 700.0), 10, "the edit applied from the watch")
    assert _reads(api) == reads


def test_expired_resource_version_is_relisted(
    watched: tuple[FakeKubeAPI, ConfigMapStore, ServiceCore],
) -> None:
    """The watch's resourceVersion is compacted away while its stream is open; the next
    watch gets 410 Gone and the watcher lists again, then sees later edits."""
    api, store, core = watched
    api.send_bookmarks = False  # so the client's resourceVersion stays the old one
    assert store._watch.lists == 1
    api.edit_configmap(NS, "unrelated", {"k": "v"})  # moves the cluster's resourceVersion
    api.compact_configmap_history()
    wait_until(lambda: store._watch.lists == 2, 10, "a re-list after 410 Gone")
    api.edit_configmap(NS, NAME, _targets(650))
    wait_until(_applied(core, 650.0), 10, "an edit after the re-list")


def test_deleted_configmap_keeps_the_last_valid_targets(
    watched: tuple[FakeKubeAPI, ConfigMapStore, ServiceCore],
) -> None:
    api, store, core = watched
    api.edit_configmap(NS, NAME, _targets(800))
    wait_until(_applied(core, 800.0), 10, "the edit")
    api.delete_configmap(NS, NAME)
    wait_until(lambda: store._watch.current() == (True, None), 10, "the DELETED event")
    core.tick(core.clock.advance(1.0))  # type: ignore[attr-defined]
    assert _ttft(core) == 800.0


class _Network:
    """The API client's calls, with a switch that black-holes new connections (as a
    dropped route does: connects time out; an open stream just hears nothing)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.black_hole = False
        real = api.list_namespaced_config_map

        @functools.wraps(real)
        def list_namespaced_config_map(*args: Any, **kw: Any) -> Any:
            if self.black_hole:
                raise ConnectTimeoutError("black-holed: connect timed out")
            return real(*args, **kw)

        self.list_namespaced_config_map = list_namespaced_config_map


def test_a_silent_watch_is_closed_and_a_black_holed_one_reported_stale() -> None:
    """A watch that hears nothing for `read_timeout_s` (no event, no BOOKMARK; here
    0.3 s, the server's own timeout an hour away) is closed and watched again from the
    same resourceVersion, no LIST: while the server answers, the kept object stays
    current and edits still arrive. Once nothing answers (a black hole: no FIN, no RST)
    `current()` says not synced within `stale_after_s` of the last thing heard, so the
    store reads the API server instead of serving stale targets for minutes; synced
    again once the server answers."""
    with FakeKubeAPI() as api:
        api.edit_configmap(NS, NAME, _targets(1000))
        net = _Network(k8s.CoreV1Api(api_client(api.url)))
        w = ConfigMapWatch(
            net, NS, NAME, watch_timeout_s=3600, read_timeout_s=0.3, stale_after_s=0.5,
            backoff_s=0.05, logger=quiet_logger(),
        )  # fmt: skip
        w.start()
        try:
            assert w.wait_synced(10)
            watches = api.watches
            wait_until(lambda: api.watches >= watches + 3, 10, "silent watches closed")
            assert w.current()[0] and w.lists == 1
            rv = api.edit_configmap(NS, NAME, _targets(700))
            wait_until(lambda: w.current()[1].metadata.resource_version == rv, 10, "the edit")
            net.black_hole = True
            wait_until(lambda: not w.current()[0], 10, "stale reported")
            net.black_hole = False
            wait_until(lambda: w.current()[0], 10, "synced again")
            assert w.lists == 1
        finally:
            w.stop()


class _Lagging:
    """The store's watch with a MODIFIED event still in flight: `current()` answers what
    the watch held when this was made (the fake API server delivers events at once, so
    the lag is this stub's)."""

    def __init__(self, watch: ConfigMapWatch) -> None:
        self.watch = watch
        self.frozen = watch.current()

    def current(self) -> tuple[bool, Any]:
        return self.frozen

    def stop(self) -> None:
        self.watch.stop()


def test_an_admin_edit_is_not_rolled_back_by_a_watch_that_lags_it(
    watched: tuple[FakeKubeAPI, ConfigMapStore, ServiceCore],
) -> None:
    """Found in review (session 15): SetTarget writes the ConfigMap and applies the new
    set, but the next tick read the targets from the watch, which still held the object
    the write replaced, and applied that (a model just added left the board, an old SLA
    or knobs came back) until the event arrived. While the watch shows the version our
    own write replaced, the store reads the API server."""
    _api, store, core = watched
    real = store._watch
    store._watch = _Lagging(real)
    core.set_target(model_entry("demo", sla={"ttft_p95_ms": 600, "itl_p95_ms": 50}))
    assert _ttft(core) == 600.0
    for _ in range(3):
        core.tick(core.clock.advance(1.0))  # type: ignore[attr-defined]
        assert _ttft(core) == 600.0
    store._watch = real  # the event arrives
    wait_until(lambda: store.watched_targets() is not None, 10, "the watch synced")
    for _ in range(3):
        core.tick(core.clock.advance(1.0))  # type: ignore[attr-defined]
        assert _ttft(core) == 600.0
