"""A Kubernetes watch of one ConfigMap: its latest version kept in memory, no polling.

`ConfigMapWatch(core_api, namespace, name)` runs a thread that follows the API server's
list-then-watch contract:

1. LIST the ConfigMaps of the namespace with `fieldSelector=metadata.name=NAME`: the
   object (or none) and the list's resourceVersion;
2. WATCH from that resourceVersion (`watch=true`, `allowWatchBookmarks=true`,
   `timeoutSeconds`): ADDED / MODIFIED / DELETED events replace the kept object,
   BOOKMARK events only move the resourceVersion; when the server ends the stream
   (its timeout), watch again from the last resourceVersion seen;
3. when the resourceVersion has expired (`410 Gone`, as an ERROR event in the stream or
   as the answer), go back to 1: a fresh LIST, then WATCH from its resourceVersion.
   A connection failure waits `backoff_s` (doubling, at most `MAX_BACKOFF_S`) and
   watches again from the last resourceVersion;
4. a watch that hears nothing for `read_timeout_s` (`WATCH_READ_TIMEOUT_S`, 90 s: the
   API server sends a BOOKMARK about every minute to a watch that allows them) is
   taken for a dead connection (one black-holed without FIN or RST would otherwise
   look healthy until the server's timeout, minutes): it is closed, the kept object
   counts as stale from the last thing heard, and the watch starts again at once from
   the last resourceVersion (a LIST only if that has expired).

`current()` returns (synced, object): `synced` is False until the first LIST answered,
and while a failure (or silence, 4.) left the kept object possibly stale past
`stale_after_s`; callers then read the API server directly. Anything heard from the
API server on a watch (its answer to the request, any event, a BOOKMARK) ends that.
`on_change()` is called (from the watch thread) after every change of the kept object.
The object is the client's `V1ConfigMap`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

HTTP_GONE = 410
MAX_BACKOFF_S = 30.0
WATCH_READ_TIMEOUT_S = 90.0
"""Seconds a watch may hear nothing before its connection is taken for dead: 1.5x the
API server's BOOKMARK cadence (about one a minute, `allowWatchBookmarks`). A server that
sends none costs a new watch request (no LIST) per 90 s of silence."""


class _Gone(Exception):
    """The watch's resourceVersion has expired: re-list."""


class _Silent(Exception):
    """The watch heard nothing for `read_timeout_s`: watch again."""


class ConfigMapWatch:
    """Keeps the latest version of ConfigMap `namespace/name` (see the module doc)."""

    def __init__(
        self,
        core_api: Any,
        namespace: str,
        name: str,
        *,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 5.0,
        read_timeout_s: float = WATCH_READ_TIMEOUT_S,
        backoff_s: float = 0.5,
        stale_after_s: float = 60.0,
        on_change: Callable[[], None] | None = None,
        logger: Any = None,
    ) -> None:
        self.api = core_api
        self.namespace = namespace
        self.name = name
        self.watch_timeout_s = watch_timeout_s
        self.request_timeout_s = request_timeout_s
        self.read_timeout_s = read_timeout_s
        self.backoff_s = backoff_s
        self.stale_after_s = stale_after_s
        self.on_change = on_change
        self.log = logger or structlog.get_logger("governor.configmap_watch")
        self.lists = 0  # LIST calls made (1 at start, +1 per expiry)
        self._lock = threading.Lock()
        self._object: Any = None
        self._synced = False
        self._failing_since: float | None = None
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(
            target=self._run, name=f"watch-configmap-{name}", daemon=True
        )

    # ------------------------------------------------------------------ public
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """End the watch: the open stream is closed (the thread would otherwise sit in
        it until the server's timeout, minutes) and the thread joined for at most
        `timeout_s` seconds (it is a daemon: shutdown never waits longer)."""
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()
            resp = getattr(w, "_resp", None)  # the client keeps the open response here
            if resp is not None:
                with contextlib.suppress(Exception):
                    resp.close()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the first LIST answered (at most `timeout_s`); whether it did."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.current()[0]:
                return True
            time.sleep(0.01)
        return False

    def current(self) -> tuple[bool, Any]:
        """(synced, the kept ConfigMap or None when it does not exist)."""
        with self._lock:
            stale = (
                self._failing_since is not None
                and time.monotonic() - self._failing_since > self.stale_after_s
            )
            return self._synced and not stale, self._object

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        rv: str | None = None
        delay = self.backoff_s
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                rv = self._watch_from(rv)
                delay = self.backoff_s
                with self._lock:
                    self._failing_since = None
            except _Gone:
                self.log.info("configmap_watch_expired", configmap=self.name)
                rv = None
            except _Silent:
                self.log.warning(
                    "configmap_watch_silent",
                    configmap=self.name,
                    silent_s=self.read_timeout_s,
                    action="connection closed; watching again",
                )
                with self._lock:
                    heard = time.monotonic() - self.read_timeout_s
                    self._failing_since = self._failing_since or heard
            except Exception as exc:
                if self._stop.is_set():
                    break
                with self._lock:
                    self._failing_since = self._failing_since or time.monotonic()
                self.log.warning("configmap_watch_failed", configmap=self.name, error=repr(exc))
                self._stop.wait(delay)
                delay = min(MAX_BACKOFF_S, delay * 2)

    def _list(self) -> str:
        from kubernetes.client.exceptions import ApiException

        self.lists += 1
        try:
            out = self.api.list_namespaced_config_map(
                self.namespace,
                field_selector=f"metadata.name={self.name}",
                _request_timeout=self.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                raise _Gone from None
            raise
        items = [i for i in out.items or [] if i.metadata.name == self.name]
        self._set(items[0] if items else None)
        with self._lock:
            self._synced = True
            self._failing_since = None
        return str(out.metadata.resource_version)

    def _watch_from(self, rv: str) -> str:
        """One watch request from `rv` until the server ends it; the last rv seen."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import ReadTimeoutError

        list_fn = self.api.list_namespaced_config_map

        @functools.wraps(list_fn)
        def answered(*args: Any, **kw: Any) -> Any:
            resp = list_fn(*args, **kw)
            if 200 <= int(getattr(resp, "status", 200)) <= 299:
                self._heard()  # the server answered: nothing since `rv` is missed
            return resp

        w = watch.Watch()
        self._watch = w
        try:
            for event in w.stream(
                answered,
                self.namespace,
                field_selector=f"metadata.name={self.name}",
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_s,
                _request_timeout=(self.request_timeout_s, self.read_timeout_s),
            ):
                self._heard()
                kind, obj = event.get("type"), event.get("object")
                if kind in ("ADDED", "MODIFIED"):
                    self._set(obj)
                elif kind == "DELETED":
                    self._set(None)
                if self._stop.is_set():
                    break
        except ApiException as exc:
            if exc.status == HTTP_GONE:
                raise _Gone from None
            raise
        except ReadTimeoutError:
            raise _Silent from None
        finally:
            self._watch = None
        return str(w.resource_version or rv)

    def _heard(self) -> None:
        """The API server was heard on the watch: the kept object is current again."""
        if self._failing_since is not None:
            with self._lock:
                self._failing_since = None

    def _set(self, obj: Any) -> None:
        with self._lock:
            old = self._object
            self._object = obj
        old_rv = old.metadata.resource_version if old is not None else None
        new_rv = obj.metadata.resource_version if obj is not None else None
        if old_rv != new_rv and self.on_change is not None:
            try:
                self.on_change()
            except Exception as exc:
                self.log.error("configmap_watch_listener_failed", error=repr(exc))
