"""One engine's own keep-alive connection for its metrics scrapes: a plain HTTP/1.1 GET, without aiohttp's
per-request machinery.

Why: a hundred engines read every 0.2 s are 500 GETs a second. aiohttp's client spends about 100 us of
Python on each (request and response objects, headers, cookies, timers, the pool): a third of a scrape's
CPU in the running scheduler (bench/tools/scrape_scale/), the rest being the event loop, the parse and the
gate's bookkeeping. A scrape needs little of that: one GET at a time, on a connection that stays open, its
answer read by httptools' parser (llhttp, in C: Content-Length or chunked, as vLLM's /metrics/ writes).
llama-server keeps its /metrics connections alive, though not its streams, which aiohttp reads on
connections it never reuses, so there the kept connection also saves a TCP connection a scrape. It asks for
no compression, which spares the engine's front end a gzip per scrape.

Anything else is aiohttp's: `get` raises `Unsupported` for a URL other than http://, a 1xx or 3xx status
(aiohttp follows redirects), an encoded body, a body that ends with the connection, or bytes that do not
parse, and the reader goes through aiohttp for that engine from then on.
"""

from __future__ import annotations

import asyncio
from typing import cast

import aiohttp
import httptools
import yarl

MAX_HEAD = 64 * 1024  # status line and headers
MAX_BODY = 32 * 1024 * 1024  # vLLM's whole /metrics is 55 KB


class Unsupported(Exception):
    """An answer (or URL) this connection does not read: the caller uses aiohttp instead."""


class MetricsConnection:
    """GETs to one engine, one at a time, on one kept-alive connection (opened when needed)."""

    def __init__(self, url: yarl.URL) -> None:
        """`url`: any URL of the engine (its host and port). Raises Unsupported for a scheme other than http."""
        if url.scheme != "http" or not url.raw_host:
            raise Unsupported(f"{url.scheme}:// is read through aiohttp")
        host = url.raw_host
        self._host, self._port = host, url.port or 80
        bracketed = f"[{host}]" if ":" in host else host
        self._host_header = bracketed if url.explicit_port is None else f"{bracketed}:{url.explicit_port}"
        self._requests: dict[yarl.URL, bytes] = {}
        self._protocol: _Answer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def get(self, url: yarl.URL, timeout: float | None) -> tuple[int, bytes]:
        """The status and body of GET `url` (on this engine), within `timeout` seconds in all. A kept
        connection found closed before it answered (the engine closed it while idle) is replaced once.
        Raises Unsupported, TimeoutError or aiohttp.ClientConnectionError (the engine unreachable or gone)."""
        request = self._requests.get(url)
        if request is None:
            request = self._request(url)
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        reused = self._usable()
        try:
            return await self._exchange(request, deadline)
        except aiohttp.ServerDisconnectedError:
            if not reused:
                raise
            return await self._exchange(request, deadline)

    def close(self) -> None:
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None

    def _request(self, url: yarl.URL) -> bytes:
        if len(self._requests) >= 8:  # a reader asks for two URLs; anything past that is not kept
            self._requests.clear()
        self._requests[url] = request = (
            f"GET {url.raw_path_qs} HTTP/1.1\r\nHost: {self._host_header}\r\nAccept: */*\r\n"
            "Accept-Encoding: identity\r\nUser-Agent: llm-scheduler\r\n\r\n"
        ).encode("ascii")
        return request

    def _usable(self) -> bool:
        return self._protocol is not None and self._protocol.open and self._loop is asyncio.get_running_loop()

    async def _exchange(self, request: bytes, deadline: float | None) -> tuple[int, bytes]:
        """One GET on the kept connection (opened first if need be), answered by `deadline` on the loop's
        clock or TimeoutError. The answer's deadline is a timer on its future, not `asyncio.timeout`: that
        one's task bookkeeping is a tenth of a scrape's CPU, and only the connecting needs to be cancelled."""
        if not self._usable():
            async with asyncio.timeout_at(deadline):
                await self._connect()
        protocol = self._protocol
        assert protocol is not None
        answer = protocol.exchange(request)
        timer = None if deadline is None else asyncio.get_running_loop().call_at(deadline, _expire, answer)
        try:
            status, body, keep_alive = await answer
        except BaseException:  # an answer not read to its end: the connection cannot carry another
            self.close()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if not keep_alive:
            self.close()
        return status, body

    async def _connect(self) -> None:
        self.close()
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(_Answer, self._host, self._port)
        except OSError as exc:
            raise aiohttp.ClientConnectionError(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
        self._protocol, self._loop = protocol, loop


def _expire(answer: asyncio.Future[tuple[int, bytes, bool]]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


class _Answer(asyncio.Protocol):
    """Reads one answer at a time with httptools' parser (llhttp: Content-Length or chunked bodies, trailers,
    keep-alive rules), refusing what aiohttp should read instead."""

    def __init__(self) -> None:
        self.open = False
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._received = 0  # bytes of the answer so far
        self._headers_done = False
        self._framed = False  # a Content-Length or a Transfer-Encoding: not a body that ends with the connection
        self._encoded = False
        self._body: list[bytes] = []
        self._size = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a TCP connection's (uvloop's is no subclass)
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._waiter is not None and not self._waiter.done():
            if self._received:
                self._waiter.set_exception(aiohttp.ClientPayloadError("the engine closed the connection mid-answer"))
            else:
                self._waiter.set_exception(aiohttp.ServerDisconnectedError())

    def exchange(self, request: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Send `request`; the future gives (status, body, whether the connection may be kept)."""
        assert self._transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._received, self._headers_done, self._framed, self._encoded = 0, False, False, False
        self._body, self._size = [], 0
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return self._waiter

    def close(self) -> None:
        self.open = False
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        waiter, parser = self._waiter, self._parser
        if waiter is None or waiter.done() or parser is None:  # nothing asked: not an answer to us
            self.close()
            return
        self._received += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            failure = refused if isinstance(refused, Unsupported) else Unsupported(f"unreadable answer: {exc}")
            self._fail(waiter, failure)
        except httptools.HttpParserError as exc:  # bytes that are not (or not only) one answer
            self._fail(waiter, Unsupported(f"unreadable answer: {exc}"))
        else:
            if not self._headers_done and self._received > MAX_HEAD:
                self._fail(waiter, Unsupported("answer headers over 64 KB"))

    def _fail(self, waiter: asyncio.Future[tuple[int, bytes, bool]], failure: Unsupported) -> None:
        if waiter.done():  # garbage after a whole answer: the answer stands, the connection goes
            self.close()
        else:
            waiter.set_exception(failure)

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in (b"content-length", b"transfer-encoding"):
            self._framed = True
        elif name == b"content-encoding" and value.strip().lower() != b"identity":
            self._encoded = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._headers_done = True
        status = self._parser.get_status_code()
        if status < 200 or 300 <= status < 400:
            raise Unsupported(f"status {status}")  # aiohttp's: it follows redirects
        if not self._framed:
            raise Unsupported("a body that ends with the connection")
        if self._encoded:
            raise Unsupported("an encoded body")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_BODY:
            raise Unsupported(f"a body over {MAX_BODY} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser, waiter = self._parser, self._waiter
        assert parser is not None and waiter is not None
        self._parser = None  # anything after this answer is not ours
        if not waiter.done():
            waiter.set_result((parser.get_status_code(), b"".join(self._body), parser.should_keep_alive()))
