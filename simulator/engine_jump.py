"""simulator.engine_jump: the engine's pure-decode jumps (simulator.engine, "Speed").

When no arrival can be admitted and no partial prefill is running, an engine runs all
pure-decode steps up to the next completion or block failure as one *jump*: their
durations form an arithmetic sequence (`a + b*j` ms), applied in O(16 + histogram
buckets crossed). A jump is truncated when a request arrives (steps that start before
the arrival keep their composition) and can be applied partially for an exact scrape.
`DecodeJumps` holds those steps for `simulator.engine.Engine`, whose state they read
and write (the step counter, the decode heap, the block counters, the in-flight step);
times are seconds, step durations milliseconds.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from heapq import heappop

from simulator.engine_metrics import ITERATION_TOKENS_BUCKETS, ITL_BUCKETS_MS


class DecodeJumps:
    """The jump steps of `simulator.engine.Engine` (a mix-in: it owns no state)."""

    def _jump_len(self, k: int, free: int, nd: int) -> int:
        """Steps from `k` that are pure decode: up to the next completion, before the
        first step whose block allocation would fail."""
        heap = self.heap
        dec = self.dec
        while True:
            f, rid = heap[0]
            r = dec.get(rid)
            if r is not None and r.fin == f:
                break
            heappop(heap)
        m_done = f - k + 1
        bs = self.bs
        q = free // nd
        if m_done <= q * bs:
            return m_done
        cnt = self.cnt
        cum = q * nd
        m = q * bs
        kk = k + m
        while True:
            cum += cnt[(1 - kk) % bs]
            if cum > free:
                return m if m < m_done else m_done
            m += 1
            kk += 1

    def _start_jump(self, t0: float, k: int, m: int) -> None:
        nd = self.n_dec
        lin = self._base + self._per_token * nd
        if lin < self._floor:
            lin = self._floor
        a = lin + self._fixed + self._per_seq * nd + self._per_kv * (self.s_off + nd * k)
        b = self._per_kv * nd
        self.j_k0 = k
        self.j_m = m
        self.j_a = a
        self.j_b = b
        self.j_t0 = t0
        self.fl_kind = 2
        self.t_end = t0 + (a * m + b * (m * (m - 1) // 2)) / 1000.0

    def _truncate_jump(self, t_s: float) -> None:
        """Keep only the jump's steps that start before `t_s` (an arrival at `t_s`)."""
        keep = steps_within(self.j_a, self.j_b, self.j_t0, t_s, self.j_m, strict=True) + 1
        if keep < self.j_m:
            self.j_m = keep
            self.t_end = (
                self.j_t0 + (self.j_a * keep + self.j_b * (keep * (keep - 1) // 2)) / 1000.0
            )
            self.wake_s = self.t_end

    def _apply_jump(self, mm: int) -> None:
        """Apply the first `mm` steps of the in-flight jump."""
        k0 = self.j_k0
        a = self.j_a
        b = self.j_b
        nd = self.n_dec
        bs = self.bs
        s_ms = a * mm + b * (mm * (mm - 1) // 2)
        t1 = self.j_t0 + s_ms / 1000.0
        q, rem = divmod(mm, bs)
        need = q * nd
        cnt = self.cnt
        for j in range(rem):
            need += cnt[(1 - k0 - j) % bs]
        self.free -= need
        m = self.metrics
        m.busy_s += s_ms / 1000.0
        m.steps += mm
        m.iter_tokens[bisect_left(ITERATION_TOKENS_BUCKETS, nd)] += mm
        m.iter_tokens_sum += nd * mm
        m.generation_tokens += nd * mm
        m.itl_sum += nd * s_ms / 1000.0
        itl = m.itl
        i0 = bisect_left(ITL_BUCKETS_MS, a)
        i1 = bisect_left(ITL_BUCKETS_MS, a + b * (mm - 1))
        if i0 == i1:
            itl[i0] += nd * mm
        else:
            done = 0
            for i in range(i0, i1):
                # steps j with a + b*j <= bound
                upto = min(mm, math.floor((ITL_BUCKETS_MS[i] - a) / b) + 1)
                if upto > done:
                    itl[i] += nd * (upto - done)
                    done = upto
            itl[i1] += nd * (mm - done)
        last = k0 + mm - 1
        self.k = last + 1
        if self.step_log is not None:
            self._log_step(self.j_t0, t1, k0, mm)
        if mm >= self.j_m:
            self.fl_kind = 0
            self.t_next = self.t_end if mm == self.j_m else t1
            self._complete_decoders(self.t_next, last)
        else:
            self.j_k0 = k0 + mm
            self.j_m -= mm
            self.j_a = a + b * mm
            self.j_t0 = t1
            rest = self.j_m
            self.t_end = t1 + (self.j_a * rest + b * (rest * (rest - 1) // 2)) / 1000.0


def steps_within(a: float, b: float, t0: float, t_s: float, m_max: int, *, strict: bool) -> int:
    """Largest j in [0, m_max] with t0 + (a*j + b*j*(j-1)/2)/1000 <= t_s (< t_s if strict).

    The time of the end of the first j steps of a jump whose step durations are a + b*i ms.
    """

    def ok(j: int) -> bool:
        t = t0 + (a * j + b * (j * (j - 1) // 2)) / 1000.0
        return t < t_s if strict else t <= t_s

    lim = (t_s - t0) * 1000.0
    if lim <= 0:
        return 0
    if b > 0:
        h = a - b / 2.0
        j = int((-h + math.sqrt(h * h + 2.0 * b * lim)) / b)
    else:
        j = int(lim / a)
    j = max(0, min(j, m_max))
    while j > 0 and not ok(j):
        j -= 1
    while j < m_max and ok(j + 1):
        j += 1
    return j
