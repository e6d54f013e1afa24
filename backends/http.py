"""The HTTP plumbing every adapter shares: one aiohttp session, metric scrapes, error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from backends.base import BackendLoad, HttpSettings, TraceContext
from backends.errors import (
    BackendError,
    BackendOverloaded,
    BackendProtocolError,
    BackendRejectedRequest,
    BackendUnavailable,
)
from backends.metrics import MetricSamples
from backends.metrics_reader import MetricsReader, MetricsStatus


def engine_connector(limit: int, *, force_close: bool, idle_seconds: float) -> aiohttp.TCPConnector:
    """A connection pool towards an engine: `limit` connections (0: no limit), none reused with
    `force_close` (llama-server closes after each streamed response), else idle ones closed after
    `idle_seconds`, under the engine's own keep-alive (see `HttpEngine`)."""
    if force_close:  # no connection is reused: nothing stays idle
        return aiohttp.TCPConnector(limit=limit, force_close=True)
    return aiohttp.TCPConnector(limit=limit, keepalive_timeout=idle_seconds)


class HttpEngine:
    """An engine's base URL with a lazily created aiohttp session (it must be created inside a loop).

    Idle pooled connections are closed after `idle_connection_seconds`, which must stay under the engine's
    own keep-alive (vLLM's and uvicorn's default is 5 s; aiohttp's client default of 15 s is not): a request
    sent on a connection the engine is closing fails with "Server disconnected", and on a busy machine the
    engine's close is often not yet read when the connection is picked. That race, should it happen anyway,
    gets one retry on another connection (`post_stream`).
    """

    def __init__(
        self,
        *,
        name: str,
        url: str,
        settings: HttpSettings,
        force_close: bool = False,
        select_metrics_on_server: bool = False,
    ) -> None:
        self.name = name
        self.base_url = url.rstrip("/")
        self._metrics = MetricsReader(
            self.base_url + settings.metrics_path, select_on_server=select_metrics_on_server, own_connection=True
        )
        self._metrics_timeout = aiohttp.ClientTimeout(total=settings.metrics_timeout)
        self._request_timeout = aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout)
        self._max_connections = settings.max_connections
        self._idle_connection_seconds = settings.idle_connection_seconds
        self._force_close = force_close
        self._session: aiohttp.ClientSession | None = None

    @property
    def metrics_selected_on_server(self) -> bool | None:
        """Whether the engine answers `name[]` selections under `<metrics path>/` (None: not known yet)."""
        return self._metrics.selected_on_server

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = engine_connector(
                self._max_connections, force_close=self._force_close, idle_seconds=self._idle_connection_seconds
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._request_timeout)
        return self._session

    async def aclose(self) -> None:
        self._metrics.close()
        if self._session is not None:
            await self._session.close()

    async def scrape(
        self, parse: Callable[[MetricSamples, float], BackendLoad], names: tuple[str, ...] | None = None
    ) -> BackendLoad:
        """Read the metrics endpoint once (only the samples called `names`, when given); any failure
        becomes an ok=False reading, never an exception.

        With `select_metrics_on_server`, the samples are asked for by Prometheus' own `name[]` selection
        at `<metrics path>/` (prometheus-client's exposition app, which vLLM mounts there; its bare
        `/metrics` route ignores the selection): vLLM's front end then writes 2 KB instead of 50 KB, 1.3-1.9
        ms of its CPU a scrape instead of 11-12 ms (CPU vLLM 0.32, bench/tools/scrape_cost.py), several times a
        second, on the process that also streams every token. An engine that answers the selection with
        404/405, or without the samples `parse` needs, is read in full from then on."""
        read_at = time.monotonic()
        try:
            return await self._metrics.read(
                self.session, names, lambda samples: parse(samples, read_at), self._metrics_timeout
            )
        except asyncio.CancelledError:
            raise
        except MetricsStatus as exc:
            return BackendLoad(ok=False, read_at=read_at, error=f"HTTP {exc.status}")
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            return BackendLoad(ok=False, read_at=read_at, error=f"{type(exc).__name__}: {exc}")

    @contextlib.asynccontextmanager
    async def streaming(
        self, path: str, body: dict[str, Any], request_id: str, trace: TraceContext | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST (as `post_stream`) and hold the engine's response for the block. The connection goes back to
        the pool only when the block ends normally; any other end closes it, which aborts the request in
        the engine: an error, a cancel, and the close of an adapter's generator at any of its yields (its
        caller left) alike. Cancelled while the request is being sent or its answer awaited, aiohttp
        closes the connection itself, so the engine drops it or never starts it."""
        response = await self.post_stream(path, body, request_id, trace)
        try:
            yield response
        except BaseException:
            response.close()
            raise
        response.release()

    async def post_stream(
        self, path: str, body: dict[str, Any], request_id: str, trace: TraceContext | None = None
    ) -> aiohttp.ClientResponse:
        """POST and return the response once its headers say success; map failures to BackendErrors.

        `X-Request-Id` carries our id so engine logs and aborts (vLLM uses it as its own id) match ours;
        `traceparent` and `tracestate` carry `trace`, so the engine's spans join the request's trace.
        The caller owns the response and must close it (closing early aborts the request in the engine).
        A connection that breaks before any answer is tried once more on another connection: that is how
        a pooled connection the engine closed for idleness fails, and the engine has not started the
        request (had it, the broken connection aborts it there). Refused connections are not retried.
        """
        url, headers = self.base_url + path, {"X-Request-Id": request_id}
        if trace is not None:
            headers["traceparent"] = trace.traceparent
            if trace.tracestate:
                headers["tracestate"] = trace.tracestate
        try:
            try:
                response = await self.session.post(url, json=body, headers=headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise
                response = await self.session.post(url, json=body, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BackendUnavailable(f"cannot reach engine {self.name}: {exc}", backend=self.name) from exc
        if response.status == 200:
            return response
        try:
            text = await response.text()
        except aiohttp.ClientError:
            text = ""
        finally:
            response.release()
        raise http_error(response.status, text, self.name)


def http_error(status: int, body: str, backend: str) -> BackendError:
    """The BackendError for a non-200 answer, carrying the engine's own message."""
    message = f"engine {backend} answered HTTP {status}: {error_message(body)}"
    if status == 429:
        return BackendOverloaded(message, backend=backend)
    if status in (400, 413, 422):
        return BackendRejectedRequest(message, backend=backend)
    if status >= 500 or status == 404:
        return BackendUnavailable(message, backend=backend)
    return BackendProtocolError(message, backend=backend)


def error_message(body: str) -> str:
    """The human part of an engine's JSON error body (vLLM/OpenAI, TGI and llama.cpp shapes)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:500]
        if isinstance(err, str):
            return err[:500]
        if "message" in data:
            return str(data["message"])[:500]
    return body[:500]


def stream_failure(exc: Exception, backend: str) -> BackendUnavailable:
    """A connection that broke while the engine was streaming."""
    return BackendUnavailable(f"engine {backend} dropped the stream: {type(exc).__name__}: {exc}", backend=backend)
