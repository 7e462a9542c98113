"""Security and input hardening of the governor's gRPC server.

Owns:

- `AdminToken`: the admin API's bearer token, read from a file (in-cluster: a key of a
  Kubernetes Secret mounted as a volume), re-read when the file changes (Secret
  rotation), compared in constant time (`hmac.compare_digest`). The token's bytes are
  never logged, never put in an error message and never part of `repr`.
- `AdminAuthInterceptor`: requires `authorization: Bearer <token>` on the AdminService
  methods only; the read-only engine (BatchingService), KEDA (ExternalScaler), health
  and reflection services stay open on the listeners the server was given. Without
  valid credentials an admin call ends with UNAUTHENTICATED before its request is read.
- `HardeningInterceptor`: parses each unary request itself, so malformed protobuf bytes
  end with INVALID_ARGUMENT (grpc's own answer would be an opaque INTERNAL), waits for it
  at most `REQUEST_WAIT_S` (a call that never sends it frees its RPC slot), holds no
  more than half the RPC slots for one client host (`CallLimiter`), and clips
  every error message a handler sends to `MAX_DETAIL_CHARS` (an echoed value must not
  overflow the 8 KiB trailing-metadata limit and turn a clear error into a transport
  failure).
- `StreamLimiter` (service.streams, re-exported here): a bound on concurrent watch
  streams (engines' WatchBatchingConfig and KEDA's StreamIsActive together), so
  long-lived streams cannot take every RPC slot, and one per client host, so one client
  cannot take every stream.
- TLS: server credentials from PEM files (optionally requiring client certificates
  signed by a CA: mTLS), re-read when the files change (`TlsReloader`: a renewed
  certificate in a mounted Secret serves the next connections without a restart), and
  the matching channel credentials for the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import os
import re
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from actuators.publisher import stream_slot
from service.streams import StreamLimiter, default_streams_per_client, peer_host

ADMIN_SERVICE = "governor.v1.AdminService"
ADMIN_METHOD_PREFIX = f"/{ADMIN_SERVICE}/"
MIN_TOKEN_BYTES = 16
MAX_TOKEN_BYTES = 4096
TOKEN_RELOAD_INTERVAL_S = 10.0
TLS_RELOAD_INTERVAL_S = 10.0
"""Seconds between checks of the TLS files for a change (on a new connection)."""
MAX_DETAIL_CHARS = 1024
# RFC 6750 b64token characters: what an HTTP/2 header value can carry as it is.
_TOKEN_CHARS = re.compile(rb"^[A-Za-z0-9\-._~+/]+=*$")


class SecurityConfigError(ValueError):
    """A token or TLS file that cannot be used (the message names the file, never its
    content)."""


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text` cut to at most `limit` characters, saying how long it was.

    Example: clip("x" * 5000, 40) -> 'xxxxxxxxxxxxxxxxxx... (5000 characters)'.
    """
    if len(text) <= limit:
        return text
    tail = f"... ({len(text)} characters)"
    return text[: max(0, limit - len(tail))] + tail


