"""Board entries <-> the state document: the configured slots of the decision board, and
the saved publications (knobs, generation, replicas, latency distribution) that a
restarted instance or a follower puts back on its board."""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import asdict
from typing import Any

from actuators.publisher import LatencyDistribution, ModelSlot, Published
from controller.config import GovernorConfig
from controller.types import Knobs
from estimators.types import LatencyQuantiles
from service.store import LatencyDoc, QuantilesDoc


def slots(cfg: GovernorConfig) -> list[ModelSlot]:
    """The board's slot of each configured model (its default knobs)."""
    return [
        ModelSlot(
            m.name,
            m.namespace,
            Knobs(m.knobs.default_max_num_seqs, m.knobs.default_max_num_batched_tokens),
        )
        for m in cfg.models
    ]


def latency_doc(dist: LatencyDistribution | None) -> LatencyDoc | None:
    """A latency distribution as saved in the state document (None: none observed)."""
    if dist is None:
        return None
    return LatencyDoc(
        ttft=QuantilesDoc(**asdict(dist.ttft)),
        itl=QuantilesDoc(**asdict(dist.itl)),
        e2e=QuantilesDoc(**asdict(dist.e2e)),
        observed_at_unix_s=dist.observed_at_unix_s,
    )


def latency_from_doc(doc: LatencyDoc | None) -> LatencyDistribution | None:
    if doc is None:
        return None
    return LatencyDistribution(
        ttft=LatencyQuantiles(**doc.ttft.model_dump()),
        itl=LatencyQuantiles(**doc.itl.model_dump()),
        e2e=LatencyQuantiles(**doc.e2e.model_dump()),
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
