"""simulator.requests: the per-request ground truth of a simulated fleet.

`RequestLog` collects one row per request as the engines (simulator.engine) and the
router (simulator.fleet) fill it in; `RequestRecords` is its numpy view with the derived
latencies every score reads (simulator.scenario). Times are seconds on the simulation
clock; NaN / -1 mean "not happened".
"""

from __future__ import annotations

import math

import numpy as np


class RequestLog:
    """Per-request ground truth, indexed by request id (the order of `add`/`extend`).

    Columns (seconds on the simulation clock unless stated; NaN/-1 = not happened):
    `arrival_s` (arrival at the fleet), `prompt_tokens`, `output_tokens` (as requested;
    once dispatched, capped so prompt + output <= max_model_len),
    `replica` (-1 until dispatched), `dispatch_s` (handed to an engine; later than the
    arrival when it queued at the router), `sched_s` (first scheduled), `first_token_s`,
    `finish_s`, `preemptions`, `refused`.
    """

    def __init__(self) -> None:
        self.arrival_s: list[float] = []
        self.prompt_tokens: list[int] = []
        self.output_tokens: list[int] = []
        self.replica: list[int] = []
        self.dispatch_s: list[float] = []
        self.sched_s: list[float] = []
        self.first_token_s: list[float] = []
        self.finish_s: list[float] = []
        self.preemptions: list[int] = []
        self.refused: list[bool] = []

    def __len__(self) -> int:
        return len(self.arrival_s)

    def add(self, arrival_s: float, prompt_tokens: int, output_tokens: int) -> int:
        """Register one request; returns its id."""
        return self.extend([arrival_s], [prompt_tokens], [output_tokens]).start

    def extend(
        self,
        arrival_s: list[float] | np.ndarray,
        prompt_tokens: list[int] | np.ndarray,
        output_tokens: list[int] | np.ndarray,
    ) -> range:
        """Register many requests; returns their ids."""
        a = [float(x) for x in arrival_s]
        n = len(a)
        if len(prompt_tokens) != n or len(output_tokens) != n:
            raise ValueError("arrival_s, prompt_tokens and output_tokens differ in length")
        start = len(self.arrival_s)
        nan = [math.nan] * n
        self.arrival_s.extend(a)
        self.prompt_tokens.extend(int(x) for x in prompt_tokens)
        self.output_tokens.extend(int(x) for x in output_tokens)
        self.replica.extend([-1] * n)
        self.dispatch_s.extend(nan)
        self.sched_s.extend(nan)
        self.first_token_s.extend(nan)
        self.finish_s.extend(nan)
        self.preemptions.extend([0] * n)
        self.refused.extend([False] * n)
        return range(start, start + n)

    def arrays(self) -> RequestRecords:
        """The columns as numpy arrays, with derived latencies."""
        return RequestRecords(
            arrival_s=np.asarray(self.arrival_s, dtype=np.float64),
            prompt_tokens=np.asarray(self.prompt_tokens, dtype=np.int64),
            output_tokens=np.asarray(self.output_tokens, dtype=np.int64),
            replica=np.asarray(self.replica, dtype=np.int64),
            dispatch_s=np.asarray(self.dispatch_s, dtype=np.float64),
            sched_s=np.asarray(self.sched_s, dtype=np.float64),
            first_token_s=np.asarray(self.first_token_s, dtype=np.float64),
            finish_s=np.asarray(self.finish_s, dtype=np.float64),
            preemptions=np.asarray(self.preemptions, dtype=np.int64),
            refused=np.asarray(self.refused, dtype=bool),
        )


class RequestRecords:
    """Numpy view of a `RequestLog` (see there for columns) plus derived latencies."""

    def __init__(
        self,
        *,
        arrival_s: np.ndarray,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        replica: np.ndarray,
        dispatch_s: np.ndarray,
        sched_s: np.ndarray,
        first_token_s: np.ndarray,
        finish_s: np.ndarray,
        preemptions: np.ndarray,
        refused: np.ndarray,
    ) -> None:
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.replica = replica
        self.dispatch_s = dispatch_s
        self.sched_s = sched_s
        self.first_token_s = first_token_s
        self.finish_s = finish_s
        self.preemptions = preemptions
        self.refused = refused

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def done(self) -> np.ndarray:
        """Mask of requests that finished (not refused, finish time known)."""
        mask: np.ndarray = ~np.isnan(self.finish_s) & ~self.refused
        return mask

    @property
    def ttft_s(self) -> np.ndarray:
        """First token - arrival at the fleet (router wait included), seconds."""
        out: np.ndarray = self.first_token_s - self.arrival_s
        return out

    @property
    def e2e_s(self) -> np.ndarray:
        """Finish - arrival at the fleet, seconds."""
        out: np.ndarray = self.finish_s - self.arrival_s
        return out

    @property
    def queue_s(self) -> np.ndarray:
        """First scheduled - arrival at the fleet, seconds."""
        out: np.ndarray = self.sched_s - self.arrival_s
        return out

    @property
    def mean_itl_s(self) -> np.ndarray:
        """(finish - first token) / (output - 1), seconds; NaN for 1-token outputs."""
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (self.finish_s - self.first_token_s) / (self.output_tokens - 1)
        res: np.ndarray = np.where(self.output_tokens > 1, out, np.nan)
        return res
