"""The simulator's worker pool never forks the caller (simulator.pool)."""

from __future__ import annotations

import threading

from simulator.pool import Serial, process_pool

# Held by the test while the pool starts. A worker forked from the test process would
# copy it locked, with nobody to release it: the state a CI run hung in, for 90 minutes,
# when the capacity-check test forked a pytest process that still ran gRPC threads.
HELD = threading.Lock()


def _held_in_worker(_: int) -> bool:
    return HELD.locked()


def test_workers_do_not_inherit_the_callers_locks() -> None:
    with HELD, process_pool(2) as pool:
        assert isinstance(pool, Serial) or not any(pool.map(_held_in_worker, range(4)))


def test_one_worker_runs_in_the_caller() -> None:
    with process_pool(1) as pool:
        assert isinstance(pool, Serial)
        assert list(pool.map(pow, [2, 3], [3, 2])) == [8, 9]
