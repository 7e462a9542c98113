"""The store in Kubernetes: targets and state in two ConfigMaps (see service.store for
the documents and the `Store` protocol).

The state ConfigMap holds the JSON document gzip-compressed, in `binaryData` key
`state.json.gz` (the key is the format marker); the plain `data` key `state.json` that
earlier versions wrote is still read, and dropped by the next write. A ConfigMap holds at
most 1 MiB of values (`data` + decoded `binaryData`, checked by the API server): the
state of 1,000 models is ~3 MB of JSON but ~0.3 MB gzipped (measured: README
"Performance"). Content that does not fit even so is refused here, before the API call,
with an error naming its size and the limit: never written truncated.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import structlog
import yaml

from controller.targets import TargetsDoc
from service.store import (
    MAX_STATE_BYTES,
    STATE_KEY,
    TARGETS_KEY,
    ConflictError,
    StateDoc,
    StoredTargets,
    StoreError,
    TargetsInvalidError,
    parse_json_bytes,
    parse_state,
    parse_targets_yaml,
)

STATE_GZ_KEY = "state.json.gz"
"""The state's `binaryData` key: the JSON document, gzip-compressed. (`STATE_KEY` is the
plain `data` key of earlier versions: read, never written.)"""
CONFIGMAP_MAX_BYTES = 1024 * 1024
"""The most a ConfigMap's `data` + `binaryData` may hold (bytes of the values; binaryData
decoded), as the API server validates it (`MaxSecretSize`, 1 MiB)."""


class ConfigMapStore:
    """Targets in ConfigMap `name` (key `targets.yaml`) and state in `name-state` (key
    `state.json`), in `namespace`, through the official kubernetes client.

    Writes carry the resourceVersion they read (optimistic concurrency; the API server
    answers 409 when it moved); transient failures (5xx, timeouts) are retried with
    backoff by `actuators.kubeapi.call_with_retries`. Other keys, labels and
    annotations of the ConfigMaps (e.g. Helm's) are kept as they are.
    """

    def __init__(
        self,
        core_api: Any,
        namespace: str,
        name: str = "governor-targets",
        *,
        request_timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        sleep: Callable[[float], None] | None = None,
        logger: Any = None,
    ) -> None:
        self.api = core_api
        self.namespace = namespace
        self.name = name
        self.state_name = f"{name}-state"
        self.description = f"configmap {namespace}/{name}"
        self.timeout_s = request_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._log = logger or structlog.get_logger("governor.store")
        self._lock = threading.Lock()
        self._watch: Any = None
        self._parsed: tuple[str, StoredTargets | TargetsInvalidError] | None = None
        self._replaced_rv: str | None = None
        """The targets' resourceVersion our last write replaced (`watched_targets`)."""
        self._may_write: Callable[[], bool] | None = None

    def set_write_check(self, may_write: Callable[[], bool] | None) -> None:
        """Set `may_write()`, asked before each attempt to write the state (ServiceCore
        sets the elector's `is_leader`): a 409 means another writer got there first,
        and a re-read and retry must not write over a new leader's state."""
        self._may_write = may_write

    # ------------------------------------------------------------------ watch
    def start_watch(self, **watch_kw: Any) -> None:
        """Follow the targets ConfigMap with a Kubernetes watch (service.cmwatch), so
        `watched_targets` reads memory instead of the API server."""
        from service.cmwatch import ConfigMapWatch

        if self._watch is None:
            self._watch = ConfigMapWatch(
                self.api, self.namespace, self.name, logger=self._log, **watch_kw
            )
            self._watch.start()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def watched_targets(self) -> StoredTargets | None:
        """The targets as the watch last saw them (no API call); read from the API
        server instead while the watch is not running or not synced."""
        synced, cm = self._watch.current() if self._watch is not None else (False, None)
        if not synced:
            return self.load_targets()
        seen_rv = str(cm.metadata.resource_version) if cm is not None else None
        if seen_rv is not None and seen_rv == self._replaced_rv:
            # Our own write has not reached the watch yet: what it shows is the set that
            # write replaced, and applying it would roll the edit back for a tick (a model
            # just added gone from the board, the old knobs published again).
            return self.load_targets()
        return self._targets_of(cm)

    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        from actuators.kubeapi import call_with_retries

        return call_with_retries(
            lambda: fn(*args, _request_timeout=self.timeout_s, **kw),
            retries=self.retries,
            backoff_s=self.backoff_s,
            sleep=self._sleep,
            what=f"{fn.__name__} {self.namespace}",
        )

    def _get(self, name: str) -> Any | None:
        from actuators.kubeapi import KubeCallError

        try:
            return self._call(self.api.read_namespaced_config_map, name, self.namespace)
        except KubeCallError as exc:
            if exc.status == 404:
                return None
            raise StoreError(f"configmap {self.namespace}/{name}: {exc}") from None

    def _put(
        self,
        name: str,
        current: Any | None,
        rv: str | None,
        *,
        data: Mapping[str, str] | None = None,
        binary: Mapping[str, bytes] | None = None,
        drop: tuple[str, ...] = (),
        what: str = "",
    ) -> str:
        """Create or replace `name` with `data` (text) and `binary` (bytes, sent base64 as
        `binaryData`) set and the keys in `drop` removed, other keys kept; returns the new
        resourceVersion. ConflictError on 409 (someone else wrote it first); StoreError
        naming the size and the limit when the values would total over
        `CONFIGMAP_MAX_BYTES` (checked here, as the API server would refuse it)."""
        from actuators.kubeapi import KubeCallError

        where = f"configmap {self.namespace}/{name}"
        old_data = dict(current.data or {}) if current is not None else {}
        old_binary = dict(current.binary_data or {}) if current is not None else {}
        new_data = {k: v for k, v in old_data.items() if k not in drop} | dict(data or {})
        new_binary = {k: v for k, v in old_binary.items() if k not in drop} | {
            k: base64.b64encode(v).decode() for k, v in (binary or {}).items()
        }
        size = configmap_size(new_data, new_binary)
        if size > CONFIGMAP_MAX_BYTES:
            raise StoreError(
                f"{where}: {what or 'the new content'} makes {size:,} bytes of data + "
                f"binaryData, over a ConfigMap's limit of {CONFIGMAP_MAX_BYTES:,} bytes "
                "(1 MiB): not written"
            )
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if current is None:
            meta["labels"] = {"app.kubernetes.io/managed-by": "llm-governor"}
        else:
            meta |= {
                "resourceVersion": rv,
                "labels": dict(current.metadata.labels or {}),
                "annotations": dict(current.metadata.annotations or {}),
            }
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
        if new_data:
            body["data"] = new_data
        if new_binary:
            body["binaryData"] = new_binary
        try:
            if current is None:
                out = self._call(self.api.create_namespaced_config_map, self.namespace, body)
            else:
                out = self._call(self.api.replace_namespaced_config_map, name, self.namespace, body)
        except KubeCallError as exc:
            if exc.status == 409:
                raise ConflictError(f"{where}: changed concurrently ({exc.reason})") from None
            raise StoreError(f"{where}: {exc}") from None
        return str(out.metadata.resource_version)

    # ------------------------------------------------------------------ targets
    def load_targets(self) -> StoredTargets | None:
        return self._targets_of(self._get(self.name))

    def _targets_of(self, cm: Any) -> StoredTargets | None:
        """The targets of ConfigMap `cm` (parsed once per resourceVersion)."""
        if cm is None or TARGETS_KEY not in (cm.data or {}):
            return None
        rev = str(cm.metadata.resource_version)
        parsed = self._parsed
        if parsed is None or parsed[0] != rev:
            where = f"configmap {self.namespace}/{self.name} key {TARGETS_KEY}"
            try:
                result: StoredTargets | TargetsInvalidError = StoredTargets(
                    rev, parse_targets_yaml(cm.data[TARGETS_KEY], where, rev)
                )
            except TargetsInvalidError as exc:
                result = exc
            parsed = self._parsed = (rev, result)
        if isinstance(parsed[1], TargetsInvalidError):
            raise parsed[1]
        return parsed[1]

    def save_targets(self, doc: TargetsDoc, expected_revision: str | None) -> str:
        """Write `doc` to the key `targets.yaml` (see `Store.save_targets`).

        A ConfigMap that exists without that key (created by hand or by a chart with
        other keys only) holds no targets: its targets revision is "" (as
        `load_targets` reports None), so the seeding write (`expected_revision` "")
        adds the key, keeping the other keys, under the ConfigMap's resourceVersion.
        """
        with self._lock:
            cm = self._get(self.name)
            rv = str(cm.metadata.resource_version) if cm is not None else ""
            has_key = cm is not None and TARGETS_KEY in (cm.data or {})
            current = rv if has_key else ""
            if expected_revision is not None and expected_revision != current:
                raise ConflictError(
                    f"targets changed: at revision {current or 'none'}, not {expected_revision}"
                )
            text = yaml.safe_dump(doc.model_dump(mode="json"), sort_keys=False)
            what = f"{TARGETS_KEY} ({len(doc.models)} models, {len(text.encode()):,} bytes)"
            new_rv = self._put(self.name, cm, rv or None, data={TARGETS_KEY: text}, what=what)
            self._replaced_rv = rv or None
            return new_rv

    # ------------------------------------------------------------------ state
    def load_state(self) -> StateDoc | None:
        """The state: gzip-compressed JSON in binaryData `state.json.gz`, or the plain
        JSON in data `state.json` an earlier version wrote; None when neither is there."""
        cm = self._get(self.state_name)
        if cm is None:
            return None
        where = f"configmap {self.namespace}/{self.state_name}"
        packed = (cm.binary_data or {}).get(STATE_GZ_KEY)
        if packed is not None:
            where += f" binaryData {STATE_GZ_KEY}"
            text = _gunzip(packed, where)
        elif STATE_KEY in (cm.data or {}):
            where += f" key {STATE_KEY}"
            text = cm.data[STATE_KEY].encode()
        else:
            return None
        return parse_state(parse_json_bytes(text, where), where)

    def save_state(self, doc: StateDoc) -> None:
        """Write `doc` gzip-compressed to binaryData `state.json.gz` (dropping the plain
        key of earlier versions). StoreError naming the sizes and the limit when even
        compressed it does not fit a ConfigMap (nothing is written then), or when the
        write check (`set_write_check`) says this instance no longer leads."""
        text = json.dumps(doc.model_dump(mode="json"), sort_keys=True).encode()
        packed = gzip.compress(text, compresslevel=6, mtime=0)
        what = (
            f"the state of {len(doc.models)} models ({len(text):,} bytes of JSON, "
            f"{len(packed):,} gzipped)"
        )
        with self._lock:
            for attempt in range(2):
                if self._may_write is not None and not self._may_write():
                    raise StoreError(
                        f"{self.description}: state not saved: this instance no longer leads"
                    )
                cm = self._get(self.state_name)
                rv = str(cm.metadata.resource_version) if cm is not None else None
                try:
                    self._put(
                        self.state_name,
                        cm,
                        rv,
                        binary={STATE_GZ_KEY: packed},
                        drop=(STATE_KEY,),
                        what=what,
                    )
                    return
                except ConflictError:
                    if attempt == 1:
                        raise


def _gunzip(packed: str, where: str) -> bytes:
    """The gzip member in base64 `packed`, inflated to at most MAX_STATE_BYTES (one byte
    more is refused, not inflated further); StoreError naming `where` for what is not
    base64, not gzip, truncated or larger."""
    try:
        inflater = zlib.decompressobj(wbits=31)  # a gzip header and trailer
        data = inflater.decompress(base64.b64decode(packed, validate=True), MAX_STATE_BYTES + 1)
    except (binascii.Error, zlib.error) as exc:
        raise StoreError(f"{where}: not gzip-compressed base64: {exc}") from None
    if len(data) > MAX_STATE_BYTES:
        raise StoreError(f"{where}: inflates past {MAX_STATE_BYTES} bytes")
    if not inflater.eof:
        raise StoreError(f"{where}: not gzip-compressed base64: truncated")
    return data


def configmap_size(data: Mapping[str, str], binary_data: Mapping[str, str]) -> int:
    """Bytes of a ConfigMap's values as the API server counts them against
    `CONFIGMAP_MAX_BYTES`: UTF-8 bytes of each `data` value plus the decoded bytes of each
    base64 `binaryData` value (keys do not count)."""
    total = sum(len(v.encode()) for v in data.values())
    for v in binary_data.values():
        n = len(v.rstrip("="))
        total += n * 3 // 4
    return total
