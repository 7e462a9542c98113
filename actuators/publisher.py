"""The decision board: the latest published decision per model, read by engines and KEDA.

The board is an `Actuator`: the control loop applies each tick's valid, non-paused
decisions to it, and the gRPC services (BatchingService, KEDA's ExternalScaler) answer
from it without waiting on anything else. It owns:

- the latest value per model (`Published`): knobs with a generation number that grows
  by one on every knob change, desired replicas (None until the first decision), the
  reason and the wall time of the decision;
- change notification: `subscribe(fn)` calls `fn()` after every change (from the
  writer's thread; `fn` must be quick and must not raise), `wait(version, timeout_s)`
  blocks a thread until the board moves past `version`, and `watch()` is the asyncio
  form used by streaming RPC handlers;
- `close()`: wakes every watcher for good (graceful shutdown ends streams with OK);
- `hold()` / `commit()`: changes made while held are kept from the readers (`get`,
  `snapshot`, `models`, watchers, the serving process's feed) until `commit`; the
  leader holds each tick's changes until the state holding them is saved
  (`pending()` is what it saves), so a process killed in between never served a
  generation its restart takes back.

Invariants: an invalid decision never changes the board (missing data never reads as
zero); a value served lies within the model's bounds as configured now (`configure`
moves a kept value inside narrowed ones); generations never decrease, also across
restarts (`restore`) and leader changes (`follow`: a follower mirrors the leader's
published values, generations included).
Thread-safe: one lock guards the entries; readers get immutable `Published` values.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import grpc
import structlog

from controller.types import Decision, Knobs, Reason
from estimators.types import LatencyQuantiles, Observation, latency_quantiles

ORIGIN_DEFAULT = "default"  # configured default knobs, nothing decided yet
ORIGIN_DECISION = "decision"  # this instance's loop decided it
ORIGIN_RESTORED = "restored"  # loaded from persisted state at start-up
ORIGIN_LEADER = "leader"  # mirrored from the leader's published state


@dataclass(frozen=True, slots=True)
class ModelSlot:
    """What the board needs to know about a configured model."""

    name: str
    namespace: str
    default_knobs: Knobs
    ceiling: Knobs | None = None
    """The largest knobs the governor may choose (the knob bounds' maxima), served to
    engines that follow the knobs live; None: not known."""
    floor: Knobs | None = None
    """The smallest knobs the governor may choose (the knob bounds' minima); None: not
    known."""
    replicas: tuple[int, int] | None = None
    """The model's replica bounds (min, max), pods; None: not known."""

    def bound(self, p: Published) -> tuple[Published, list[tuple[str, int, int]]]:
        """`p` with its knobs and replicas moved inside this slot's bounds (`Knobs.within`
        floor and ceiling, replicas within (min, max)), a knob change in a new generation
        with reason KNOBS_CHANGED (as the decider's next tick names it); and each field
        moved as (field, old, new). Bounds not known are not applied; no replicas (None)
        stay None."""
        moved: list[tuple[str, int, int]] = []
        knobs, replicas = p.knobs, p.replicas
        if self.floor is not None and self.ceiling is not None:
            knobs = knobs.within(self.floor, self.ceiling)
            for field in ("max_num_seqs", "max_num_batched_tokens"):
                before, after = getattr(p.knobs, field), getattr(knobs, field)
                if before != after:
                    moved.append((field, before, after))
        if replicas is not None and self.replicas is not None:
            lo, hi = self.replicas
            replicas = min(max(replicas, lo), hi)
            if replicas != p.replicas:
                moved.append(("replicas", p.replicas, replicas))
        if not moved:
            return p, moved
        if knobs != p.knobs:
            reason = Reason.KNOBS_CHANGED.value
            p = replace(p, knobs=knobs, generation=p.generation + 1, reason=reason)
        return replace(p, replicas=replicas), moved


LATENCY_SIGNALS = ("ttft", "itl", "e2e")
"""The latency signals served to engines (`X-Latency-Dist`) and in `governor status`."""


@dataclass(frozen=True, slots=True)
class LatencyDistribution:
    """A model's latency distribution as last observed, ms per quantile (None = no
    data), and the wall time (Unix seconds) it was taken from the observation."""

    ttft: LatencyQuantiles
    itl: LatencyQuantiles
    e2e: LatencyQuantiles
    observed_at_unix_s: float

    @classmethod
    def of(cls, obs: Observation, wall_s: float) -> LatencyDistribution | None:
        """The distribution in `obs`; None when it holds no latency quantile at all."""
        q = {s: latency_quantiles(obs, s) for s in LATENCY_SIGNALS}
        if all(v == LatencyQuantiles() for v in q.values()):
            return None
        return cls(ttft=q["ttft"], itl=q["itl"], e2e=q["e2e"], observed_at_unix_s=wall_s)


@dataclass(frozen=True, slots=True)
class Published:
    """The value engines and KEDA are served for one model.

    `replicas` is None until a decision (or restored state) provides one: KEDA then gets
    UNAVAILABLE, so the HPA keeps the current size rather than reading a zero.
    `generation` counts knob changes, a change of the configured defaults included (0 =
    the defaults the model was configured with, nothing changed). `decided_at_unix_s` is
    the wall time (Unix seconds) of the last decision applied, None if never.
    """

    model: str
    namespace: str
    knobs: Knobs
    generation: int
    replicas: int | None
    reason: str
    decided_at_unix_s: float | None
    origin: str = ORIGIN_DEFAULT
    latency: LatencyDistribution | None = None
    """The model's last observed latency distribution (engines' `X-Latency-Dist`);
    kept through ticks without latency data, mirrored by followers."""

    @property
    def active(self) -> bool | None:
        """KEDA's IsActive: desired replicas > 0; None when unknown."""
        return None if self.replicas is None else self.replicas > 0


class StreamSlots(Protocol):
    """A bound on open watch streams, shared by the board's streaming readers (engines'
    WatchBatchingConfig, KEDA's StreamIsActive); service.security.StreamLimiter is one."""

    def try_acquire(self, peer: str | None = None) -> bool:
        """Take a slot for a stream of client `peer` (gRPC's `context.peer()`); False
        when all are taken, or `peer`'s own share (the caller refuses the stream)."""
        ...

    def release(self, peer: str | None = None) -> None:
        """Give back a slot taken by `try_acquire(peer)`."""
        ...

    def message(self, what: str, peer: str | None = None) -> str:
        """The refusal message for a stream of kind `what` from `peer`."""
        ...


@contextlib.asynccontextmanager
async def stream_slot(
    streams: StreamSlots | None, context: grpc.aio.ServicerContext, what: str
) -> AsyncIterator[None]:
    """Hold a `streams` slot for the calling client (`context.peer()`) while a stream of
    kind `what` runs: RESOURCE_EXHAUSTED naming the limit when none is free; given back
    however the stream ends. None: no bound."""
    if streams is None:
        yield
        return
    peer = context.peer()
    if not streams.try_acquire(peer):
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, streams.message(what, peer))
    try:
        yield
    finally:
        streams.release(peer)


class BoardClosedError(Exception):
    """The board was closed (the service is shutting down)."""


def _mirrored_generation(leader: Published, served: Published) -> int:
    """The generation to serve a leader's `leader` value at, over what this board
    `served`: the leader's, unless that would not be above a served generation of other
    knobs (then one above it) or would go back on the same knobs (then the served one).
    Engines read a generation as "these knobs are newer than the last": a demoted
    leader whose last tick was never saved must not serve an older number, nor one it
    already served with other knobs."""
    if leader.generation > served.generation:
        return leader.generation
    return served.generation + (1 if leader.knobs != served.knobs else 0)


class DecisionBoard:
    """Thread-safe latest decision per model with generations and change notification.

    `wall`: wall clock (Unix seconds) stamped on applied decisions (injected in tests).
    """

    def __init__(
        self,
        models: Iterable[ModelSlot] = (),
        *,
        wall: Callable[[], float] = time.time,
        logger: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self._wall = wall
        self._log = logger or structlog.get_logger("actuator.board")
        self._cond = threading.Condition()
        self._entries: dict[str, Published] = {}
        self._slots: dict[str, ModelSlot] = {}
        self._version = 0
        self._closed = False
        self._subscribers: list[Callable[[], None]] = []
        self._quiet_subscribers: list[Callable[[], None]] = []
        self._held = 0  # open `batch` blocks
        self._served: dict[str, Published] | None = None  # while `hold` is on: the readers'
        self._pending_loud = self._pending_quiet = False
        self.configure(models)

    # ------------------------------------------------------------------ readers
    @property
    def version(self) -> int:
        """Grows by one on every change of any entry (or of the model set)."""
        with self._cond:
            return self._version

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def _view(self) -> dict[str, Published]:
        """The entries readers see: the last committed ones while held (caller locks)."""
        return self._entries if self._served is None else self._served

    def models(self) -> list[str]:
        with self._cond:
            return sorted(self._view())

    def get(self, model: str) -> Published:
        """The published value of `model`; KeyError when it is not configured."""
        with self._cond:
            return self._view()[model]

    def snapshot(self) -> dict[str, Published]:
        """A copy of every entry served (while held: as last committed)."""
        with self._cond:
            return dict(self._view())

    def pending(self) -> dict[str, Published]:
        """A copy of every entry, the changes held back from the readers included."""
        with self._cond:
            return dict(self._entries)

    @property
    def holding(self) -> bool:
        """True between `hold()` and `commit()`."""
        with self._cond:
            return self._served is not None

    def hold(self) -> None:
        """Keep the changes from now on from the readers until `commit()` (see the
        module doc); a no-op when already held."""
        with self._cond:
            if self._served is None:
                self._served = dict(self._entries)

    def commit(self, *, discard: bool = False) -> None:
        """Serve the changes held since `hold()` (watchers woken when a served value
        changed); with `discard`, drop them instead and keep serving the held-back
        values (this instance lost the leadership before it could save them). A no-op
        when not held."""
        with self._cond:
            served, self._served = self._served, None
            if served is None:
                return
            if discard:
                self._entries = {n: served.get(n, p) for n, p in self._entries.items()}
                return
            changed = set(served) != set(self._entries) or any(
                _differs(p, served[n]) or p.namespace != served[n].namespace
                for n, p in self._entries.items()
                if n in served
            )
            quiet = changed or served != self._entries
            if changed:
                self._bump()
        if changed:
            self._notify()
        elif quiet:
            self._notify_quiet()

    def slots(self) -> dict[str, ModelSlot]:
        """A copy of every configured model's slot."""
        with self._cond:
            return dict(self._slots)

    def ceiling(self, model: str) -> Knobs | None:
        """The largest knobs the governor may choose for `model`; None if not known."""
        with self._cond:
            slot = self._slots.get(model)
            return slot.ceiling if slot is not None else None

    # ------------------------------------------------------------------ writers
    def configure(self, models: Iterable[ModelSlot]) -> None:
        """Set the configured models: new ones start at their default knobs, removed
        ones are dropped (their watchers see KeyError), kept ones keep their values,
        moved inside their bounds (`ModelSlot.bound`) when those were narrowed: engines
        and KEDA get a value the new bounds allow at once, not at the next decision
        (which a stretch without data can put off). Each value moved is logged
        (`board_value_clamped`: model, field, old, new)."""
        slots = {m.name: m for m in models}
        clamped: list[tuple[str, str, int, int]] = []
        with self._cond:
            changed = set(slots) != set(self._slots)
            quiet = slots != self._slots
            entries: dict[str, Published] = {}
            for name, slot in slots.items():
                old = self._entries.get(name)
                if old is None:
                    entries[name] = Published(
                        model=name,
                        namespace=slot.namespace,
                        knobs=slot.default_knobs,
                        generation=0,
                        replicas=None,
                        reason=ORIGIN_DEFAULT,
                        decided_at_unix_s=None,
                        origin=ORIGIN_DEFAULT,
                    )
                elif old.namespace != slot.namespace:
                    entries[name] = replace(old, namespace=slot.namespace)
                    changed = True
                else:
                    entries[name] = old
                if old is not None and old.generation == 0 and old.knobs != slot.default_knobs:
                    # Defaults changed before anything was decided (or under the static
                    # policy, whose decisions are the defaults): serve the new ones as a
                    # knob change, in a new generation, or engines that follow
                    # generations never learn them.
                    entries[name] = replace(
                        entries[name], knobs=slot.default_knobs, generation=old.generation + 1
                    )
                    changed = True
                if old is not None:
                    entries[name], moved = slot.bound(entries[name])
                    clamped += [(name, *m) for m in moved]
                    changed |= bool(moved)
            self._slots = slots
            self._entries = entries
            if changed:
                self._bump()
        for model, field, before, after in clamped:
            self._log.info("board_value_clamped", model=model, field=field, old=before, new=after)
        if changed:
            self._notify()
        elif quiet:
            self._notify_quiet()

    def apply(self, decisions: Sequence[Decision]) -> None:
        """Actuator entry point: publish each valid decision of a configured model."""
        now = self._wall()
        changed = False
        with self._cond:
            for d in decisions:
                if not d.valid:
                    continue
                old = self._entries.get(d.model)
                if old is None:
                    continue
                knobs_changed = d.knobs != old.knobs
                new = replace(
                    old,
                    knobs=d.knobs,
                    generation=old.generation + (1 if knobs_changed else 0),
                    replicas=d.replicas,
                    reason=d.knob_reason.value,
                    decided_at_unix_s=now,
                    origin=ORIGIN_DECISION,
                )
                if knobs_changed or old.replicas != d.replicas:
                    changed = True
                self._entries[d.model] = new
            if changed:
                self._bump()
        if changed:
            self._notify()

    def set_latency(self, latencies: Mapping[str, LatencyDistribution]) -> None:
        """Record each configured model's latest latency distribution. Not a change of
        the served knobs or replicas: watchers are not woken and the version stays."""
        with self._cond:
            for name, dist in latencies.items():
                old = self._entries.get(name)
                if old is not None:
                    self._entries[name] = replace(old, latency=dist)
        self._notify_quiet()

    def mirror(
        self,
        entries: Mapping[str, Published],
        slots: Mapping[str, ModelSlot],
        removed: Iterable[str] = (),
    ) -> None:
        """Serve another board's values as they are (a mirror in another process, fed
        with that board's changes): each of `entries` replaces its model's entry
        (origin, generation and latency included), `slots` its slot, `removed` models
        are dropped. Watchers are woken when a served value (knobs, generation,
        replicas, reason, namespace, the model set) changed; not for latency alone."""
        changed = False
        with self._cond:
            for name in removed:
                changed |= self._entries.pop(name, None) is not None
                self._slots.pop(name, None)
            self._slots.update(slots)
            for name, p in entries.items():
                old = self._entries.get(name)
                if old is None or _differs(p, old) or p.namespace != old.namespace:
                    changed = True
                self._entries[name] = p
            if changed:
                self._bump()
        if changed:
            self._notify()

    def restore(self, entries: Mapping[str, Published], origin: str = ORIGIN_RESTORED) -> None:
        """Load persisted (or the leader's) values for configured models.

        With `origin` ORIGIN_RESTORED (start-up) a generation never goes backwards: the
        higher of the stored and the current one wins; a stored generation-0 value whose
        knobs are no longer the configured defaults (they changed while the service was
        down) is not restored: the new defaults are served in a new generation. With
        ORIGIN_LEADER the leader's numbering is served, except that here too a
        generation never goes backwards: a leader's value at or below this board's
        generation with other knobs (this instance published a newer tick as leader
        that the store never saved, then lost the lease) is served one above it, and
        with the same knobs keeps this board's number (`_mirrored_generation`).
        """
        changed = quiet = False
        with self._cond:
            for name, p in entries.items():
                old = self._entries.get(name)
                if old is None:
                    continue
                slot = self._slots.get(name)
                if (
                    origin != ORIGIN_LEADER
                    and p.generation == 0
                    and slot is not None
                    and p.knobs != slot.default_knobs
                ):
                    p = replace(p, knobs=slot.default_knobs, generation=1)
                gen = (
                    _mirrored_generation(p, old)
                    if origin == ORIGIN_LEADER
                    else max(p.generation, old.generation)
                )
                new = replace(p, model=name, namespace=old.namespace, generation=gen, origin=origin)
                if _differs(new, old):
                    changed = True
                quiet |= new != old
                self._entries[name] = new
            if changed:
                self._bump()
        if changed:
            self._notify()
        elif quiet:  # e.g. a follower mirrored the leader's latency distributions
            self._notify_quiet()

    def close(self) -> None:
        """Wake every watcher for good; later `wait` calls raise BoardClosedError."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._bump()
        self._notify()

    # ------------------------------------------------------------------ notification
    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Changes made inside notify the subscribers once, when the outermost batch
        ends (a tick's decisions and its latency distributions reach the serving
        process's feed as one change). Thread waiters (`wait`) still wake at once."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                done = self._held == 0
                loud, quiet = done and self._pending_loud, done and self._pending_quiet
                if done:
                    self._pending_loud = self._pending_quiet = False
            if loud:
                self._notify()
            elif quiet:
                self._notify_quiet()

    def subscribe(self, fn: Callable[[], None], *, quiet: bool = False) -> Callable[[], None]:
        """Call `fn()` after every change; with `quiet`, also after the changes that do
        not wake watchers (latency distributions, a model's knob ceiling). Returns the
        function that unsubscribes."""
        with self._cond:
            self._subscribers.append(fn)
            if quiet:
                self._quiet_subscribers.append(fn)

        def unsubscribe() -> None:
            with self._cond:
                for subscribers in (self._subscribers, self._quiet_subscribers):
                    with contextlib.suppress(ValueError):
                        subscribers.remove(fn)

        return unsubscribe

    def wait(self, version: int, timeout_s: float | None = None) -> int:
        """Block until the board's version is past `version` (or `timeout_s` seconds pass);
        returns the current version. Raises BoardClosedError once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._version > version or self._closed, timeout_s)
            if self._closed:
                raise BoardClosedError("the decision board is closed")
            return self._version

    async def watch(self) -> AsyncIterator[int]:
        """Async iterator for streaming handlers: yields the version at once, then after
        each change; ends when the board closes. Changes that arrive together may be
        coalesced (a watcher always sees the latest value, not every intermediate)."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is already closed
                loop.call_soon_threadsafe(event.set)

        unsubscribe = self.subscribe(notify)
        try:
            seen = self.version
            if self.closed:
                return
            yield seen
            while True:
                await event.wait()
                event.clear()
                if self.closed:
                    return
                now = self.version
                if now != seen:
                    seen = now
                    yield now
        finally:
            unsubscribe()

    # ------------------------------------------------------------------ internals
    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _notify(self) -> None:
        with self._cond:
            if self._held:
                self._pending_loud = True
                return
            subscribers = list(self._subscribers)
        self._call(subscribers)

    def _notify_quiet(self) -> None:
        with self._cond:
            if self._held:
                self._pending_quiet = True
                return
            subscribers = list(self._quiet_subscribers)
        self._call(subscribers)

    def _call(self, subscribers: list[Callable[[], None]]) -> None:
        for fn in subscribers:
            try:
                fn()
            except Exception as exc:  # a broken watcher must not break the tick
                self._log.error("board_subscriber_failed", error=repr(exc))


def _differs(a: Published, b: Published) -> bool:
    return (a.knobs, a.generation, a.replicas, a.reason) != (
        b.knobs,
        b.generation,
        b.replicas,
        b.reason,
    )
