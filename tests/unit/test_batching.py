"""Batching knob policies and the per-replica capacity model (controller.batching)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from controller.batching import (
    clamp_knobs,
    per_request_work_ms,
    seed_knobs,
    seed_policy_knobs,
    slo_knobs,
)
from controller.capacity import capacity_rps
from controller.config import SLA, KnobBounds, ModelConfig
from controller.types import Knobs, Lengths
from estimators.stepmodel import load_profile
from estimators.types import Observation

CONV = Lengths(prompt_mean=1155, prompt_p95=4083, output_mean=211, output_p95=451)
CODE = Lengths(prompt_mean=2048, prompt_p95=7303, output_mean=28, output_p95=90)
SLA_STD = SLA(ttft_p95_ms=500, itl_p95_ms=50)


def test_seed_worked_example_from_architecture() -> None:
    """p95 length 512, decode 380 ms, SLA 1200 ms -> concurrency 3 -> 2048 tokens."""
    k = seed_knobs(
        sla_ms=1200, p95_decode_latency_ms=380, p95_request_len=512, arrival_rate_5min=10
    )
    assert k.max_num_batched_tokens == 2048
    assert k.max_num_seqs == 18  # min(256, int(10 * 1.8))


def test_seed_caps_seqs_at_256() -> None:
    assert seed_knobs(1200, 380, 512, 1000).max_num_seqs == 256


def test_seed_refuses_nonpositive_latency() -> None:
    with pytest.raises(ValueError, match="p95_decode_latency_ms"):
        seed_knobs(1200, 0, 512, 1)


def test_clamp_knobs_budget_at_least_seqs() -> None:
    k = clamp_knobs(Knobs(max_num_seqs=512, max_num_batched_tokens=300), KnobBounds())
    assert k == Knobs(max_num_seqs=512, max_num_batched_tokens=512)


def test_slo_knobs_conversation_worked_example() -> None:
    """The docstring's worked example: 152 seqs, 2,560 tokens."""
    k = slo_knobs(CONV, SLA_STD, load_profile(), KnobBounds(), itl_margin_frac=0.85)
    assert k == Knobs(max_num_seqs=152, max_num_batched_tokens=2560)


def test_slo_knobs_keep_steps_under_itl_target() -> None:
    p = load_profile()
    m = p.step_model()
    for lengths in (CONV, CODE):
        k = slo_knobs(lengths, SLA_STD, p, KnobBounds(), 0.85)
        ctx = lengths.prompt_p95 + lengths.output_p95 / 2
        assert m.decode_step_ms(k.max_num_seqs, k.max_num_seqs * ctx) <= 50 * 0.85
        assert k.max_num_seqs % 8 == 0 and k.max_num_batched_tokens % 256 == 0


def test_slo_knobs_raise_budget_for_ttft() -> None:
    """A tight TTFT with long prompts needs a bigger prefill chunk than ITL alone allows."""
    p = load_profile()
    loose = slo_knobs(CODE, SLA(ttft_p95_ms=5000, itl_p95_ms=50), p, KnobBounds(), 0.85)
    tight = slo_knobs(CODE, SLA(ttft_p95_ms=200, itl_p95_ms=50), p, KnobBounds(), 0.85)
    assert tight.max_num_batched_tokens > loose.max_num_batched_tokens
    # 200 ms * 0.5 / 42.5 ms -> 2 steps for 7,303 tokens -> 3,652 -> rounded up to 3,840
    assert tight.max_num_batched_tokens == 3840


def test_slo_knobs_respect_bounds() -> None:
    b = KnobBounds(
        max_num_seqs_min=8,
        max_num_seqs_max=64,
        default_max_num_seqs=64,
        max_num_batched_tokens_max=512,
        default_max_num_batched_tokens=512,
    )
    k = slo_knobs(CONV, SLA_STD, load_profile(), b, 0.85)
    assert k.max_num_seqs <= 64 and k.max_num_batched_tokens <= 512


def test_per_request_work_worked_example() -> None:
    assert per_request_work_ms(CONV, load_profile()) == pytest.approx(47.12, abs=0.01)


def test_capacity_grows_with_looser_sla_and_shrinks_with_longer_requests() -> None:
    p = load_profile()
    k = Knobs(max_num_seqs=256, max_num_batched_tokens=2048)
    tight = capacity_rps(k, CONV, SLA(ttft_p95_ms=300, itl_p95_ms=30), p, 1.0)
    loose = capacity_rps(k, CONV, SLA(ttft_p95_ms=2000, itl_p95_ms=100), p, 1.0)
    assert loose > tight > 0
    longer = Lengths(prompt_mean=2310, prompt_p95=8166, output_mean=422, output_p95=902)
    assert capacity_rps(k, longer, SLA_STD, p, 1.0) < capacity_rps(k, CONV, SLA_STD, p, 1.0)


def test_capacity_below_gpu_saturation_and_scaled_by_utilization() -> None:
    p = load_profile()
    k = Knobs(max_num_seqs=160, max_num_batched_tokens=2560)
    full = capacity_rps(k, CONV, SLA_STD, p, 1.0)
    assert full < 1000.0 / per_request_work_ms(CONV, p)
    assert capacity_rps(k, CONV, SLA_STD, p, 0.5) == pytest.approx(full * 0.5)


def test_seed_policy_reads_the_per_request_decode_time_and_5_minute_rate() -> None:
    """The seed's inputs as the source means them (see `seed_policy_knobs`): decode p95
    per request, prompt p95 (rounded to a whole token), e2e p95 target, 5-min rate."""
    sla = SLA(ttft_p95_ms=500, itl_p95_ms=50, e2e_p95_ms=1200)
    o = Observation(
        model="m",
        observed_at_s=0.0,
        arrival_rate_rps=40.0,
        itl_p95_ms=25.0,
        decode_time_p95_ms=380.00000000000006,  # what interpolation in (0.3, 0.5] s gives
        prompt_tokens_p95=511.99999999999994,
        arrival_rate_5m_rps=10.0,
    )
    assert seed_policy_knobs(o, sla) == Knobs(max_num_seqs=18, max_num_batched_tokens=2048)
    missing = seed_policy_knobs(replace(o, decode_time_p95_ms=None, arrival_rate_5m_rps=None), sla)
    assert missing == "seed policy lacks decode_time_p95_ms, arrival_rate_5m_rps"
    assert "sla.e2e_p95_ms" in str(seed_policy_knobs(o, SLA(ttft_p95_ms=500, itl_p95_ms=50)))
    assert "decode_time_p95_ms > 0" in str(
        seed_policy_knobs(replace(o, decode_time_p95_ms=0.0), sla)
    )


def test_seed_policy_needs_its_latency_target_at_config_time() -> None:
    with pytest.raises(ValidationError, match=r"batching_policy 'seed' needs sla\.e2e_p95_ms"):
        ModelConfig(
            name="m",
            deployment="m",
            sla=SLA(ttft_p95_ms=500, itl_p95_ms=50),
            batching_policy="seed",
        )
