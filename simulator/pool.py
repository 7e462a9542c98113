"""Worker processes for the simulator's parallel runs: matrix cells, oracle windows,
capacity-check rows.

Workers start from a fork server, never by forking the caller. The caller may be a
process with threads (a pytest run after the gRPC service tests, which leave gRPC's
poller thread running), and `fork` copies into the child every lock another
thread held at that instant, with no thread left to release it: the child blocks on its
first log line or import, and `ProcessPoolExecutor` waits for it forever (a CI run of
the capacity-check test did, for the whole 90 minutes). The fork server is a fresh,
single-threaded interpreter that imports the simulator once (`_PRELOAD`); each worker is
forked from it, so it starts in milliseconds with the modules loaded. Python 3.14 makes
the same choice by default.

A job must therefore be a module-level function with picklable arguments, and it sees
the modules as imported, not as the caller may have patched them.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

# What the fork server imports before forking workers: the modules every job needs.
_PRELOAD = ["simulator.matrix", "simulator.oracle", "simulator.capacity_check"]


class Serial(Executor):
    """The pool with one worker: runs each job in the caller, at once (tests, profiling);
    `Executor.map` comes with it."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        f: Future[T] = Future()
        f.set_result(fn(*args, **kwargs))
        return f


def process_pool(workers: int) -> Executor:
    """A pool of min(`workers`, CPU count) processes started from the fork server, or
    `Serial` where that is one."""
    n = min(workers, os.cpu_count() or 1)
    if n <= 1:
        return Serial()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ProcessPoolExecutor(max_workers=n, mp_context=ctx)
