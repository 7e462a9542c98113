"""simulator.fleet: a discrete-event fleet of simulated engines behind a router.

Owns replica lifecycle, routing, knob application and scrape scheduling; the replica
records and the fleet-level accounting over them are simulator.replicas'. Times are
seconds on the simulation clock (`_s`).

Lifecycle: `scale_to` requests a replica -> STARTING for the cold start (the profile's
`cold_start_s`, or the `cold_start_s` given: a number, or a (low, high) range drawn
uniformly with the fleet's seed) -> SERVING (its engine starts empty, with the knobs the
fleet had when the replica was requested: vLLM reads them at container start) ->
DRAINING on scale-down (no new requests; finishes everything it holds, its waiting queue
included) -> GONE when empty. A STARTING replica chosen for scale-down is cancelled and
GONE at once.

Scale-down order (like a Kubernetes ReplicaSet prefers not-ready and newer pods):
first STARTING replicas, newest request first (they cost GPU time and serve nothing);
then SERVING replicas with the fewest outstanding requests (least work to drain), ties
broken newest first. During a knob roll-out (`roll_out`) a ready surge replica and the
outdated one it replaces count as one, and go last, together.

Routing (`router`): "least-outstanding" (the default; a gateway's least-request
balancing): fewest outstanding requests (waiting + running on the engine) among SERVING
replicas, ties broken round-robin; "random": a SERVING replica drawn uniformly per request
(kube-proxy's choice of endpoint behind a plain Service), from its own generator seeded
by the fleet's seed. With no SERVING replica, requests queue FIFO at the router (counted,
never dropped) and are dispatched when a replica becomes ready.

Accounting (simulator.replicas.FleetAccounting, which `Fleet` mixes in): GPU-seconds
count each replica from the moment it is requested (cold start included) until it is
GONE (or until now); the replica timeline records (t, ready, total) at every change; peak
router queue; per-request records (`RequestLog`).

Event order at one instant: lifecycle events, then scrapes, then arrivals.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from controller.types import Knobs
from estimators.stepmodel import DEFAULT_PROFILE, Profile, load_profile
from simulator.engine import INF, Engine, checked_knobs
from simulator.replicas import FleetAccounting, Replica, ReplicaState
from simulator.requests import RequestLog
from simulator.traces import Trace


@dataclass(slots=True)
class _Scraper:
    interval_s: float
    next_s: float
    callback: Callable[[float], None]


@dataclass(slots=True)
class _Pending:
    """Arrivals not yet delivered, sorted by time: parallel lists from index `i`."""

    t: list[float] = field(default_factory=list)
    rid: list[int] = field(default_factory=list)
    i: int = 0


ROUTERS = ("least-outstanding", "random")
"""The routing rules a fleet can use (module doc)."""
ROLLOUTS = ("surge", "unavailable")
"""How a knob roll-out replaces replicas (`Fleet.roll_out`), as a Deployment's rolling
update: "surge" is maxSurge 1, maxUnavailable 0 (a new replica first, the outdated one
leaves once the fleet can spare it); "unavailable" is maxSurge 0, maxUnavailable 1 (the
outdated replica drains first and its replacement starts at once: one replica fewer
ready during each cold start, no extra GPU; the chart's example engine for template
changes)."""


class Fleet(FleetAccounting):
    """A fleet of simulated replicas of one model behind a router (`router`, ROUTERS).

    `profile` is a `Profile` or a profile name/path; `knobs` default to the profile's
    engine defaults. `initial_replicas` start SERVING at `start_s` when `initial_ready`
    (a fleet already up), else they are requested at `start_s` and cold-start.
    `kv_capacity_blocks` / `max_model_len` override the profile (tests).
    `overhead_s` is the server time before a request reaches an engine (HTTP,
    tokenization; see `simulator.plant`): arrivals are routed that much later and the
    engines' TTFT and e2e metrics include it; the request log keeps the arrival at the
    fleet, so scored latencies include it too. `live_knobs`: the engines follow knob
    changes live (the governor's scheduler plugin, `Engine.set_knobs`) instead of at
    start only (see `set_knobs`). `prefix_hit_frac`: the share of each prompt every
    engine finds in its prefix cache (simulator.engine).
    """

    def __init__(
        self,
        profile: Profile | str = DEFAULT_PROFILE,
        knobs: Knobs | None = None,
        initial_replicas: int = 1,
        seed: int = 0,
        cold_start_s: float | tuple[float, float] | None = None,
        *,
        initial_ready: bool = True,
        start_s: float = 0.0,
        kv_capacity_blocks: int | None = None,
        max_model_len: int | None = None,
        overhead_s: float = 0.0,
        live_knobs: bool = False,
        router: str = ROUTERS[0],
        rollout: str = ROLLOUTS[0],
        prefix_hit_frac: float = 0.0,
    ) -> None:
        if not (math.isfinite(overhead_s) and overhead_s >= 0):
            raise ValueError(f"overhead_s must be finite and >= 0, got {overhead_s}")
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {router!r}")
        if rollout not in ROLLOUTS:
            raise ValueError(f"rollout must be one of {', '.join(ROLLOUTS)}, got {rollout!r}")
        self.rollout = rollout
        # Its own generator: the random router leaves every other draw of the seed as is.
        self._route_rng = random.Random(seed) if router == "random" else None
        self.overhead_s = float(overhead_s)
        self.prefix_hit_frac = prefix_hit_frac
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        d = self.profile.engine_defaults
        self.knobs = knobs or Knobs(d.max_num_seqs, d.max_num_batched_tokens)
        checked_knobs(self.knobs)
        self.live_knobs = live_knobs
        if initial_replicas < 0:
            raise ValueError(f"initial_replicas must be >= 0, got {initial_replicas}")
        if isinstance(cold_start_s, tuple):
            lo, hi = cold_start_s
            if not 0 <= lo <= hi:
                raise ValueError(f"cold_start_s range must be 0 <= low <= high, got {cold_start_s}")
        elif cold_start_s is not None and cold_start_s < 0:
            raise ValueError(f"cold_start_s must be >= 0, got {cold_start_s}")
        self.cold_start_s = cold_start_s
        self.kv_capacity_blocks = kv_capacity_blocks
        self.max_model_len = (
            int(max_model_len) if max_model_len is not None else self.profile.max_model_len
        )
        self._rng = random.Random(seed)
        self.now_s = float(start_s)
        self.log = RequestLog()
        self.replicas: list[Replica] = []
        self._serving: list[Engine] = []
        self._serving_ids: list[int] = []
        self._draining: list[Replica] = []
        self._lifecycle: list[tuple[float, int, int]] = []  # (ready time, seq, replica id)
        self._seq = 0
        self._scrapers: list[_Scraper] = []
        self._pending = _Pending()
        self._router: deque[int] = deque()
        self.peak_router_queue = 0
        self.router_queued_total = 0
        self._rr = 0
        self._replacing: dict[int, int] = {}  # surge replica id -> outdated replica id
        self._replacement: int | None = None  # "unavailable": the replacement starting
        self.rollouts_started = 0
        for _ in range(initial_replicas):
            rep = self._request_replica(self.now_s)
            if initial_ready:
                rep.ready_s = self.now_s
        if initial_ready:
            self._lifecycle.clear()
            for rep in self.replicas:
                self._make_ready(rep, self.now_s)

    # -- configuration ---------------------------------------------------------------------

    def set_knobs(self, knobs: Knobs) -> None:
        """Knobs for replicas requested from now on. Running replicas keep theirs (vLLM
        reads them at start; `roll_out` replaces them), unless the fleet has
        `live_knobs`: then every replica takes them now, a serving or draining engine
        from its next step (`Engine.set_knobs`), a starting one when it is ready."""
        checked_knobs(knobs)
        self.knobs = knobs
        if not self.live_knobs:
            return
        for rep in (r for r in self.replicas if r.state is not ReplicaState.GONE):
            rep.knobs = knobs
            if rep.engine is not None:
                rep.engine.set_knobs(knobs, self.now_s)

    def set_profile(self, profile: Profile, t_s: float) -> None:
        """From `t_s` on, every engine and replica started later runs `profile` (a plant
        that changes: simulator.plant's speed change; Engine.set_profile)."""
        self.advance_to(t_s)
        self.profile = profile
        for _, engine in self.live_engines():
            engine.set_profile(profile, t_s)

    def roll_out(self, now_s: float | None = None) -> None:
        """Replace every SERVING replica whose knobs differ from the fleet's, one at a
        time, like a Deployment's rolling update (`rollout`, ROLLOUTS). "surge" (maxSurge
        1, maxUnavailable 0): a new replica is requested (cold start, GPU time counted);
        when it is ready the outdated one (fewest outstanding requests first) drains, as
        soon as the fleet has as many others ready as it wants (`_retire_replaced`); then
        the next. "unavailable" (maxSurge 0, maxUnavailable 1): the outdated one drains
        and its replacement is requested at once; when that is ready, the next."""
        if now_s is not None:
            self.advance_to(now_s)
        self.rollouts_started += 1
        self._roll_next(self.now_s)

    def outdated_replicas(self) -> int:
        """SERVING replicas whose knobs differ from the fleet's current knobs."""
        return sum(
            1 for r in self.replicas if r.state is ReplicaState.SERVING and r.knobs != self.knobs
        )

    def _roll_next(self, t_s: float) -> None:
        if self._replacing or self._replacement is not None:
            return  # one replacement at a time
        outdated = [
            r for r in self.replicas if r.state is ReplicaState.SERVING and r.knobs != self.knobs
        ]
        if not outdated:
            return
        old = min(outdated, key=lambda r: (r.engine.n_out if r.engine else 0, r.replica_id))
        new = self._request_replica(t_s)
        if self.rollout == "surge":
            self._replacing[new.replica_id] = old.replica_id
        else:  # maxUnavailable 1: the outdated replica goes first, its replacement counts
            self._replacement = new.replica_id
            self._stop_replica(old, t_s)

    def add_scraper(
        self, interval_s: float, callback: Callable[[float], None], first_s: float | None = None
    ) -> None:
        """Call `callback(t_s)` every `interval_s` from `first_s` (default: now), with every
        engine advanced exactly to `t_s`."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        start = self.now_s if first_s is None else float(first_s)
        if start < self.now_s:
            raise ValueError(f"first_s ({start}) is before the fleet's time ({self.now_s})")
        self._scrapers.append(_Scraper(float(interval_s), start, callback))

    # -- arrivals ----------------------------------------------------------------------------

    def submit_trace(self, trace: Trace, offset_s: float | None = None) -> range:
        """Queue every request of `trace` as arrivals at `offset_s + arrival_s` (offset
        defaults to now). Returns the request ids."""
        off = self.now_s if offset_s is None else float(offset_s)
        times = trace.arrival_s + off
        if len(times) and times[0] < self.now_s:
            raise ValueError(f"trace starts at {times[0]} s, before the fleet's time {self.now_s}")
        ids = self.log.extend(times, trace.prompt_tokens, trace.output_tokens)
        self._add_pending((times + self.overhead_s).tolist(), list(ids))
        return ids

    def submit(self, arrival_s: float, prompt_tokens: int, output_tokens: int) -> int:
        """Queue one request arriving at `arrival_s` (>= now). Returns its id."""
        if arrival_s < self.now_s:
            raise ValueError(f"arrival {arrival_s} s is before the fleet's time {self.now_s}")
        rid = self.log.add(arrival_s, prompt_tokens, output_tokens)
        self._add_pending([float(arrival_s) + self.overhead_s], [rid])
        return rid

    def _add_pending(self, times: list[float], rids: list[int]) -> None:
        p = self._pending
        rest_t = p.t[p.i :]
        rest_r = p.rid[p.i :]
        if not rest_t or times[0] >= rest_t[-1]:
            if times != sorted(times):
                order = sorted(range(len(times)), key=times.__getitem__)
                times = [times[j] for j in order]
                rids = [rids[j] for j in order]
            p.t = rest_t + times
            p.rid = rest_r + rids
        else:
            merged = sorted(zip(rest_t + times, rest_r + rids, strict=True))
            p.t = [a for a, _ in merged]
            p.rid = [b for _, b in merged]
        p.i = 0

    # -- time ----------------------------------------------------------------------------------

    def advance_to(self, t_s: float) -> None:
        """Run the simulation up to `t_s` (>= now): lifecycle, scrapes, arrivals, steps."""
        if t_s < self.now_s:
            raise ValueError(f"cannot go back in time: {t_s} < {self.now_s}")
        pend = self._pending
        while True:
            t_ev = self._next_event_s()
            self._deliver(pend, t_s, t_ev)
            if t_ev > t_s:
                break
            self._handle_event(t_ev)
        self._advance_engines(t_s)
        self._reap()
        self.now_s = t_s

    def run(self, until_s: float | None = None, chunk_s: float = 60.0) -> None:
        """Advance until `until_s`, or (None) until every submitted request is done,
        in `chunk_s` increments (scrapes keep firing meanwhile)."""
        if until_s is not None:
            self.advance_to(until_s)
            return
        while True:
            p = self._pending
            if p.i < len(p.t):
                self.advance_to(max(self.now_s, p.t[-1]))
                continue
            if not self._router and all(e.is_empty for e in self._engines()):
                self._reap()
                return
            if self._router and not self._serving and not self._lifecycle:
                raise RuntimeError("requests queued at the router and no replica is coming")
            self.advance_to(self.now_s + chunk_s)

    def _next_event_s(self) -> float:
        t = self._lifecycle[0][0] if self._lifecycle else INF
        for s in self._scrapers:
            if s.next_s < t:
                t = s.next_s
        return t

    def _deliver(self, pend: _Pending, t_s: float, t_ev: float) -> None:
        """Route arrivals with time <= t_s and < t_ev (the hot loop)."""
        times = pend.t
        rids = pend.rid
        i = pend.i
        n = len(times)
        serving = self._serving
        sids = self._serving_ids
        log = self.log
        prompts = log.prompt_tokens
        outputs = log.output_tokens
        replica_col = log.replica
        while i < n:
            ta = times[i]
            if ta > t_s or ta >= t_ev:
                break
            rid = rids[i]
            i += 1
            ns = len(serving)
            if ns == 0:
                self._router.append(rid)
                self.router_queued_total += 1
                if len(self._router) > self.peak_router_queue:
                    self.peak_router_queue = len(self._router)
                continue
            if ns == 1:
                best = 0
                e = serving[0]
                if e.wake_s <= ta:
                    e.advance_to(ta)
            elif self._route_rng is not None:
                best = self._route_rng.randrange(ns)
                e = serving[best]
                if e.wake_s <= ta:
                    e.advance_to(ta)
            else:
                best = -1
                bn = 1 << 62
                rr = self._rr
                for j in range(ns):
                    jj = rr + j
                    if jj >= ns:
                        jj -= ns
                    e = serving[jj]
                    if e.wake_s <= ta:
                        e.advance_to(ta)
                    if e.n_out < bn:
                        bn = e.n_out
                        best = jj
                self._rr = rr + 1 if rr + 1 < ns else 0
            replica_col[rid] = sids[best]
            serving[best].enqueue(rid, ta, prompts[rid], outputs[rid])
        pend.i = i

    def _route_now(self, rid: int, t_s: float) -> None:
        """Dispatch one request at `t_s` (engines already advanced to `t_s`)."""
        serving = self._serving
        if self._route_rng is not None:
            best = self._route_rng.randrange(len(serving))
        else:
            best = min(range(len(serving)), key=lambda j: serving[j].n_out)
        self.log.replica[rid] = self._serving_ids[best]
        serving[best].enqueue(rid, t_s, self.log.prompt_tokens[rid], self.log.output_tokens[rid])

    def _handle_event(self, t_ev: float) -> None:
        if self._lifecycle and self._lifecycle[0][0] == t_ev:
            _, _, rep_id = heapq.heappop(self._lifecycle)
            rep = self.replicas[rep_id]
            if rep.state is ReplicaState.STARTING:
                self._advance_engines(t_ev)
                self.now_s = max(self.now_s, t_ev)
                self._make_ready(rep, t_ev)
            return
        for s in self._scrapers:
            if s.next_s == t_ev:
                self._advance_engines(t_ev, exact=True)
                self._reap()
                self.now_s = max(self.now_s, t_ev)
                s.callback(t_ev)
                s.next_s = t_ev + s.interval_s
                return

    def _advance_engines(self, t_s: float, exact: bool = False) -> None:
        for e in self._engines():
            if exact or e.wake_s <= t_s:
                e.advance_to(t_s, exact)

    def _engines(self) -> Iterator[Engine]:
        yield from self._serving
        for rep in self._draining:
            assert rep.engine is not None
            yield rep.engine

    def _reap(self) -> None:
        """Draining replicas whose engine emptied are GONE at the end of their last step."""
        if not self._draining:
            return
        keep = []
        for rep in self._draining:
            eng = rep.engine
            assert eng is not None and rep.drain_s is not None
            if eng.is_empty:
                rep.state = ReplicaState.GONE
                rep.gone_s = max(rep.drain_s, eng.t_next)
            else:
                keep.append(rep)
        self._draining = keep

    # -- scaling -----------------------------------------------------------------------------

    def scale_to(self, n: int, now_s: float | None = None) -> None:
        """Make `n` replicas active (STARTING or SERVING) at `now_s` (default: now).

        Adds replicas (cold start) or drains/cancels them in the documented order.
        """
        if n < 0:
            raise ValueError(f"replica count must be >= 0, got {n}")
        if now_s is not None:
            self.advance_to(now_s)
        t = self.now_s
        # A surge replica and the outdated one it replaces count once (as in a rollout).
        being_replaced = set(self._replacing.values())
        active = [
            r
            for r in self.replicas
            if r.state in (ReplicaState.STARTING, ReplicaState.SERVING)
            and r.replica_id not in being_replaced
        ]
        if n > len(active):
            for _ in range(n - len(active)):
                self._request_replica(t)
        elif n < len(active):
            starting = sorted(
                # rollout surges are not cancelled: they take their outdated replica's place
                (
                    r
                    for r in active
                    if r.state is ReplicaState.STARTING and r.replica_id not in self._replacing
                ),
                key=lambda r: (-r.requested_s, -r.replica_id),
            )
            serving = sorted(
                (r for r in active if r.state is ReplicaState.SERVING),
                key=lambda r: (r.engine.n_out if r.engine else 0, -r.ready_s, -r.replica_id),
            )
            # A ready surge whose outdated replica still serves (held by _retire_replaced)
            # goes last, with that replica: the pair is one wanted replica.
            serving.sort(key=lambda r: r.replica_id in self._replacing)
            for rep in (starting + serving)[: len(active) - n]:
                old_id = self._replacing.get(rep.replica_id)
                self._stop_replica(rep, t)
                if old_id is not None:
                    self._stop_replica(self.replicas[old_id], t)
            self._reap()
            self._retire_replaced(t)

    def _cold_start(self) -> float:
        cs = self.cold_start_s
        if cs is None:
            return float(self.profile.cold_start_s)
        if isinstance(cs, tuple):
            return self._rng.uniform(cs[0], cs[1])
        return float(cs)

    def _request_replica(self, t_s: float) -> Replica:
        rep = Replica(len(self.replicas), self.knobs, t_s, t_s + self._cold_start())
        self.replicas.append(rep)
        self._seq += 1
        heapq.heappush(self._lifecycle, (rep.ready_s, self._seq, rep.replica_id))
        return rep

    def _make_ready(self, rep: Replica, t_s: float) -> None:
        rep.state = ReplicaState.SERVING
        rep.ready_s = t_s
        rep.engine = Engine(
            self.profile,
            rep.knobs,
            log=self.log,
            start_s=t_s,
            kv_capacity_blocks=self.kv_capacity_blocks,
            max_model_len=self.max_model_len,
            overhead_s=self.overhead_s,
            prefix_hit_frac=self.prefix_hit_frac,
        )
        self._serving.append(rep.engine)
        self._serving_ids.append(rep.replica_id)
        while self._router:
            self._route_now(self._router.popleft(), t_s)
        if self._replacement == rep.replica_id:
            self._replacement = None
            self._roll_next(t_s)
        self._retire_replaced(t_s)

    def _retire_replaced(self, t_s: float) -> None:
        """Stop the outdated replica of a ready surge when the fleet can spare it, then
        start the next replacement. As a Deployment with maxUnavailable 0 scales its old
        ReplicaSet down only while more pods are available than it wants (Kubernetes'
        deployment controller, `reconcileOldReplicaSets`): a replica added by a scale-up
        during the roll-out and still starting keeps the outdated one serving until it is
        ready, so the ready count never falls below the wanted one."""
        for new_id, old_id in list(self._replacing.items()):
            if self.replicas[new_id].state is not ReplicaState.SERVING:
                continue
            old = self.replicas[old_id]
            if old.state is ReplicaState.SERVING and len(self._serving) <= self.active_replicas:
                return  # wanted: the outdated replica serves until another is ready
            del self._replacing[new_id]
            if old.state is ReplicaState.SERVING:
                self._stop_replica(old, t_s)
            self._roll_next(t_s)

    def _stop_replica(self, rep: Replica, t_s: float) -> None:
        # A cancelled surge leaves its outdated replica serving (the rollout resumes later);
        # a surge whose outdated replica is stopped simply stays as a replica; a cancelled
        # replacement ("unavailable") stops the roll-out until the next one.
        self._replacing.pop(rep.replica_id, None)
        if self._replacement == rep.replica_id:
            self._replacement = None
        for new_id, old_id in list(self._replacing.items()):
            if old_id == rep.replica_id:
                del self._replacing[new_id]
        if rep.state is ReplicaState.STARTING:
            rep.state = ReplicaState.GONE
            rep.gone_s = t_s
            return
        idx = self._serving_ids.index(rep.replica_id)
        del self._serving[idx]
        del self._serving_ids[idx]
        self._rr = 0
        rep.state = ReplicaState.DRAINING
        rep.drain_s = t_s
        self._draining.append(rep)

    # -- accounting ----------------------------------------------------------------------------

    @property
    def ready_replicas(self) -> int:
        """Replicas SERVING now."""
        return len(self._serving)

    @property
    def active_replicas(self) -> int:
        """Replicas STARTING or SERVING (what `scale_to` counts); during a rollout a surge
        replica and the outdated one it replaces count once."""
        return sum(
            1 for r in self.replicas if r.state in (ReplicaState.STARTING, ReplicaState.SERVING)
        ) - len(self._replacing)

    @property
    def total_replicas(self) -> int:
        """Replicas holding a GPU now (STARTING, SERVING or DRAINING)."""
        return sum(1 for r in self.replicas if r.state is not ReplicaState.GONE)

    @property
    def engines_expected(self) -> int:
        """Replicas SERVING or DRAINING now: the engines a scrape should find."""
        return len(self._serving) + len(self._draining)

    @property
    def router_queue_len(self) -> int:
        """Requests waiting at the router for a serving replica."""
        return len(self._router)

    def live_engines(self) -> Iterator[tuple[int, Engine]]:
        """(replica id, engine) of SERVING and DRAINING replicas."""
        yield from zip(self._serving_ids, self._serving, strict=True)
        for rep in self._draining:
            assert rep.engine is not None
            yield rep.replica_id, rep.engine
