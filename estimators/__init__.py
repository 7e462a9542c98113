"""estimators: read serving signals and turn them into typed estimates.

Owns the `MetricSource` protocol, the Prometheus source, PromQL templates, smoothing
(EWMA, Holt), the step-time model and its profiles. Imports nothing else of ours.
"""

from estimators.types import (
    MetricSource,
    ModelQuery,
    NoDataError,
    Observation,
    ObservationResult,
    SourceError,
)

__all__ = [
    "MetricSource",
    "ModelQuery",
    "NoDataError",
    "Observation",
    "ObservationResult",
    "SourceError",
]
