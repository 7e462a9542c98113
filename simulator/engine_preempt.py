"""simulator.engine_preempt: the engine's preemption by recompute (simulator.engine,
"Scheduling", step 1, and a `max_num_seqs` lowered by `Engine.set_knobs`).

The rare path: it walks the running list. A preempted request frees its KV blocks,
loses its computed tokens and goes to the head of the waiting queue; a decoder keeps the
tokens it already streamed (vLLM V1). `Preemption` holds those steps for
`simulator.engine.Engine`, whose state they read and write (the decoders by admission
order, the block counters, the partial prefill, the waiting queue, the request log);
times are seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine imports this module
    from simulator.engine import _Req


class Preemption:
    """The preemption steps of `simulator.engine.Engine` (a mix-in: it owns no state)."""

    def _preempt_partial(self) -> int:
        """Preempt the partial prefill (the last running request); returns blocks freed."""
        p = self.partial
        assert p is not None
        held = p.blocks
        p.blocks = 0
        p.comp = 0
        p.npre += 1
        self.log.preemptions[p.rid] = p.npre
        self.metrics.preemptions += 1
        self.partial = None
        self.waiting.appendleft(p)
        if self.step_log is not None:
            self._log_pre.append(p.rid)
        return held

    def _preempt_decoder(self, r: _Req, k: int, t0: float) -> int:
        """Preempt decoding request `r` before step `k` (starting at `t0`); blocks freed."""
        off = r.off
        held = -(-(off + k - 1) // self.bs)
        self.cnt[off % self.bs] -= 1
        self.n_dec -= 1
        self.s_off -= off
        del self.dec[r.rid]
        r.gen = r.gen0 + (k - r.k0)
        r.need = r.prompt + r.gen
        r.comp = 0
        r.blocks = 0
        r.last_tok = t0  # its last token came at the end of the previous step
        r.npre += 1
        self.log.preemptions[r.rid] = r.npre
        self.metrics.preemptions += 1
        self.waiting.appendleft(r)
        if self.step_log is not None:
            self._log_pre.append(r.rid)
        return held

    def _preempt_over_cap(self, t0: float) -> None:
        """A cap lowered below the running requests (`set_knobs`; admission never runs
        more than the cap): preempt the newest (the partial prefill first, then decoders
        from the newest admitted) until the cap holds."""
        free = self.free
        while self.n_dec + (self.partial is not None) > self.mns:
            if self.partial is not None:
                free += self._preempt_partial()
            else:
                newest = self.dec[next(reversed(self.dec))]
                free += self._preempt_decoder(newest, self.k, t0)
        self.free = free

    def _preempt_for_decodes(self, k: int, t0: float) -> None:
        """Allocate step `k`'s decode blocks in running order, preempting from the end."""
        bs = self.bs
        free = self.free
        order = list(self.dec.values())
        end = len(order)
        i = 0
        while i < end:
            r = order[i]
            if (r.off + k - 1) % bs == 0:
                stop = False
                while free < 1:
                    if self.partial is not None:
                        free += self._preempt_partial()
                    else:
                        end -= 1
                        v = order[end]
                        free += self._preempt_decoder(v, k, t0)
                        if v is r:
                            stop = True
                            break
                if stop:
                    break
                free -= 1
            i += 1
        self.free = free
