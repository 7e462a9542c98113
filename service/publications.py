"""Board entries <-> the state document: the configured slots of the decision board, and
the saved publications (knobs, generation, replicas, latency distribution) that a
restarted instance or a follower puts back on its board."""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from actuators.publisher import LatencyDistribution, ModelSlot, Published
from controller.config import GovernorConfig, ModelConfig
from controller.types import Knobs
from estimators.types import LatencyQuantiles
from service.store import LatencyDoc, PublishedDoc, Quantiles


def slots(cfg: GovernorConfig) -> list[ModelSlot]:
    """The board's slot of each configured model: its default knobs, its knob bounds'
    maxima (the ceiling served to engines that follow the knobs live) and minima, and
    its replica bounds (the board keeps its served values within them)."""
    return [
        ModelSlot(
            m.name,
            m.namespace,
            Knobs(m.knobs.default_max_num_seqs, m.knobs.default_max_num_batched_tokens),
            Knobs(m.knobs.max_num_seqs_max, m.knobs.max_num_batched_tokens_max),
            floor=Knobs(m.knobs.max_num_seqs_min, m.knobs.max_num_batched_tokens_min),
            replicas=(m.replicas.min_replicas, m.replicas.max_replicas),
        )
        for m in cfg.models
    ]


_QUANTILES = ("p50_ms", "p90_ms", "p95_ms", "p99_ms")


def latency_doc(dist: LatencyDistribution | None) -> LatencyDoc | None:
    """A latency distribution as saved in the state document (None: none observed).
    Rounded to 0.1 ms, far below any bucket's resolution, to keep the document small."""
    if dist is None:
        return None

    def q(quantiles: LatencyQuantiles) -> Quantiles:
        a, b, c, d = (getattr(quantiles, k) for k in _QUANTILES)
        return tuple(None if v is None else round(v, 1) for v in (a, b, c, d))  # type: ignore[return-value]

    return LatencyDoc(
        ttft=q(dist.ttft),
        itl=q(dist.itl),
        e2e=q(dist.e2e),
        observed_at_unix_s=round(dist.observed_at_unix_s, 3),
    )


def latency_from_doc(doc: LatencyDoc | None) -> LatencyDistribution | None:
    if doc is None:
        return None

    def q(values: Quantiles) -> LatencyQuantiles:
        return LatencyQuantiles(**dict(zip(_QUANTILES, values, strict=True)))

    return LatencyDistribution(
        ttft=q(doc.ttft),
        itl=q(doc.itl),
        e2e=q(doc.e2e),
        observed_at_unix_s=doc.observed_at_unix_s,
    )


def published_entries(
    saved: Mapping[str, Any], keep: Container[str] | None = None
) -> dict[str, Published]:
    """Board entries from a state document's saved publications (only the `keep` models)."""
    return {
        name: Published(
            model=name,
            namespace="",
            knobs=Knobs(p.max_num_seqs, p.max_num_batched_tokens),
            generation=p.generation,
            replicas=p.replicas,
            reason=p.reason,
            decided_at_unix_s=p.decided_at_unix_s,
            latency=latency_from_doc(p.latency),
        )
        for name, p in saved.items()
        if keep is None or name in keep
    }


BoundsProblem = tuple[str, int, tuple[int, int]]
"""A saved publication's field outside its model's bounds: (field, value, (lowest,
highest)); knobs in tokens or sequences, replicas in pods."""


def _out_of_bounds(p: PublishedDoc, m: ModelConfig) -> BoundsProblem | None:
    """The first field of saved publication `p` outside model `m`'s knob or replica
    bounds; None when every field lies within."""
    k, r = m.knobs, m.replicas
    checks = (
        ("max_num_seqs", p.max_num_seqs, (k.max_num_seqs_min, k.max_num_seqs_max)),
        (
            "max_num_batched_tokens",
            p.max_num_batched_tokens,
            (k.max_num_batched_tokens_min, k.max_num_batched_tokens_max),
        ),
        ("replicas", p.replicas, (r.min_replicas, r.max_replicas)),
    )
    for name, value, (lo, hi) in checks:
        if value is not None and not lo <= value <= hi:
            return name, value, (lo, hi)
    return None


def within_bounds(
    saved: Mapping[str, PublishedDoc],
    cfg: GovernorConfig,
    log: Any,
    *,
    event: str = "restored_publication_dropped",
    refused: dict[str, BoundsProblem] | None = None,
) -> dict[str, PublishedDoc]:
    """The saved publications of configured models that lie within their model's bounds.
    One outside them is dropped with a warning `event` naming the model, the field, its
    value and the bounds: engines and KEDA are never served a value the model's bounds
    forbid. At start-up (bounds narrowed while the service was down, or an edited
    document) the model then starts from its configured defaults, as if nothing had been
    saved for it, and its first tick decides; a follower mirroring the leader keeps
    serving what it served before.

    `refused` (a follower's, kept across calls, updated in place): each model's refusal
    is logged once while the same field and value stay refused, not at every tick."""
    models = {m.name: m for m in cfg.models}
    kept = {}
    for name, p in saved.items():
        m = models.get(name)
        if m is None:
            continue
        problem = _out_of_bounds(p, m)
        if problem is None:
            kept[name] = p
            if refused is not None:
                refused.pop(name, None)
            continue
        if refused is not None:
            if refused.get(name) == problem:
                continue
            refused[name] = problem
        field, value, (lo, hi) = problem
        log.warning(event, model=name, field=field, value=value, bounds=[lo, hi])
    if refused is not None:
        for gone in set(refused) - set(saved):
            del refused[gone]
    return kept