# ====================================================================== admin token
def read_token(path: str | Path) -> bytes:
    """The token in `path`, surrounding whitespace removed (a Secret written with a
    trailing newline works). SecurityConfigError when the file cannot be read, is empty,
    shorter than MIN_TOKEN_BYTES, longer than MAX_TOKEN_BYTES, or holds characters a
    bearer token cannot carry (RFC 6750: letters, digits, -._~+/ and trailing =)."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_TOKEN_BYTES + 64)
    except OSError as exc:
        raise SecurityConfigError(
            f"admin token file {p}: cannot read: {exc.strerror or type(exc).__name__}"
        ) from None
    token = raw.strip()
    if not token:
        raise SecurityConfigError(f"admin token file {p}: is empty")
    if len(token) > MAX_TOKEN_BYTES:
        raise SecurityConfigError(f"admin token file {p}: longer than {MAX_TOKEN_BYTES} bytes")
    if len(token) < MIN_TOKEN_BYTES:
        raise SecurityConfigError(
            f"admin token file {p}: the token is {len(token)} bytes; use at least "
            f"{MIN_TOKEN_BYTES} (e.g. `openssl rand -hex 32`)"
        )
    if not _TOKEN_CHARS.match(token):
        raise SecurityConfigError(
            f"admin token file {p}: holds characters a bearer token cannot carry "
            "(allowed: letters, digits, -._~+/ and trailing =)"
        )
    return token


class AdminToken:
    """The admin bearer token, from a file that may change (Secret rotation).

    The file is checked again at most every `reload_interval_s` seconds (monotonic);
    when its identity (inode, size, mtime) changed it is re-read. A file that became
    unreadable or invalid keeps the last good token and `reload_error` says why.
    Raises SecurityConfigError at construction when the file is not usable.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        reload_interval_s: float = TOKEN_RELOAD_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.reload_interval_s = reload_interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._token = read_token(self.path)
        self._stamp = self._file_stamp()
        self._checked_at = monotonic()
        self.reload_error = ""

    @classmethod
    def from_value(cls, token: str) -> AdminToken:
        """A fixed token (tests, embedding); the same rules as a file's content."""
        obj = cls.__new__(cls)
        value = token.strip().encode()
        if len(value) < MIN_TOKEN_BYTES or not _TOKEN_CHARS.match(value):
            raise SecurityConfigError(
                f"admin token: at least {MIN_TOKEN_BYTES} characters of [A-Za-z0-9-._~+/]"
            )
        obj.path = Path("<value>")
        obj.reload_interval_s = float("inf")
        obj._monotonic = time.monotonic
        obj._lock = threading.Lock()
        obj._token = value
        obj._stamp = None
        obj._checked_at = 0.0
        obj.reload_error = ""
        return obj

    def __repr__(self) -> str:  # never the token itself
        return f"AdminToken(path={str(self.path)!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for the serving process (service.serving), over a private socket
        pair: the path, the current token and the reload schedule, not the lock."""
        return {
            "path": self.path,
            "reload_interval_s": self.reload_interval_s,
            "token": self._token,
            "stamp": self._stamp,
            "reload_error": self.reload_error,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.reload_interval_s = state["reload_interval_s"]
        self._monotonic = time.monotonic
        self._lock = threading.Lock()
        self._token = state["token"]
        self._stamp = state["stamp"]
        self._checked_at = time.monotonic()
        self.reload_error = state["reload_error"]

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _current(self) -> bytes:
        now = self._monotonic()
        with self._lock:
            if now - self._checked_at < self.reload_interval_s:
                return self._token
            self._checked_at = now
            stamp = self._file_stamp()
            if stamp is not None and stamp == self._stamp:
                return self._token
            try:
                self._token = read_token(self.path)
                self._stamp = stamp
                self.reload_error = ""
            except SecurityConfigError as exc:
                self.reload_error = str(exc)  # keep the last good token
            return self._token

    def matches(self, authorization: str | None) -> bool:
        """True when `authorization` is `Bearer <the token>` (scheme case-insensitive).
        The comparison of the credential takes the same time wherever it differs."""
        if not authorization:
            return False
        scheme, _, credential = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(credential.strip().encode("utf-8", "replace"), self._current())


def _metadata_value(metadata: Any, key: str) -> str | None:
    for item in metadata or ():
        k, v = item[0], item[1]
        if k == key:
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
    return None


class AdminAuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for AdminService calls without `authorization: Bearer <token>`.

    `token` None: the admin API is disabled (every admin call is refused), unless
    `allow_unauthenticated` (tests, a loopback-only development server).
    `on_denied()` is called once per refused call (a metric), never with the credential.
    """

    def __init__(
        self,
        token: AdminToken | None,
        *,
        allow_unauthenticated: bool = False,
        on_denied: Callable[[], None] | None = None,
    ) -> None:
        self.token = token
        self.allow_unauthenticated = allow_unauthenticated
        self.on_denied = on_denied

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method or ""
        if not method.startswith(ADMIN_METHOD_PREFIX):
            return await continuation(handler_call_details)
        if self.token is None:
            if self.allow_unauthenticated:
                return await continuation(handler_call_details)
            message = (
                "the admin API is disabled: this governor was started without an admin "
                "token (governor run --admin-token-file FILE)"
            )
        else:
            header = _metadata_value(handler_call_details.invocation_metadata, "authorization")
            if self.token.matches(header):
                return await continuation(handler_call_details)
            message = (
                "the admin API needs credentials: send metadata 'authorization: Bearer "
                "<token>' (governor CLI: --token-file FILE or $GOVERNOR_ADMIN_TOKEN_FILE)"
                if header is None
                else "the admin API refused the credentials: wrong or malformed bearer token"
            )
        if self.on_denied is not None:
            with contextlib.suppress(Exception):
                self.on_denied()

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        return grpc.unary_unary_rpc_method_handler(deny)


