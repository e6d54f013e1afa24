"""Structured logging setup (structlog), console or JSON."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "info", fmt: str = "console", *, cache: bool = False) -> None:
    """Route structlog output to stderr in the chosen format; idempotent.

    `cache` (the server process) binds each module's logger once, on its first call: uncached, every log
    call on the request path, even a filtered-out debug line, builds a new bound logger and output file
    wrapper. Tests leave it off so `structlog.testing.capture_logs` can still swap the configuration.
    """
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=cache,
    )
