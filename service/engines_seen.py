"""Which engines asked for each model's knobs lately: GetStatus's `engines_seen`.

`engines_seen` tells an operator how many engines use the governor for a model now.
An engine counts while it asks: one that polls (GetBatchingConfig, every few seconds)
or holds a WatchBatchingConfig stream (its engine is told again every
`actuators.engines.SEEN_REFRESH_S`, 60 s, while the stream is open) stays counted; one
that has not asked for `ENGINE_EXPIRY_S` (its pod deleted, scaled down, or an engine_id
a client made up) is forgotten. At most `MAX_ENGINES_TRACKED` engines per model are
kept (a new one beyond that is not counted until others expire), and a model's engines
are dropped when the model leaves the configuration (`retain`), so neither random
engine_ids nor deleted models grow it without bound.

Used by the governor (service.core) and by the serving process, which reports an
engine to the governor when it first asks and again at most every
`REPORT_REFRESH_S` while it keeps asking (service.serving_child).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

ENGINE_EXPIRY_S = 600.0
"""Seconds an engine stays counted after it last asked (10 minutes): ten times the 60 s
at which an open watch stream's engine is told again and the serving process reports
an engine again, so an engine that keeps asking never expires and one that stopped
asking 10 minutes ago no longer counts."""
MAX_ENGINES_TRACKED = 10_000  # per model
REPORT_REFRESH_S = 60.0
"""Seconds between two reports of the same engine by the serving process (well below
`ENGINE_EXPIRY_S`: an engine that keeps asking never expires in the governor)."""
SWEEP_S = 60.0
"""Seconds between sweeps of every model for expired engines (a model nobody asks
about any more is emptied too, not only the one being recorded)."""


class EngineTracker:
    """Engines per model with the (monotonic) time each last counted as seen; thread
    safe. `clock`: monotonic seconds. `expiry_s`: an engine not seen for longer is
    forgotten. `max_per_model`: engines kept per model."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        expiry_s: float = ENGINE_EXPIRY_S,
        max_per_model: int = MAX_ENGINES_TRACKED,
    ) -> None:
        self.clock = clock
        self.expiry_s = expiry_s
        self.max_per_model = max_per_model
        self._seen: dict[str, OrderedDict[str, float]] = {}  # oldest first
        self._lock = threading.Lock()
        self._swept_s: float | None = None

    def record(self, model: str, engine_id: str, refresh_s: float = 0.0) -> bool:
        """`engine_id` asked for `model`'s knobs now. Whether it was recorded: False
        for an empty id, for one recorded less than `refresh_s` seconds ago (kept as it
        was), and for a new one while the model already holds `max_per_model`."""
        if not engine_id:
            return False
        now = self.clock()
        with self._lock:
            self._expire(now)
            seen = self._seen.setdefault(model, OrderedDict())
            last = seen.get(engine_id)
            if last is None and len(seen) >= self.max_per_model:
                _expire_model(seen, now - self.expiry_s)
                if len(seen) >= self.max_per_model:
                    return False
            if last is not None and now - last < refresh_s:
                return False
            seen[engine_id] = now
            seen.move_to_end(engine_id)
            return True

    def count(self, model: str) -> int:
        """Engines of `model` seen within the last `expiry_s` seconds."""
        now = self.clock()
        with self._lock:
            seen = self._seen.get(model)
            if seen is None:
                return 0
            _expire_model(seen, now - self.expiry_s)
            return len(seen)

    def retain(self, models: Iterable[str]) -> None:
        """Forget the engines of every model not in `models` (the configured ones)."""
        keep = set(models)
        with self._lock:
            for model in [m for m in self._seen if m not in keep]:
                del self._seen[model]

    def tracked(self) -> int:
        """Engines held over all models, expired ones not yet swept included (tests)."""
        with self._lock:
            return sum(len(seen) for seen in self._seen.values())

    def _expire(self, now: float) -> None:
        """Every `SWEEP_S` seconds: drop expired engines of all models, and emptied
        models. Called with the lock held."""
        if self._swept_s is not None and now - self._swept_s < SWEEP_S:
            return
        self._swept_s = now
        cutoff = now - self.expiry_s
        for model in list(self._seen):
            seen = self._seen[model]
            _expire_model(seen, cutoff)
            if not seen:
                del self._seen[model]


def _expire_model(seen: OrderedDict[str, float], cutoff: float) -> None:
    """Drop the engines of one model last seen before `cutoff` (they come first)."""
    while seen:
        engine_id, at = next(iter(seen.items()))
        if at >= cutoff:
            return
        del seen[engine_id]
