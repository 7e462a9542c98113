"""Every metric family the service exposes on /metrics is listed in the README's
Metrics table: a metric added without documentation fails here."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from actuators.rollout import KnobRolloutActuator
from service.core import ServiceCore
from service.run import register_actuator_metrics
from service.store import MemoryStore
from tests.service.fakes import FakeSource, make_config, model_entry

README = Path(__file__).resolve().parents[2] / "README.md"


def _exposed_names(registry: CollectorRegistry) -> set[str]:
    """The names as scraped: a counter family `x` is exposed as `x_total`."""
    return {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in registry.collect()
    }


def test_every_exposed_metric_is_in_the_readme_table() -> None:
    """With the actuators' own metrics too, as `governor run` registers them inside a
    cluster (the knob roll-out actuator's; it makes no API call here)."""
    rollouts = KnobRolloutActuator(None, dict, lambda model: 0.0, background=False)
    core = ServiceCore(make_config(model_entry()), FakeSource(), MemoryStore())
    try:
        register_actuator_metrics(core.metrics.registry, [rollouts])
        names = _exposed_names(core.metrics.registry)
    finally:
        core.close()
        rollouts.close()
    section = README.read_text().split("\n### Metrics\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(governor_[a-z_]+)` \|", section, flags=re.M))
    assert "governor_ticks_total" in names and len(names) > 20, names
    assert all(n.startswith("governor_") for n in names), names
    assert sorted(names - documented) == [], "exposed on /metrics but not in README's table"
    assert sorted(documented - names) == [], "in README's table but not exposed"
