"""Logging setup: the server binds its loggers once; tests keep them swappable."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from scheduler_svc.app.logs import configure_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    yield
    configure_logging("warning")  # what tests/conftest.py sets for the whole run


def test_the_server_binds_each_module_logger_once(restore_logging: None) -> None:
    """Uncached, every call (even a filtered-out debug line on the request path) builds a new logger."""
    configure_logging("info", cache=True)
    log = structlog.get_logger("hot-path")
    log.debug("filtered out")
    assert "bind" in vars(log)  # the lazy proxy replaced its bind with the finished logger's


def test_tests_keep_loggers_uncached_so_capture_logs_works(restore_logging: None) -> None:
    configure_logging("info")
    log = structlog.get_logger("swappable")
    log.debug("filtered out")
    assert "bind" not in vars(log)
