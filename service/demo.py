"""What `governor run --simulated-fleet` needs: the demo config and the simulator seam.

The service sits above the simulator in the layering, so it may build the embedded
simulated fleet itself (`simulated_fleet_factory`).
"""

from __future__ import annotations

from pathlib import Path

from controller.actuation import Actuator
from controller.config import GovernorConfig
from estimators.types import MetricSource
from service.errors import SimulatorUnavailableError

DEMO_MODEL = "demo"


def simulated_fleet_factory(
    trace: str, config: GovernorConfig, *, rate_scale: float = 1.0, speed: float = 1.0
) -> tuple[MetricSource, Actuator]:
    """The seam `governor run --simulated-fleet TRACE` uses: build the embedded simulated
    fleet for `trace` (a trace file path or `synthetic:NAME`) serving `config`'s models,
    and return (its MetricSource, the Actuator that resizes it), both in real time.

    `rate_scale` multiplies the trace's rate (same span); `speed` is simulated seconds
    per real second. Raises SimulatorUnavailableError with a clear message when the trace
    spec is wrong or the simulator cannot be imported.
    """
    if trace.startswith(("synthetic:", "azure:")):
        if not trace.removeprefix("synthetic:"):
            raise SimulatorUnavailableError(
                f"--simulated-fleet synthetic:NAME needs a NAME{_synthetic_names()}"
            )
    elif not Path(trace).is_file():
        raise SimulatorUnavailableError(
            f"--simulated-fleet: trace file {trace!r} not found (give a CSV/JSONL path "
            "or synthetic:NAME)"
        )
    import importlib

    try:
        realtime = importlib.import_module("simulator.realtime")
    except ImportError as exc:
        raise SimulatorUnavailableError(
            "--simulated-fleet needs the simulator (simulator.realtime), "
            f"which is not available in this build: {exc}"
        ) from None
    try:
        fleet = realtime.build(trace, config, rate_scale=rate_scale, speed=speed)
    except (OSError, ValueError) as exc:
        raise SimulatorUnavailableError(f"--simulated-fleet {trace}: {exc}") from None
    except MemoryError:
        raise SimulatorUnavailableError(
            f"--simulated-fleet {trace} at --sim-rate-scale {rate_scale:g}: out of memory "
            "building the scaled trace: lower --sim-rate-scale"
        ) from None
    return fleet, fleet


def _synthetic_names() -> str:
    """` (one of synthetic:a, synthetic:b, ...)`: the simulator's synthetic traces, or
    nothing when the simulator is not in this build."""
    try:
        from simulator.traces import SYNTHETIC_DEFAULTS
    except ImportError:
        return ""
    return " (one of " + ", ".join(f"synthetic:{n}" for n in sorted(SYNTHETIC_DEFAULTS)) + ")"


def demo_config() -> GovernorConfig:
    """The config `--simulated-fleet` uses without `--config`: one model named `demo`."""
    return GovernorConfig.model_validate(
        {
            "models": [
                {
                    "name": DEMO_MODEL,
                    "deployment": DEMO_MODEL,
                    "sla": {"ttft_p95_ms": 1000, "itl_p95_ms": 50},
                    "replicas": {"min_replicas": 1, "max_replicas": 16},
                }
            ]
        }
    )
