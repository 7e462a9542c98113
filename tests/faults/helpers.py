"""Fakes shared by the fault suite: a fake Kubernetes API that can also lose replies
(write applied, answer never arrives) and records every applied scale write, a clock
whose wall time can jump independently of its monotonic time, and small utilities
(free ports, VmHWM of a process, metric samples)."""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.service.fake_kube import FakeKubeAPI


class FaultyKubeAPI(FakeKubeAPI):
    """`FakeKubeAPI` plus:

    - `lose_replies(method, path_part, times)`: apply the next matching writes, then
      hold the answer past the client's timeout (the client sees a timeout although the
      write landed: the case that would duplicate a relative scaling action);
    - `writes`: every applied scale write as (namespace, deployment, replicas), in order;
    - `patch_delay_s`: hold every scale PATCH this long before applying it (a slow API
      server, so a test can kill the caller mid-actuation); `patch_started` is set when
      one arrives.
    """

    def __init__(self, timeout_delay_s: float = 1.0) -> None:
        super().__init__(timeout_delay_s=timeout_delay_s)
        self.writes: list[tuple[str, str, int]] = []
        self._lost: list[list[Any]] = []
        self.patch_delay_s = 0.0
        self.patch_started = threading.Event()

    def lose_replies(self, method: str, path_part: str, times: int = 1) -> None:
        with self._lock:
            self._lost.append([method, path_part, times])

    def _take_lost(self, method: str, path: str) -> bool:
        with self._lock:
            for entry in self._lost:
                if entry[0] == method and entry[1] in path and entry[2] > 0:
                    entry[2] -= 1
                    return True
        return False

    def _route(
        self, method: str, path: str, body: Any, ctype: str, query: str = ""
    ) -> tuple[int, Any]:
        if method == "PATCH" and "/scale" in path and self.patch_delay_s > 0:
            self.patch_started.set()
            time.sleep(self.patch_delay_s)
        code, obj = super()._route(method, path, body, ctype, query)
        if code == 200 and method in ("PATCH", "PUT") and path.endswith("/scale"):
            meta = obj.get("metadata", {})
            with self._lock:
                self.writes.append(
                    (meta.get("namespace", ""), meta.get("name", ""), obj["spec"]["replicas"])
                )
        if code < 300 and self._take_lost(method, path):
            time.sleep(self.timeout_delay_s)  # the client gave up; the write stays applied
        return code, copy.deepcopy(obj)


@dataclass
class JumpClock:
    """Monotonic time advanced by the test; wall time = origin + monotonic + `jump_s`,
    where `jump_s` models the system clock being set (NTP step, operator, VM resume)."""

    mono: float = 1000.0
    wall_origin: float = 1_800_000_000.0
    jump_s: float = 0.0
    jumps: list[float] = field(default_factory=list)

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return self.wall_origin + self.mono + self.jump_s

    def advance(self, seconds: float) -> float:
        self.mono += seconds
        return self.mono

    def jump(self, seconds: float) -> None:
        self.jump_s += seconds
        self.jumps.append(seconds)


@dataclass
class RealWallFakeMono:
    """Monotonic time advanced by the test (the loop's windows), wall time real (what a
    real Prometheus evaluates at)."""

    mono: float = 1000.0

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return time.time()

    def advance(self, seconds: float) -> float:
        self.mono += seconds
        return self.mono


def vm_hwm_kib(pid: int | str = "self") -> int:
    """Peak resident set size (VmHWM) of process `pid`, KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def vm_rss_kib(pid: int | str = "self") -> int:
    """Current resident set size (VmRSS) of process `pid`, KiB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def sample(registry: Any, name: str, **labels: str) -> float | None:
    """A metric sample from a prometheus_client registry (None when absent)."""
    value: float | None = registry.get_sample_value(name, labels)
    return value
