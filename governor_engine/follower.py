"""Follow a model's batching knobs from the governor on a background thread.

`KnobFollower` holds one `WatchBatchingConfig` stream open on a daemon thread and keeps
the latest valid answer as an immutable `KnobUpdate`; `latest()` reads it without locking
or blocking, so an engine's scheduler can call it at the start of every step. The
follower never raises into its caller: a governor that is down, refuses the model or
ends the stream leaves the last values in place while the thread retries with
exponential backoff (jittered, capped). Times are seconds.

The channel is plain gRPC (`GOVERNOR_TLS_CA_FILE` or `tls_ca_file`: TLS with that CA);
the BatchingService needs no credentials.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A child of vLLM's logger: inside an engine its handler prints our lines with vLLM's.
LOG = logging.getLogger("vllm.governor_engine")

SERVER_ENV = "GOVERNOR_SERVER"
MODEL_ENV = "GOVERNOR_MODEL"
TLS_CA_ENV = "GOVERNOR_TLS_CA_FILE"
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_STREAM_S = 30.0
"""How long a stream must have stayed open before its end starts the retries from
BACKOFF_INITIAL_S again, seconds: a peer that answers once and hangs up (a proxy that
cuts streams) had been reconnected every ~0.5 s, forever, a warning each time."""
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000
"""The channel's HTTP/2 pings, ms: one every 30 s on the open stream (the governor
accepts one per 10 s), the connection given up 10 s after one goes unanswered (a
partition found out in ~40 s). The
governor only sends on a change: without them a dead governor node or a partition (no
FIN, no RST) left the stream open and silent, the engine on its last knobs, with no
warning."""


@dataclass(frozen=True, slots=True)
class KnobUpdate:
    """One batching config from the governor: the knobs, its generation, when it came
    (monotonic seconds of this process)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    generation: int
    received_at_s: float


def open_channel(server: str, tls_ca_file: str | None = None) -> Any:
    """A gRPC channel to `server` (host:port); TLS trusting `tls_ca_file` when given;
    keepalive pings (KEEPALIVE_TIME_MS) so a silent peer is found out."""
    import grpc

    options = [
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # the wait for a ping's ack: 60 s by default whatever keepalive_timeout_ms says
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if tls_ca_file:
        with open(tls_ca_file, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        return grpc.secure_channel(server, creds, options=options)
    return grpc.insecure_channel(server, options=options)


class Backoff:
    """Exponential retry delays: `initial_s` doubling up to `max_s`, with +-20 % jitter."""

    def __init__(
        self,
        initial_s: float = BACKOFF_INITIAL_S,
        max_s: float = BACKOFF_MAX_S,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self._next_s = initial_s
        self._rng = rng or random.Random()

    def reset(self) -> None:
        """Start again from `initial_s` (after a success)."""
        self._next_s = self.initial_s

    def next_delay_s(self) -> float:
        """The delay before the next attempt, seconds."""
        delay = self._next_s * self._rng.uniform(0.8, 1.2)
        self._next_s = min(self.max_s, self._next_s * 2)
        return min(delay, self.max_s)


class KnobFollower:
    """Keeps the latest `KnobUpdate` of `model` from the governor at `server`.

    `channel_factory` (tests) builds the channel from the address; `clock` gives
    monotonic seconds. `start()` launches the daemon thread; `stop()` ends it.
    """

    def __init__(
        self,
        server: str,
        model: str,
        engine_id: str = "",
        *,
        tls_ca_file: str | None = None,
        backoff: Backoff | None = None,
        channel_factory: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not server:
            raise ValueError("the governor's address is empty (set a flag or $GOVERNOR_SERVER)")
        if not model:
            raise ValueError("the model name is empty")
        self.server = server
        self.model = model
        self.engine_id = engine_id
        self._tls_ca_file = tls_ca_file
        self._backoff = backoff or Backoff()
        self._channel_factory = channel_factory or (lambda s: open_channel(s, tls_ca_file))
        self._clock = clock
        self._latest: KnobUpdate | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: Any = None
        self._connected = False
        self._refused: tuple[int, int] | None = None  # the last refused knobs, logged once
        self.failures = 0
        """Failed or ended streams so far (read-only for callers)."""

    def latest(self) -> KnobUpdate | None:
        """The newest valid config, or None before the first one. Never blocks."""
        return self._latest

    def start(self) -> KnobFollower:
        """Start following on a daemon thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"governor-knobs-{self.model}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (cancels an open stream)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            opened_at = self._clock()
            try:
                self._follow_once()
                problem = "the governor ended the stream"
            except Exception as exc:  # never let the thread die: log and retry
                problem = describe_error(exc)
            if self._stop.is_set():
                return
            self.failures += 1
            if self._connected and self._clock() - opened_at >= STABLE_STREAM_S:
                self._backoff.reset()  # a stream that served: retry soon
            delay = self._backoff.next_delay_s()
            if self._connected or self.failures == 1:
                LOG.warning(
                    "governor %s: %s; keeping max_num_seqs/max_num_batched_tokens %s, "
                    "retrying (next in %.1f s)",
                    self.server,
                    problem,
                    _knobs_text(self._latest),
                    delay,
                )
            self._connected = False
            self._stop.wait(delay)

    def _follow_once(self) -> None:
        from governor_api import governor_v1_pb2 as pb
        from governor_api import governor_v1_pb2_grpc as pb_grpc

        channel = self._channel_factory(self.server)
        try:
            stub = pb_grpc.BatchingServiceStub(channel)
            request = pb.GetBatchingConfigRequest(model=self.model, engine_id=self.engine_id)
            self._call = stub.WatchBatchingConfig(request)
            for msg in self._call:
                if self._stop.is_set():
                    return
                self._accept(msg.max_num_seqs, msg.max_num_batched_tokens, msg.generation)
        finally:
            self._call = None
            channel.close()

    def _accept(self, seqs: int, tokens: int, generation: int) -> None:
        """Store a config when both knobs are positive; log a refused one once (a peer
        repeating it had written ~0.7 MB of log a second)."""
        if seqs <= 0 or tokens <= 0:
            if self._refused != (seqs, tokens):
                LOG.warning(
                    "governor %s sent non-positive knobs (%d, %d); ignored (logged once)",
                    self.server,
                    seqs,
                    tokens,
                )
            self._refused = (seqs, tokens)
            return
        if not self._connected:
            LOG.info("governor %s: following model %r", self.server, self.model)
        self._connected = True
        self._latest = KnobUpdate(seqs, tokens, generation, self._clock())


def _knobs_text(update: KnobUpdate | None) -> str:
    if update is None:
        return "at the engine's start values"
    return f"at {update.max_num_seqs}/{update.max_num_batched_tokens}"


def describe_error(exc: Exception) -> str:
    """`CODE: details` of a gRPC error, `Type: message` of any other."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if callable(code) and callable(details):
        try:
            return f"{code().name}: {details()}"
        except Exception:
            pass
    return f"{type(exc).__name__}: {exc}"


def server_from_env(explicit: str | None = None) -> str:
    """The governor's address: `explicit` when given, else $GOVERNOR_SERVER, else ''."""
    return explicit or os.environ.get(SERVER_ENV, "")
