"""Reading an engine's Prometheus endpoint over HTTP, asking for only the samples wanted where it can.

vLLM's front end writes about 50 KB for its bare `/metrics` (11-12 ms of its CPU, bench/tools/scrape_cost.py);
asked for a few series by Prometheus' `name[]` selection at `<metrics path>/` it writes 2 KB. An engine
that answers the selection with 404/405, or without the samples wanted, is read in full from then on. The
adapters' scrapes and the bench's engine probe share this one reader, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import aiohttp

from backends._prom import MetricSamples, selected_metrics

T = TypeVar("T")


class MetricsStatus(Exception):
    """The metrics endpoint answered with a status other than 200."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class MetricsReader:
    """One engine's metrics URL, and whether it answers `name[]` selections (learned on the first read)."""

    def __init__(self, metrics_url: str, *, select_on_server: bool) -> None:
        self.metrics_url = metrics_url
        # None: not known yet; False: read in full (not asked to select, or the engine did not understand)
        self.selected_on_server: bool | None = None if select_on_server else False

    async def read(
        self,
        session: aiohttp.ClientSession,
        names: tuple[str, ...] | None,
        use: Callable[[MetricSamples], T],
        timeout: aiohttp.ClientTimeout,
    ) -> T:
        """`use` applied to one read of the samples called `names` (all samples when None). `use` raising
        KeyError says a selection lacked what it needs. Raises MetricsStatus for an answer other than 200
        (404/405 to a selection only switch to full reads), and aiohttp's or the parser's errors."""
        if names is not None and self.selected_on_server is not False:
            try:
                url, params = selected_metrics(self.metrics_url, names)
                result = use(MetricSamples.parse(await _get(session, url, params, timeout), names))
            except (MetricsStatus, KeyError) as exc:
                if isinstance(exc, MetricsStatus) and exc.status not in (404, 405):
                    raise  # the engine's trouble, not the selection's
                self.selected_on_server = False  # not understood: read in full, now and from now on
            else:
                self.selected_on_server = True
                return result
        return use(MetricSamples.parse(await _get(session, self.metrics_url, None, timeout), names))


async def _get(
    session: aiohttp.ClientSession, url: str, params: list[tuple[str, str]] | None, timeout: aiohttp.ClientTimeout
) -> str:
    async with session.get(url, params=params, timeout=timeout) as response:
        if response.status != 200:
            raise MetricsStatus(response.status)
        return await response.text()
