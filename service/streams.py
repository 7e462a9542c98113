"""Watch-stream limits of the gRPC server: `StreamLimiter` bounds the long-lived streams
(engines' WatchBatchingConfig, KEDA's StreamIsActive, health Watch, reflection) open at
once, in all and per client host (`peer_host`: a gRPC peer without its port), so
streams cannot take every RPC slot and one client cannot take every stream. Used by the
servicers (actuators.engines, actuators.keda) and service.security's interceptor."""

from __future__ import annotations

import contextlib
import ipaddress
import threading
from collections.abc import Callable
from urllib.parse import unquote


def default_streams_per_client(limit: int) -> int:
    """The default bound on one client host's open watch streams: half of `limit` (the
    streams of every client), at least 1. Half, not less: KEDA's operator is one host
    holding a StreamIsActive stream per `external-push` ScaledObject, up to one per
    model, and a `limit` sized for every model's KEDA stream plus one engine stream per
    model gives KEDA at most half; the other half stays for every other client."""
    return max(1, limit // 2)


def canonical_ip(text: str) -> str | None:
    """`text` as an IP address in one spelling (an IPv4-mapped IPv6 address as its IPv4
    one: "::ffff:10.0.0.7" -> "10.0.0.7", "0:0::1" -> "::1"); None when it is no IP
    address (a name)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def peer_host(peer: str | None) -> str | None:
    """The client host of a gRPC peer (`context.peer()`), its port left out, so one
    host's many connections count together: "ipv4:10.0.0.7:54321" -> "10.0.0.7",
    "ipv6:[fd00::7]:54321" (or percent-encoded "%5B...%5D") -> "fd00::7", an IPv4
    client of a dual-stack listener ("ipv6:[::ffff:10.0.0.7]:1") -> "10.0.0.7", any
    Unix-socket client ("unix:...", "unix-abstract:...") -> "unix" (the same host).
    Another form is its own key as given; None or "" (unknown) -> None."""
    if not peer:
        return None
    scheme, sep, rest = unquote(peer).partition(":")
    if scheme in ("unix", "unix-abstract"):
        return "unix"
    if not sep or scheme not in ("ipv4", "ipv6"):
        return peer
    host = rest.rpartition(":")[0] if rest.rfind(":") > rest.rfind("]") else rest
    host = host.strip("[]")
    return canonical_ip(host.partition("%")[0]) or host or peer


class StreamLimiter:
    """At most `limit` concurrent watch streams, and at most `per_client` of them from
    one client host (`peer_host`; default `default_streams_per_client`). Thread-safe."""

    def __init__(
        self,
        limit: int,
        on_refused: Callable[[], None] | None = None,
        on_change: Callable[[], None] | None = None,
        *,
        per_client: int | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"stream limit must be >= 1 (got {limit})")
        per_client = default_streams_per_client(limit) if per_client is None else per_client
        if not 1 <= per_client <= limit:
            raise ValueError(
                f"per-client stream limit must be within [1, {limit}] (got {per_client})"
            )
        self.limit = limit
        self.per_client = per_client
        self.on_refused = on_refused
        self.on_change = on_change  # called after a slot was taken or given back
        self._active = 0
        self._by_client: dict[str, int] = {}
        self.peak = 0
        self.refused = 0
        self._lock = threading.Lock()

    @property
    def active(self) -> int:
        with self._lock:
            return self._active

    def client_active(self, peer: str | None) -> int:
        """Open streams of `peer`'s host."""
        host = peer_host(peer)
        with self._lock:
            return 0 if host is None else self._by_client.get(host, 0)

    def try_acquire(self, peer: str | None = None) -> bool:
        """Take a slot for a stream of `peer` (`context.peer()`; None: unknown, only the
        total applies); False (and counted as refused) when all are taken or `peer`'s
        host holds `per_client`."""
        host = peer_host(peer)
        with self._lock:
            held = 0 if host is None else self._by_client.get(host, 0)
            refused = self._active >= self.limit or held >= self.per_client
            if refused:
                self.refused += 1
            else:
                self._active += 1
                if host is not None:
                    self._by_client[host] = held + 1
                self.peak = max(self.peak, self._active)
        if refused and self.on_refused is not None:
            with contextlib.suppress(Exception):
                self.on_refused()
        if not refused:
            self._changed()
        return not refused

    def release(self, peer: str | None = None) -> None:
        """Give back a slot taken by `try_acquire(peer)` (the same `peer`)."""
        host = peer_host(peer)
        with self._lock:
            self._active = max(0, self._active - 1)
            if host is not None:
                held = self._by_client.pop(host, 0) - 1
                if held > 0:
                    self._by_client[host] = held
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            with contextlib.suppress(Exception):
                self.on_change()

    def message(self, what: str, peer: str | None = None) -> str:
        """Why `try_acquire(peer)` refused `what` (asked right after it, in the same step
        of the event loop): `peer`'s host at its own limit, or every slot taken."""
        host = peer_host(peer)
        with self._lock:
            own = host is not None and self._by_client.get(host, 0) >= self.per_client
        if own:
            return (
                f"too many open watch streams from this client {host} (limit "
                f"{self.per_client} per client, --max-watch-streams-per-client); {what} "
                "was refused: close the streams it no longer reads, or retry later"
            )
        return (
            f"too many open watch streams (limit {self.limit}); {what} was refused: retry "
            "later with backoff, or poll instead"
        )


__all__ = ["StreamLimiter", "canonical_ip", "default_streams_per_client", "peer_host"]
