"""ASGI middleware: the governor's latency distribution on every engine response.

Use: `--middleware governor_engine.middleware.LatencyDistMiddleware` (printed by
`governor engine-args --live`). Each HTTP response of the engine gets

    X-Latency-Dist: p50=321ms,p90=789ms,p99=1240ms

the model's end-to-end request latency quantiles as the governor last observed them, so a
caller can pick its own timeout. The header is built from a cached value: a daemon thread
asks the governor (`BatchingService.GetLatencyDistribution`) every `refresh_s` seconds;
a response never waits for the governor. No header while there is nothing to say (no
governor, nothing observed yet, or the distribution older than `max_age_s`), and a
quantile without data is left out.

Settings as for the scheduler plugin (`governor_engine.limits.EngineSettings`), read from
the server's own arguments on the first request (`scope["app"].state.args`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from governor_engine.follower import LOG, Backoff, describe_error, open_channel
from governor_engine.limits import EngineSettings

HEADER = b"x-latency-dist"
REFRESH_S = 5.0
MAX_AGE_S = 300.0
MAX_AHEAD_S = 60.0
"""How far ahead of this engine's clock a distribution's `observed_at` may lie, seconds
(clock skew between pods); one further ahead, or not finite, is never sent: it had never
aged out, and clients set their timeouts from a governor gone for days."""
MAX_QUANTILE_MS = 86_400_000.0
"""A quantile past a day (ms) is left out of the header: no timeout anyone sets."""
CALL_TIMEOUT_S = 2.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def format_header(p50_ms: float | None, p90_ms: float | None, p99_ms: float | None) -> str | None:
    """`p50=321ms,p90=789ms,p99=1240ms` (whole milliseconds); None when all are missing.

    A missing, negative or non-finite quantile, or one past MAX_QUANTILE_MS, is left out."""
    parts = [
        f"{name}={round(v)}ms"
        for name, v in (("p50", p50_ms), ("p90", p90_ms), ("p99", p99_ms))
        if v is not None and 0 <= v <= MAX_QUANTILE_MS
    ]
    return ",".join(parts) or None


class LatencyDistCache:
    """The latest header value of one model, refreshed by a daemon thread.

    `fetch` (tests) returns (header or None, observed_at_unix_s); by default it calls the
    governor. `wall` gives Unix seconds (for the age check).
    """

    def __init__(
        self,
        settings: EngineSettings,
        *,
        refresh_s: float = REFRESH_S,
        max_age_s: float = MAX_AGE_S,
        fetch: Callable[[], tuple[str | None, float]] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.refresh_s = refresh_s
        self.max_age_s = max_age_s
        self._fetch = fetch or self._fetch_from_governor
        self._wall = wall
        self._value: tuple[bytes | None, float] = (None, 0.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: Any = None

    def header(self) -> bytes | None:
        """The header value to send now, or None. Never blocks."""
        value, observed_at = self._value
        age = self._wall() - observed_at
        if value is None or not -MAX_AHEAD_S <= age <= self.max_age_s:  # NaN: False
            return None
        return value

    def refresh(self) -> None:
        """Ask once and store the answer (a failure keeps the old value and raises)."""
        text, observed_at = self._fetch()
        self._value = (text.encode("ascii") if text else None, observed_at)

    def start(self) -> LatencyDistCache:
        """Start the refresh thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="governor-latency-dist", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the refresh thread."""
        self._stop.set()

    def _run(self) -> None:
        backoff = Backoff(self.refresh_s, max(self.refresh_s, 60.0))
        problem = ""  # the last failure's, warned once until it changes or clears
        while not self._stop.is_set():
            try:
                self.refresh()
                backoff.reset()
                delay = self.refresh_s
                if problem:
                    LOG.info("governor: latency distribution refreshed again")
                problem = ""
            except Exception as exc:  # keep the last value; retry later
                delay = backoff.next_delay_s()
                if (text := describe_error(exc)) != problem:
                    LOG.warning(
                        "governor %s: latency distribution not refreshed (%s); responses "
                        "carry the last one until it is %g s old",
                        self.settings.server,
                        text,
                        self.max_age_s,
                    )
                problem = text
            self._stop.wait(delay)

    def _fetch_from_governor(self) -> tuple[str | None, float]:
        from governor_api import governor_v1_pb2 as pb
        from governor_api import governor_v1_pb2_grpc as pb_grpc

        if self._channel is None:
            self._channel = open_channel(self.settings.server, self.settings.tls_ca_file)
        stub = pb_grpc.BatchingServiceStub(self._channel)
        resp = stub.GetLatencyDistribution(
            pb.GetBatchingConfigRequest(
                model=self.settings.model, engine_id=self.settings.engine_id
            ),
            timeout=CALL_TIMEOUT_S,
        )
        if not resp.present:
            return None, 0.0
        q = resp.e2e

        def get(name: str) -> float | None:
            return getattr(q, name) if q.HasField(name) else None

        return format_header(get("p50_ms"), get("p90_ms"), get("p99_ms")), resp.observed_at_unix_s


class LatencyDistMiddleware:
    """Adds `X-Latency-Dist` to HTTP responses (see the module docstring)."""

    def __init__(self, app: ASGIApp, cache: LatencyDistCache | None = None) -> None:
        self.app = app
        self._cache = cache
        self._resolved = cache is not None
        self._lock = threading.Lock()

    def _cache_for(self, scope: Scope) -> LatencyDistCache | None:
        if self._resolved:
            return self._cache
        with self._lock:
            if not self._resolved:
                self._cache = _cache_from_app(scope.get("app"))
                self._resolved = True
        return self._cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        cache = self._cache_for(scope)
        value = cache.header() if cache is not None else None
        if value is None:
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message.get("type") == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER]
                message["headers"] = [*headers, (HEADER, value)]
            await send(message)

        await self.app(scope, receive, send_with_header)


def _cache_from_app(app: Any) -> LatencyDistCache | None:
    """A started cache from the vLLM server's arguments, or None (no governor)."""
    args = getattr(getattr(app, "state", None), "args", None)
    extra = _additional_config(getattr(args, "additional_config", None))
    names = getattr(args, "served_model_name", None) or [getattr(args, "model", "") or ""]
    settings = EngineSettings.resolve(extra, str(names[0]))
    if not settings.server or not settings.model:
        LOG.warning("governor: no address; responses carry no X-Latency-Dist header")
        return None
    return LatencyDistCache(settings).start()


def _additional_config(value: Any) -> dict[str, Any] | None:
    """vLLM's `--additional-config` as a dict (it may still be a JSON string)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip():
        import json

        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None
