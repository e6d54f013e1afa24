"""One engine's own keep-alive connection for its metrics scrapes: a plain HTTP/1.1 GET, without aiohttp's
per-request machinery.

Why: a hundred engines read every 0.2 s are 500 GETs a second. aiohttp's client spends about 100 us of
Python on each (request and response objects, headers, cookies, timers, the pool): two fifths of a scrape's
CPU in the running scheduler (bench/scrape_scale.py), the rest being the event loop, the parse and the
gate's bookkeeping. A scrape needs little of that: one GET at a time, on a connection that stays open, of a
small answer with a Content-Length, which is what vLLM, TGI and llama-server write (llama-server keeps its
/metrics connections alive, though not its streams, which aiohttp reads on connections it never reuses).
It asks for no compression, which also spares the engine's front end a gzip per scrape.

Anything else is aiohttp's: `get` raises `Unsupported` for a URL other than http://, an answer without a
Content-Length (chunked), a 1xx or 3xx status (aiohttp follows redirects), an encoded body, or one that does
not parse, and the reader goes through aiohttp for that engine from then on.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple, cast

import aiohttp
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
        async with asyncio.timeout(timeout):
            reused = self._usable()
            try:
                return await self._exchange(request)
            except aiohttp.ServerDisconnectedError:
                if not reused:
                    raise
                return await self._exchange(request)

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

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if not self._usable():
            await self._connect()
        protocol = self._protocol
        assert protocol is not None
        try:
            status, body, keep_alive = await protocol.exchange(request)
        except BaseException:  # an answer not read to its end: the connection cannot carry another
            self.close()
            raise
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


class _Head(NamedTuple):
    status: int
    body_start: int
    length: int
    keep_alive: bool


class _Answer(asyncio.Protocol):
    """Reads one answer at a time: status line, headers, a body of Content-Length bytes."""

    def __init__(self) -> None:
        self.open = False
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self._head: _Head | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a TCP connection's (uvloop's is no subclass)
        self.open = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._waiter is not None and not self._waiter.done():
            if self._buffer:
                self._waiter.set_exception(aiohttp.ClientPayloadError("the engine closed the connection mid-answer"))
            else:
                self._waiter.set_exception(aiohttp.ServerDisconnectedError())

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():  # nothing asked: not an answer to us
            self.close()
            return
        self._buffer += data
        try:
            self._advance(waiter)
        except Unsupported as exc:
            waiter.set_exception(exc)

    def exchange(self, request: bytes) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Send `request`; the future gives (status, body, whether the connection may be kept)."""
        assert self._transport is not None
        self._buffer.clear()
        self._head = None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        return self._waiter

    def close(self) -> None:
        self.open = False
        if self._transport is not None:
            self._transport.close()

    def _advance(self, waiter: asyncio.Future[tuple[int, bytes, bool]]) -> None:
        if self._head is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise Unsupported("answer headers over 64 KB")
                return
            self._head = _parse_head(bytes(self._buffer[:end]), end + 4)
        head = self._head
        size = len(self._buffer) - head.body_start
        if size > head.length:
            raise Unsupported("more bytes than the answer's Content-Length")
        if size == head.length:
            waiter.set_result((head.status, bytes(memoryview(self._buffer)[head.body_start :]), head.keep_alive))


def _parse_head(head: bytes, body_start: int) -> _Head:
    """An HTTP/1.1 answer's status line and headers, when its body is a plain Content-Length one;
    raises Unsupported for anything else."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if version != "HTTP/1.1" or not rest[:3].isdigit():
        raise Unsupported(f"status line {lines[0][:80]!r}")
    status = int(rest[:3])
    if status < 200 or 300 <= status < 400:
        raise Unsupported(f"status {status}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise Unsupported(f"header line {line[:80]!r}")
        name = name.lower()
        if name == "content-length" and name in headers:
            raise Unsupported("two Content-Length headers")
        headers[name] = value.strip()
    length = headers.get("content-length", "")
    if not length.isdigit() or "transfer-encoding" in headers:
        raise Unsupported("not a Content-Length body")
    if headers.get("content-encoding", "identity").lower() != "identity":
        raise Unsupported("an encoded body")
    if int(length) > MAX_BODY:
        raise Unsupported(f"a body of {length} bytes")
    keep_alive = "close" not in headers.get("connection", "").lower()
    return _Head(status, body_start, int(length), keep_alive)
