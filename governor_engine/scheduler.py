"""vLLM V1 scheduler that follows the governor's batching knobs live.

Use: `--scheduler-cls governor_engine.scheduler.GovernedScheduler` (printed by
`governor engine-args --live`). Start the engine with the CEILINGS (`--max-num-seqs`,
`--max-num-batched-tokens`: the largest values the governor may choose); the governor
then lowers and raises them within those values, without a restart.

How (read from vLLM 0.32's `vllm/v1/core/sched/scheduler.py`): the scheduler admits a
waiting request into RUNNING only while `len(running) < self.max_num_active_reqs`, and
gives each step at most `self.max_num_scheduled_tokens` tokens. A `KnobFollower` thread
holds a `WatchBatchingConfig` stream to the governor and only stores the newest knobs;
at the start of each `schedule()` call, in the scheduler's own thread, the plugin clamps
them into the ceilings (`LiveLimits`) and sets those two attributes, so a step never sees
a limit change under it. The model-runner sizes (`max_num_running_reqs`, the scheduler
config's `max_num_batched_tokens`) stay at the start values.

Lowering the cap takes effect at the next step: admissions stop, and the requests running
over the cap are preempted the way vLLM preempts for KV space (`_preempt_request`: newest
first, or lowest priority under the priority policy; back to the front of the waiting
queue, resumed, with prefix-cache hits, as slots free up). So RUNNING is at the cap one
step after the change, whatever the requests' lengths. With `--additional-config
'{"governor_preempt_over_cap": false}'` nothing is preempted and RUNNING falls to the cap
as the running requests finish.
The governor unreachable or down: the last values stay, the follower retries with
backoff, a step never fails for it. No governor address: the engine runs at its start
values (a warning says so).

vLLM picks `AsyncScheduler` when async scheduling is on (GPUs) and `Scheduler` when off
(CPUs); `GovernedScheduler` becomes the governed variant of the same one.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler

from governor_engine.follower import LOG, KnobFollower
from governor_engine.limits import (
    EngineSettings,
    Limits,
    LiveLimits,
    preempt_over_cap,
    token_floor,
)


class _GovernedMixin:
    """Live limits for a vLLM `Scheduler` subclass (see the module docstring)."""

    vllm_config: Any
    scheduler_config: Any
    running: list[Any]
    policy: Any
    max_num_active_reqs: int
    max_num_scheduled_tokens: int
    _governor_follower: KnobFollower | None
    _governor_limits: LiveLimits

    def _governor_start(self) -> None:
        ceiling = Limits(self.max_num_active_reqs, self.max_num_scheduled_tokens)
        sc = self.scheduler_config
        min_tokens = token_floor(
            chunked_prefill=bool(sc.enable_chunked_prefill),
            max_model_len=int(self.vllm_config.model_config.max_model_len),
            chunked_mm_input=not getattr(sc, "disable_chunked_mm_input", False),
            encoder_input_tokens=int(getattr(self, "max_num_encoder_input_tokens", 0) or 0),
            spec_tokens=int(getattr(self, "num_spec_tokens", 0) or 0),
            lookahead_tokens=int(getattr(self, "num_lookahead_tokens", 0) or 0),
        )
        self._governor_limits = LiveLimits(ceiling, min_tokens)
        self._governor_follower = None
        model_config = self.vllm_config.model_config
        settings = EngineSettings.resolve(
            self.vllm_config.additional_config, str(model_config.served_model_name)
        )
        self._governor_preempt = preempt_over_cap(self.vllm_config.additional_config)
        if not settings.server:
            LOG.warning(
                "governor: no address (--additional-config governor_server or "
                "$GOVERNOR_SERVER); running at the start values %s",
                ceiling,
            )
            return
        LOG.info(
            "governor: following %s for model %r; ceilings max_num_seqs=%d "
            "max_num_batched_tokens=%d; token budget never below %d",
            settings.server,
            settings.model,
            ceiling.max_num_seqs,
            ceiling.max_num_batched_tokens,
            self._governor_limits.min_tokens,
        )
        self._governor_follower = KnobFollower(
            settings.server,
            settings.model,
            settings.engine_id,
            tls_ca_file=settings.tls_ca_file,
        ).start()

    def _governor_apply(self) -> None:
        """Apply the newest stored knobs (scheduler thread, start of a step)."""
        follower = self._governor_follower
        if follower is None:
            return
        try:
            latest = follower.latest()
            new = self._governor_limits.update(latest)
            if new is not None and latest is not None:
                self._governor_set(new, time.monotonic() - latest.received_at_s)
            if self._governor_preempt and len(self.running) > self.max_num_active_reqs:
                self._governor_preempt_over_cap()
        except Exception:  # never fail a step for the governor
            LOG.exception("governor: could not apply the knobs; keeping the current limits")

    def _governor_set(self, new: Limits, waited_s: float) -> None:
        """Set the limits; `waited_s`: since the follower received them (seconds)."""
        old = (self.max_num_active_reqs, self.max_num_scheduled_tokens)
        self.max_num_active_reqs = new.max_num_seqs
        self.max_num_scheduled_tokens = new.max_num_batched_tokens
        LOG.info(
            "governor: applied max_num_seqs %d -> %d, max_num_batched_tokens %d -> %d "
            "(generation %s, %.1f ms after it arrived)",
            old[0],
            new.max_num_seqs,
            old[1],
            new.max_num_batched_tokens,
            self._governor_limits.generation,
            waited_s * 1000.0,
        )

    def _governor_preempt_over_cap(self) -> None:
        """Preempt running requests over the admission cap, as vLLM's own scheduler does
        when it runs out of KV blocks (same victim order, same call)."""
        timestamp = time.monotonic()
        drop_stale = bool(getattr(self, "requires_kv_delivery", False))
        count = 0
        while len(self.running) > self.max_num_active_reqs:
            if self.policy == SchedulingPolicy.PRIORITY:
                victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
            else:
                victim = self.running[-1]
            if not self._request_blocks_can_be_freed(victim):
                break  # its blocks are still being written: it drains instead
            self.running.remove(victim)
            self._preempt_request(victim, timestamp, drop_stale_output=drop_stale)
            count += 1
        if count:
            LOG.info(
                "governor: preempted %d running request(s) over the cap of %d; they resume "
                "from the waiting queue",
                count,
                self.max_num_active_reqs,
            )

    def _governor_stop(self) -> None:
        if self._governor_follower is not None:
            self._governor_follower.stop()

    # The scheduler's own entry points, wrapped (the mixin comes first in the MRO).
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._governor_start()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._governor_apply()
        return super().schedule(*args, **kwargs)

    def shutdown(self) -> None:
        self._governor_stop()
        super().shutdown()


class GovernedSyncScheduler(_GovernedMixin, Scheduler):
    """vLLM's synchronous `Scheduler` with live limits."""


class GovernedAsyncScheduler(_GovernedMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` with live limits."""


class GovernedScheduler(GovernedSyncScheduler):
    """The class path for `--scheduler-cls`: builds the governed variant of the
    scheduler vLLM would have used (async when the engine's async scheduling is on)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is GovernedScheduler and vllm_config.scheduler_config.async_scheduling:
            return GovernedAsyncScheduler(*args, **kwargs)
        return super().__new__(cls)
