"""Reading an engine's Prometheus endpoint over HTTP, asking for only the samples wanted where it can.

vLLM's front end writes about 50 KB for its bare `/metrics` (11-12 ms of its CPU, bench/tools/scrape_cost.py);
asked for a few series by Prometheus' `name[]` selection at `<metrics path>/` it writes 2 KB. An engine
that answers the selection with 404/405, or without the samples wanted, is read in full from then on. The
adapters' scrapes and the bench's engine probe share this one reader, so they cannot drift apart.

A hundred engines are read hundreds of times a second, so a read does little in Python: the adapters'
readers GET over a kept-alive connection of their own (`backends._metrics_connection`, aiohttp's client for
any answer it does not read), the selecting URL is built once, and the text is read for the named samples
only (`backends._prom_scan`); bench/tools/scrape_scale/ measures each part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import aiohttp
import yarl

from backends._metrics_connection import MetricsConnection, Unsupported
from backends.metrics import MetricSamples, selected_metrics

T = TypeVar("T")
SampleParser = Callable[[str, tuple[str, ...] | None], MetricSamples]


class MetricsStatus(Exception):
    """The metrics endpoint answered with a status other than 200."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class MetricsReader:
    """One engine's metrics URL, and whether it answers `name[]` selections (learned on the first read)."""

    def __init__(
        self,
        metrics_url: str,
        *,
        select_on_server: bool,
        parse: SampleParser = MetricSamples.parse,
        own_connection: bool = False,
    ) -> None:
        """`own_connection`: read over a kept-alive connection of the reader's own (`MetricsConnection`,
        which `close` closes) rather than aiohttp's session, wherever the engine's answers allow it."""
        self.metrics_url = metrics_url
        # None: not known yet; False: read in full (not asked to select, or the engine did not understand)
        self.selected_on_server: bool | None = None if select_on_server else False
        self.parse = parse  # text -> samples (bench/tools/scrape_scale/ sets prometheus-client's beside it)
        self._whole_url = yarl.URL(metrics_url)
        self._selection: tuple[tuple[str, ...], yarl.URL] | None = None  # the names and the URL asking for them
        self._connection: MetricsConnection | None = None
        if own_connection and self._whole_url.scheme == "http":  # https: aiohttp's
            self._connection = MetricsConnection(self._whole_url)

    def close(self) -> None:
        """Close the reader's own connection, if it has one."""
        if self._connection is not None:
            self._connection.close()

    def _selected_url(self, names: tuple[str, ...]) -> yarl.URL:
        """The URL asking for `names` by `name[]`, encoded once rather than at every read (tens of
        microseconds of a scrape's CPU)."""
        if self._selection is None or self._selection[0] != names:
            url, params = selected_metrics(self.metrics_url, names)
            self._selection = (names, yarl.URL(url).extend_query(params))
        return self._selection[1]

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
                result = use(self.parse(await self._text(session, self._selected_url(names), timeout), names))
            except (MetricsStatus, KeyError) as exc:
                if isinstance(exc, MetricsStatus) and exc.status not in (404, 405):
                    raise  # the engine's trouble, not the selection's
                self.selected_on_server = False  # not understood: read in full, now and from now on
            else:
                self.selected_on_server = True
                return result
        return use(self.parse(await self._text(session, self._whole_url, timeout), names))

    async def _text(self, session: aiohttp.ClientSession, url: yarl.URL, timeout: aiohttp.ClientTimeout) -> str:
        """The answer to GET `url` as text: over the reader's own connection where it has one, else (and from
        the first answer that connection does not read on) through aiohttp."""
        connection = self._connection
        if connection is not None:
            try:
                status, body = await connection.get(url, timeout.total)
            except Unsupported:
                connection.close()
                self._connection = None
            else:
                if status != 200:
                    raise MetricsStatus(status)
                return body.decode()
        return await _get(session, url, timeout)


async def _get(session: aiohttp.ClientSession, url: yarl.URL, timeout: aiohttp.ClientTimeout) -> str:
    """The body as text. Prometheus' text format is UTF-8 whatever the header says; decoding it here skips
    aiohttp's charset lookup. Invalid UTF-8 raises UnicodeDecodeError (a ValueError)."""
    async with session.get(url, timeout=timeout) as response:
        if response.status != 200:
            raise MetricsStatus(response.status)
        return (await response.read()).decode()