# ====================================================================== hardening
class _ClippedContext:
    """A ServicerContext whose `abort`/`set_details` clip the message (see module doc)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()):
        await self._ctx.abort(code, clip(details or ""), trailing_metadata)

    def set_details(self, details: str) -> None:
        self._ctx.set_details(clip(details or ""))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


async def _parse(
    deserializer: Callable[[bytes], Any] | None,
    raw: Any,
    context: grpc.aio.ServicerContext,
    method: str,
) -> Any:
    if deserializer is None or not isinstance(raw, bytes | bytearray | memoryview):
        return raw
    try:
        return deserializer(bytes(raw))
    except Exception as exc:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"malformed request for {method}: not a valid protobuf message "
            f"({type(exc).__name__}); nothing was changed",
        )


REQUEST_WAIT_S = 10.0
"""The longest a unary-request call waits for its request message, seconds; then
DEADLINE_EXCEEDED. A call holds one of the --max-concurrent-rpcs slots from its headers
on: calls that never sent their message had held every slot from one connection, for as
long as it lived (its keepalive pings answered), and the health probes, KEDA and the
engines got RESOURCE_EXHAUSTED. A client sends a unary request with its headers."""


async def _one_request(requests: Any, context: grpc.aio.ServicerContext, method: str) -> Any:
    """The request message (raw bytes) of a unary-request call whose handler reads it as
    a stream (`HardeningInterceptor`): at most REQUEST_WAIT_S, else DEADLINE_EXCEEDED;
    none at all (the client half-closed first) is INVALID_ARGUMENT."""
    try:
        return await asyncio.wait_for(anext(aiter(requests)), REQUEST_WAIT_S)
    except TimeoutError:
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"no request message for {method} within {REQUEST_WAIT_S:g} s",
        )
    except StopAsyncIteration:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no request message for {method}")


class CallLimiter(StreamLimiter):
    """Unary calls, and streams until their request came, per client host
    (`HardeningInterceptor`, through `stream_slot`): at most `per_client` from one host
    (`PublicListeners`: half of --max-concurrent-rpcs), so that calls one host holds open
    (waiting REQUEST_WAIT_S for messages it never sends) leave the other half to
    everyone else (the kubelet's probes, KEDA, the engines). Streams past their request
    hold a slot of the stream limiter instead (--max-watch-streams-per-client: KEDA is
    one host with a stream per ScaledObject)."""

    def message(self, what: str, peer: str | None = None) -> str:
        """Why `try_acquire(peer)` refused `what`: `peer`'s host at its share, or every
        slot taken (the main and admin listeners share one limiter)."""
        host = peer_host(peer)
        if host is not None and self.client_active(peer) >= self.per_client:
            return (
                f"too many calls in progress from this client {host} (limit "
                f"{self.per_client}, half of --max-concurrent-rpcs); {what} was refused: "
                "retry later with backoff"
            )
        return (
            f"too many calls in progress (limit {self.limit}, --max-concurrent-rpcs); "
            f"{what} was refused: retry later with backoff"
        )


SERVICER_LIMITED_STREAMS = frozenset(
    {
        "/governor.v1.BatchingService/WatchBatchingConfig",
        "/externalscaler.ExternalScaler/StreamIsActive",
    }
)
"""Streams whose servicer takes a `StreamLimiter` slot itself, after checking the request
(an unknown model is NOT_FOUND, not RESOURCE_EXHAUSTED)."""


class HardeningInterceptor(grpc.aio.ServerInterceptor):
    """Parses unary requests itself (malformed bytes -> INVALID_ARGUMENT) and clips every
    error message handlers send. `streams`: every long-lived stream that does not take
    a slot of its own (grpc.health.v1 Health/Watch, reflection) holds one of it while it
    runs, so no client can hold every RPC slot (--max-concurrent-rpcs) with streams that
    need no credentials and leave no room for KEDA's, the engines' or the probes' unary
    calls; None: no bound. Streaming-request methods (reflection) are not parsed.
    `calls`: unary calls, and streams until their request came, per client host
    (`CallLimiter`); None: no bound. Every unary request is waited for at most
    REQUEST_WAIT_S (`_one_request`)."""

    def __init__(
        self, streams: StreamLimiter | None = None, calls: CallLimiter | None = None
    ) -> None:
        self.streams = streams
        self.calls = calls

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method or "?"
        streams = None if method in SERVICER_LIMITED_STREAMS else self.streams
        if handler.request_streaming:
            return _limited_request_stream(handler, streams, method)
        deserializer = handler.request_deserializer
        serializer = handler.response_serializer
        calls = self.calls
        # The request is read as a stream (the same on the wire), so that a call whose
        # message never comes ends after REQUEST_WAIT_S (`_one_request`).
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                async with stream_slot(calls, context, method):
                    raw = await _one_request(requests, context, method)
                    request = await _parse(deserializer, raw, context, method)
                    result = inner(request, _ClippedContext(context))
                    return await result if inspect.isawaitable(result) else result

            return grpc.stream_unary_rpc_method_handler(
                unary, request_deserializer=None, response_serializer=serializer
            )
        inner_stream = handler.unary_stream
        if inner_stream is None:
            return handler

        async def _stream_request(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            """A stream's request, read under a call slot: the stream holds a slot of
            `streams` (its own bound) from then on, not one of `calls`."""
            async with stream_slot(calls, context, method):
                raw = await _one_request(requests, context, method)
                return await _parse(deserializer, raw, context, method)

        if inspect.isasyncgenfunction(inner_stream):

            async def stream_gen(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                request = await _stream_request(requests, context)
                async with stream_slot(streams, context, method):
                    async for item in inner_stream(request, _ClippedContext(context)):
                        yield item

            wrapped: Any = stream_gen
        else:  # a coroutine that writes with context.write (grpc_health's Watch)

            async def stream_coro(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                request = await _stream_request(requests, context)
                async with stream_slot(streams, context, method):
                    result = inner_stream(request, _ClippedContext(context))
                    return await result if inspect.isawaitable(result) else result

            wrapped = stream_coro
        return grpc.stream_stream_rpc_method_handler(
            wrapped, request_deserializer=None, response_serializer=serializer
        )


def _limited_request_stream(
    handler: grpc.RpcMethodHandler, streams: StreamLimiter | None, method: str
) -> grpc.RpcMethodHandler:
    """A streaming-request handler (reflection's ServerReflectionInfo) holding a
    `streams` slot while it runs; unchanged otherwise."""
    inner = handler.stream_stream
    if streams is None or inner is None:
        return handler
    if inspect.isasyncgenfunction(inner):

        async def gen(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async with stream_slot(streams, context, method):
                async for item in inner(requests, context):
                    yield item

        wrapped: Any = gen
    else:

        async def coro(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async with stream_slot(streams, context, method):
                result = inner(requests, context)
                return await result if inspect.isawaitable(result) else result

        wrapped = coro
    return grpc.stream_stream_rpc_method_handler(
        wrapped,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


# ====================================================================== TLS
@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of the server's TLS: certificate chain, private key and, for mTLS, the
    CA that client certificates must be signed by."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    reload_interval_s: float = TLS_RELOAD_INTERVAL_S
    """How often the files are checked for a change, seconds (`TlsReloader`)."""


MAX_PEM_BYTES = 1024 * 1024
"""The largest TLS file read, bytes: four times a full public CA bundle (~230 KB); a
certificate flag pointed at /dev/zero had read until memory ran out."""


def _read_pem(path: str, what: str, marker: bytes) -> bytes:
    """The PEM file at `path` holding a `marker` block (at most MAX_PEM_BYTES);
    SecurityConfigError naming `what` and the file otherwise."""
    try:
        with Path(path).open("rb") as fh:
            data = fh.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise SecurityConfigError(
            f"{what} {path}: cannot read: {exc.strerror or type(exc).__name__}"
        ) from None
    if len(data) > MAX_PEM_BYTES:
        raise SecurityConfigError(f"{what} {path}: larger than {MAX_PEM_BYTES} bytes: not PEM")
    if b"-----BEGIN" not in data or marker not in data:
        raise SecurityConfigError(f"{what} {path}: not a PEM file holding a {marker.decode()}")
    return data


def _read_ca(path: str, what: str) -> bytes:
    """The CA certificates at `path` (`_read_pem`), each one parsed: a file that only
    names CERTIFICATE had been taken, and the server then failed to listen with an
    error about the address (or, on a reload, kept the old CA reporting success)."""
    data = _read_pem(path, what, b"CERTIFICATE")
    try:
        ssl.create_default_context().load_verify_locations(cadata=data.decode("latin-1"))
    except (ssl.SSLError, ValueError) as exc:
        why = exc.reason if isinstance(exc, ssl.SSLError) and exc.reason else exc
        raise SecurityConfigError(f"{what} {path}: not a usable CA certificate: {why}") from None
    return data


def _certificate_configuration(tls: TlsFiles) -> Any:
    """The server's certificate configuration read from `tls`'s files, the key checked
    against the certificate (a mismatched pair would fail every handshake).
    SecurityConfigError names the bad file."""
    cert = _read_pem(tls.cert_file, "TLS certificate file", b"CERTIFICATE")
    key = _read_pem(tls.key_file, "TLS key file", b"PRIVATE KEY")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            tls.cert_file, tls.key_file, password=lambda: b""
        )
    except (ssl.SSLError, OSError) as exc:
        why = exc.reason if isinstance(exc, ssl.SSLError) else exc.strerror
        raise SecurityConfigError(
            f"TLS key file {tls.key_file} and certificate file {tls.cert_file}: not a "
            f"usable pair (an unencrypted key of the certificate is needed): {why}"
        ) from None
    ca = None
    if tls.client_ca_file:
        ca = _read_ca(tls.client_ca_file, "TLS client CA file")
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


class TlsReloader:
    """The server's TLS, re-read when its files change: a Kubernetes Secret renewed by
    cert-manager is swapped in the mounted volume, and a certificate read once at start
    would be served until it expired (then KEDA's and the engines' handshakes fail).

    gRPC asks `fetch` before each new connection's handshake; the files are checked at
    most every `reload_interval_s` seconds (monotonic), re-read when one's identity
    (inode, size, mtime) changed, and served from the next connection on. A change that
    is not a usable pair (half written, a key of another certificate) keeps the last good
    configuration, and `reload_error` says why. Connections already open keep theirs.
    Raises SecurityConfigError at construction when the files are not usable.
    """

    def __init__(
        self,
        tls: TlsFiles,
        *,
        reload_interval_s: float = TLS_RELOAD_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tls = tls
        self.reload_interval_s = reload_interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._stamps = self._file_stamps()
        self._config = _certificate_configuration(tls)
        self._checked_at = monotonic()
        self.reloads = 0
        self.reload_error = ""

    def _file_stamps(self) -> tuple[tuple[int, int, int] | None, ...]:
        files = (self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file)
        out = []
        for path in files:
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            out.append(None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def fetch(self) -> Any:
        """A new certificate configuration when the files changed into a usable one,
        else None (gRPC keeps the current one). Never raises: it runs in gRPC's
        handshake path."""
        now = self._monotonic()
        with self._lock:
            if now - self._checked_at < self.reload_interval_s:
                return None
            self._checked_at = now
            stamps = self._file_stamps()
            if stamps == self._stamps:
                return None
            try:
                config = _certificate_configuration(self.tls)
            except SecurityConfigError as exc:
                self.reload_error = str(exc)  # keep serving the last good pair
                return None
            except Exception as exc:  # never into the handshake path
                self.reload_error = f"TLS files: {type(exc).__name__}: {exc}"
                return None
            self._stamps, self._config = stamps, config
            self.reloads += 1
            self.reload_error = ""
            return config

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that serve the current pair and pick up changes."""
        return grpc.dynamic_ssl_server_credentials(
            self._config, self.fetch, require_client_authentication=bool(self.tls.client_ca_file)
        )


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """gRPC server credentials from `tls`, re-read when the files change (`TlsReloader`);
    with a client CA, client certificates are required and verified (mTLS).
    SecurityConfigError names a bad file."""
    return TlsReloader(tls, reload_interval_s=tls.reload_interval_s).credentials()


def channel_credentials(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> grpc.ChannelCredentials:
    """Client credentials: trust `ca_file` (default: the system roots) and, for mTLS,
    present `cert_file`/`key_file` (both or neither)."""
    if bool(cert_file) != bool(key_file):
        raise SecurityConfigError("give both --tls-cert-file and --tls-key-file, or neither")
    ca = _read_ca(ca_file, "TLS CA file") if ca_file else None
    cert = _read_pem(cert_file, "TLS certificate file", b"CERTIFICATE") if cert_file else None
    key = _read_pem(key_file, "TLS key file", b"PRIVATE KEY") if key_file else None
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


__all__ = [
    "ADMIN_METHOD_PREFIX",
    "MAX_DETAIL_CHARS",
    "AdminAuthInterceptor",
    "AdminToken",
    "CallLimiter",
    "HardeningInterceptor",
    "SecurityConfigError",
    "StreamLimiter",
    "TlsFiles",
    "TlsReloader",
    "channel_credentials",
    "clip",
    "default_streams_per_client",
    "peer_host",
    "read_token",
    "server_credentials",
]
