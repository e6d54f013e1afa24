"""The reader's own metrics connection: one kept-alive connection per engine over real loopback sockets, and
aiohttp's client wherever an answer is not a plain Content-Length one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest
import yarl
from aiohttp import web

from backends._metrics_connection import MetricsConnection, Unsupported
from backends.metrics_reader import MetricsReader, MetricsStatus

TEXT = "# TYPE up gauge\nup 1\n"
TIMEOUT = aiohttp.ClientTimeout(total=5)


@asynccontextmanager
async def aiohttp_engine(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[tuple[str, list[object]]]:
    """An engine answering every GET with `handler`; yields its URL and the peer of each request."""
    peers: list[object] = []

    async def record(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return await handler(request)

    app = web.Application()
    app.router.add_get("/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", peers
    finally:
        await runner.cleanup()


@asynccontextmanager
async def raw_engine(
    answers: list[bytes | None], close_after_each: bool = False
) -> AsyncIterator[tuple[str, list[bytes]]]:
    """An engine writing `answers` verbatim, one per request, in order (None: hang up instead of answering;
    after an answer saying `Connection: close` it answers nothing more on that connection, nor closes it);
    yields its URL and the requests."""
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while answers:
                requests.append(await reader.readuntil(b"\r\n\r\n"))
                reply = answers.pop(0)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if b"Connection: close" in reply:
                    await reader.read()  # until the client closes
                if close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", requests
    finally:
        server.close()


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


async def text(request: web.Request) -> web.Response:
    return web.Response(text=TEXT, content_type="text/plain")


async def read(reader: MetricsReader, session: aiohttp.ClientSession) -> float | None:
    return await reader.read(session, ("up",), lambda samples: samples.total("up"), TIMEOUT)


async def test_scrapes_share_one_kept_connection_and_ask_for_no_compression() -> None:
    async with aiohttp_engine(text) as (url, peers), aiohttp.ClientSession() as session:
        reader = MetricsReader(url + "/metrics", select_on_server=False, own_connection=True)
        try:
            assert [await read(reader, session) for _ in range(3)] == [1.0, 1.0, 1.0]
        finally:
            reader.close()
    assert len(peers) == 3 and len(set(peers)) == 1


async def test_an_answer_saying_connection_close_is_read_and_the_next_scrape_reconnects() -> None:
    """llama-server ends its 100th answer on a connection with `Connection: close`."""
    body = TEXT.encode()
    async with raw_engine([answer(body, "Connection: close"), answer(body)]) as (url, asked):
        connection = MetricsConnection(yarl.URL(url))
        try:
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
            assert await connection.get(yarl.URL(url + "/metrics"), 1) == (200, body)  # not on the first one
        finally:
            connection.close()
    assert len(asked) == 2 and asked[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Accept-Encoding: identity\r\n" in asked[0]


async def test_a_kept_connection_the_engine_closed_while_idle_is_replaced_once() -> None:
    """The engine closes after its answer without saying so; the next scrape finds the connection gone
    (or sends on it as it closes) and asks again on a new one."""
    body = TEXT.encode()
    async with raw_engine([answer(body), answer(body)], close_after_each=True) as (url, asked):
        connection = MetricsConnection(yarl.URL(url))
        try:
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
        finally:
            connection.close()
    assert len(asked) == 2


async def test_a_kept_connection_that_breaks_as_a_scrape_goes_out_is_replaced_once() -> None:
    """The engine hangs up on the second request of a kept connection (its close crossing our request): that
    request is asked again on a new connection; a new connection that hangs up is an error."""
    body = TEXT.encode()
    async with raw_engine([answer(body), None, answer(body), None]) as (url, asked):
        connection = MetricsConnection(yarl.URL(url))
        try:
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
            connection.close()
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await connection.get(yarl.URL(url + "/metrics"), 5)
        finally:
            connection.close()
    assert len(asked) == 4


async def test_a_status_other_than_200_reaches_the_reader_as_metrics_status() -> None:
    async def missing(request: web.Request) -> web.Response:
        return web.Response(status=404, text="no")

    async with aiohttp_engine(missing) as (url, _), aiohttp.ClientSession() as session:
        reader = MetricsReader(url + "/metrics", select_on_server=False, own_connection=True)
        try:
            with pytest.raises(MetricsStatus) as raised:
                await read(reader, session)
        finally:
            reader.close()
    assert raised.value.status == 404


async def test_chunked_answers_are_read_whole_however_the_bytes_arrive() -> None:
    """vLLM's /metrics/ (prometheus-client's app under uvicorn) answers chunked, with no Content-Length."""
    body = TEXT.encode()
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in (body[:7], body[7:])
    )
    async with raw_engine([chunked + b"0\r\nX-Trailer: 1\r\n\r\n", chunked + b"0\r\n\r\n"]) as (url, asked):
        connection = MetricsConnection(yarl.URL(url))
        try:
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
        finally:
            connection.close()
    assert len(asked) == 2


async def test_bytes_past_an_answer_cost_the_connection_not_the_answer() -> None:
    body = TEXT.encode()
    async with raw_engine([answer(body) + b"extra", answer(body)]) as (url, asked):
        connection = MetricsConnection(yarl.URL(url))
        try:
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, body)
        finally:
            connection.close()
    assert len(asked) == 2


@pytest.mark.parametrize(
    "odd",
    [
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /metrics\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.0 200 OK\r\n\r\n# TYPE up gauge\nup 1\n",
        answer(TEXT.encode(), "Content-Encoding: gzip"),
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n",
    ],
    ids=["redirect", "1xx", "ends with the connection", "gzip", "bad length", "not http", "huge headers"],
)
async def test_an_answer_the_connection_does_not_read_is_unsupported(odd: bytes) -> None:
    async with raw_engine([odd]) as (url, _):
        connection = MetricsConnection(yarl.URL(url))
        try:
            with pytest.raises(Unsupported):
                await connection.get(yarl.URL(url + "/metrics"), 5)
        finally:
            connection.close()


async def test_the_reader_turns_to_aiohttp_for_good_at_the_first_answer_it_does_not_read() -> None:
    async def redirecting(request: web.Request) -> web.Response:
        if request.path == "/metrics":
            raise web.HTTPTemporaryRedirect("/exported")
        return web.Response(text=TEXT, content_type="text/plain")

    async with aiohttp_engine(redirecting) as (url, peers), aiohttp.ClientSession() as session:
        reader = MetricsReader(url + "/metrics", select_on_server=False, own_connection=True)
        try:
            assert [await read(reader, session) for _ in range(3)] == [1.0, 1.0, 1.0]
            assert reader._connection is None
        finally:
            reader.close()
    assert len(peers) == 7  # the own connection's try, then aiohttp's three, each redirected


async def test_a_silent_engine_times_out_and_the_next_scrape_starts_afresh() -> None:
    """An answer cut short by the timeout leaves the connection unusable: it is closed, not reused."""
    release = asyncio.Event()

    async def slow_then_fast(request: web.Request) -> web.Response:
        if not release.is_set():
            await release.wait()
        return web.Response(text=TEXT, content_type="text/plain")

    async with aiohttp_engine(slow_then_fast) as (url, peers):
        connection = MetricsConnection(yarl.URL(url))
        try:
            with pytest.raises(TimeoutError):
                await connection.get(yarl.URL(url + "/metrics"), 0.05)
            release.set()
            assert await connection.get(yarl.URL(url + "/metrics"), 5) == (200, TEXT.encode())
        finally:
            connection.close()
    assert len(set(peers)) == 2


async def test_an_unreachable_engine_is_a_connection_error_and_a_failed_reading() -> None:
    async with aiohttp_engine(text) as (url, _):
        pass  # closed: nothing listens there any more
    connection = MetricsConnection(yarl.URL(url))
    with pytest.raises(aiohttp.ClientConnectionError):
        await connection.get(yarl.URL(url + "/metrics"), 5)


def test_https_is_left_to_aiohttp() -> None:
    with pytest.raises(Unsupported):
        MetricsConnection(yarl.URL("https://engine:8000/metrics"))
    reader = MetricsReader("https://engine:8000/metrics", select_on_server=False, own_connection=True)
    assert reader._connection is None


async def test_the_selection_learning_works_over_the_own_connection() -> None:
    """An engine that answers `name[]` at /metrics/ with 404 is read whole from then on, as through aiohttp."""

    async def whole_only(request: web.Request) -> web.Response:
        if request.path != "/metrics":
            return web.Response(status=404)
        return web.Response(text=TEXT, content_type="text/plain")

    async with aiohttp_engine(whole_only) as (url, peers), aiohttp.ClientSession() as session:
        reader = MetricsReader(url + "/metrics", select_on_server=True, own_connection=True)
        try:
            assert [await read(reader, session) for _ in range(2)] == [1.0, 1.0]
        finally:
            reader.close()
    assert reader.selected_on_server is False and len(peers) == 3 and len(set(peers)) == 1
