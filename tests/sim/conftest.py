"""Fixtures for the simulator tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session closed after the test."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as client:
        yield client
