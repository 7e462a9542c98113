"""structlog set-up: one JSON object per line on stderr, ISO timestamps (UTC)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", json: bool = True) -> None:
    """Configure structlog once for the process. `level`: debug, info, warning, error."""
    lvl = logging.getLevelNamesMapping().get(level.upper())
    if lvl is None:
        raise ValueError(f"log level must be one of debug, info, warning, error (got {level!r})")
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
