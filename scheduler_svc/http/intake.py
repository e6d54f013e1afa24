"""What the HTTP door reads before a request is admitted, and for how long: bounded in time and in memory.

Everything a client sends before admission (where the queue caps and byte caps take over) is held here:

- Headers: from a request's first byte, `server.http_header_timeout_seconds` to complete them, else a 408
  and the connection closed; a header line is at most 8190 bytes and a request carries at most 64 headers
  (aiohttp's parser refuses more).
- Idle: a connection with no request in progress is closed after `server.http_idle_timeout_seconds`, the
  one before its first request too (aiohttp's keep-alive timer).
- Body: a Content-Length over the body limit is refused at once, a body that grows past it while read
  likewise (413); the whole body must arrive within `server.http_body_timeout_seconds` of its headers (408),
  and before the call's own deadline when it names one (`x-request-timeout-ms`: 504 `deadline_exceeded`).
- Bytes being read: every body's bytes count, as they arrive and until the body is parsed, against a bound
  per caller and, past each body's first 64 KiB, one for all callers (`server.http_max_reading_bytes*`, 503
  beyond either). A crowd of slow or stalled bodies holds bounded memory, one caller's leave room for
  everyone else's, and ordinary bodies are still read while large ones from many callers fill the total.

Memory for bodies is thus at most the total bound plus 64 KiB per open connection; aiohttp itself buffers
about as much of a connection's unread body before it stops reading the socket.
A request aiohttp cannot parse is answered in OpenAI's error shape and logged on one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from scheduler_svc.core.errors import (
    DeadlineExceeded,
    InternalError,
    MalformedRequest,
    PromptTooLarge,
    ReadCapacityFull,
    ReadTimeout,
    SchedulerError,
)
from scheduler_svc.http.errors import ErrorReply, error_reply

log = structlog.get_logger(__name__)

MAX_HEADER_FIELD_BYTES = 8190  # one header line (aiohttp's default, stated here so it is a decision)
MAX_HEADERS = 64
SMALL_BODY_BYTES = 64 * 1024  # of each body, read whatever the total (what aiohttp buffers per connection anyway)
LINGER_SECONDS = 1.0  # after an early answer (413, 408, 503), unread body bytes are read and dropped this long,
# so the client can read the answer before the connection closes under it


class ReadBudget:
    """Bytes of request bodies held while being read and parsed: per caller, and (past each body's first
    SMALL_BODY_BYTES) in all."""

    def __init__(self, total: int, per_user: int) -> None:
        self.total = total
        self.per_user = per_user
        self.held = 0  # bytes counted against the total
        self._users: dict[str, int] = {}  # only callers with a body being read: each entry goes at zero

    def user_bytes(self, user: str) -> int:
        return self._users.get(user, 0)

    def take(self, user: str, size: int, counted: int) -> None:
        """Hold `size` more bytes for `user`'s body, `counted` of them against the total too;
        ReadCapacityFull when a bound would pass."""
        held = self._users.get(user, 0)
        if held + size > self.per_user:
            raise ReadCapacityFull(
                f"the server is reading {held} bytes of this caller's request bodies (limit {self.per_user}, "
                "server.http_max_reading_bytes_per_user); retry shortly"
            )
        if counted and self.held + counted > self.total:
            raise ReadCapacityFull(
                f"the server is reading {self.held} bytes of large request bodies (limit {self.total}, "
                "server.http_max_reading_bytes); retry shortly"
            )
        self.held += counted
        self._users[user] = held + size

    def give(self, user: str, size: int, counted: int) -> None:
        """Release what `take` held for `user`."""
        self.held -= counted
        left = self._users.get(user, 0) - size
        if left > 0:
            self._users[user] = left
        else:
            self._users.pop(user, None)

    def __len__(self) -> int:
        """Callers with a body being read now."""
        return len(self._users)


class Intake:
    """Reads request bodies within the door's bounds."""

    def __init__(self, *, body_limit: int, body_timeout: float, budget: ReadBudget) -> None:
        self.body_limit = body_limit
        self.body_timeout = body_timeout
        self.budget = budget

    @contextlib.asynccontextmanager
    async def body(self, request: web.Request, user: str, *, call_timeout: float | None = None) -> AsyncIterator[bytes]:
        """The request's whole body, held against the budget until the block ends (parse it inside). With the
        call's own deadline (`call_timeout`, from its headers) shorter than the body's, a body still arriving
        then is given up on there: its client has given up by then."""
        self.check_length(request)
        limit = self.body_limit
        held = counted = 0
        read_for = self.body_timeout if call_timeout is None else min(call_timeout, self.body_timeout)
        try:
            chunks: list[bytes] = []  # joined once complete: a growing buffer would reallocate (and fragment)
            try:
                async with asyncio.timeout(read_for):
                    while chunk := await request.content.readany():
                        size = held + len(chunk)
                        if size > limit:
                            raise self._too_large()
                        beyond_small = max(0, size - max(held, SMALL_BODY_BYTES))
                        self.budget.take(user, len(chunk), beyond_small)
                        held, counted = size, counted + beyond_small
                        chunks.append(chunk)
            except TimeoutError:
                if read_for < self.body_timeout:  # the call's deadline came first
                    raise DeadlineExceeded(
                        f"the call's deadline ({call_timeout:g} s, x-request-timeout-ms) passed while its body was "
                        "being read"
                    ) from None
                raise ReadTimeout(
                    f"the request body did not arrive within {self.body_timeout:g} s (server.http_body_timeout_seconds)"
                ) from None
            except (RequestPayloadError, HttpProcessingError) as exc:  # bad chunked framing, broken compression
                # The stream is broken: marked ended, so aiohttp does not read on after the answer (it would
                # meet the error again, and log it with a traceback); the answer closes the connection.
                request.content.feed_eof()
                cause = exc.__cause__ if isinstance(exc, RequestPayloadError) else exc
                message = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
                raise MalformedRequest(f"the request body cannot be read: {message}") from None
            body = b"".join(chunks)
            chunks.clear()
            yield body
        finally:
            self.budget.give(user, held, counted)

    def check_length(self, request: web.Request) -> None:
        """Refuse (`PromptTooLarge`) a body its Content-Length says is over the limit, before reading any of it."""
        if request.content_length is not None and request.content_length > self.body_limit:
            raise self._too_large()

    def _too_large(self) -> PromptTooLarge:
        return PromptTooLarge(
            f"the request body is over {self.body_limit} bytes (server.http_max_body_bytes)", limit=self.body_limit
        )


def raw_response(reply: ErrorReply) -> bytes:
    """An error answer as bytes on the wire, for a connection aiohttp has no request object for (its
    headers never completed); it asks the client to close."""
    body = json.dumps(reply.body).encode()
    lines = [
        f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in reply.headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class DoorConnection(web.RequestHandler):
    """aiohttp's handler of one connection, with a deadline for each request's headers, and answers in the
    door's own shape (one log line, no traceback) to requests aiohttp cannot parse.

    The door's middleware marks when a request is being handled (`request_started` / `request_finished`):
    bytes arriving while none is, start the header clock.
    """

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        header_timeout: float,
        rejected: Callable[[SchedulerError], None],
        internal: Callable[[BaseException], None],
        **settings: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **settings)
        self._door_loop = loop
        self._header_timeout = header_timeout
        self._rejected = rejected  # counts and logs (one line) a request refused here
        self._internal = internal  # counts and logs a bug
        self._header_timer: asyncio.TimerHandle | None = None
        self._handling = False

    def data_received(self, data: bytes) -> None:
        if data and not self._handling and self._header_timer is None:
            self._header_timer = self._door_loop.call_later(self._header_timeout, self._headers_too_slow)
        super().data_received(data)

    def request_started(self) -> None:
        """A request's headers are complete and its handler runs: the header clock stops."""
        self._handling = True
        self._stop_header_clock()

    def request_finished(self) -> None:
        self._handling = False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_clock()
        super().connection_lost(exc)

    def _stop_header_clock(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        transport = self.transport
        if self._handling or transport is None or transport.is_closing():
            return
        error = ReadTimeout(
            f"the request headers did not arrive within {self._header_timeout:g} s (server.http_header_timeout_seconds)"
        )
        self._rejected(error)
        transport.write(raw_response(error_reply(error)))
        self.force_close()

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """What escapes aiohttp's own loop: a client's broken body, met again as aiohttp reads on after the
        answer, was answered and counted already (a debug line); anything else is a bug (counted, logged)."""
        exc = kwargs.get("exc_info")
        if isinstance(exc, RequestPayloadError | HttpProcessingError | ConnectionError):
            log.debug("http_body_unreadable", error=str(exc)[:200])
            return
        self._internal(exc if isinstance(exc, BaseException) else RuntimeError(" ".join(map(str, args))))

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse (status < 500: a client's bytes, logged on one
        line) or to an exception past the door's own handling (500: a bug, counted and logged in full)."""
        self._stop_header_clock()
        if request.writer.output_size > 0:  # an answer has started: the connection is all that can go
            raise ConnectionError("an error after the response started")
        error: SchedulerError
        if status < 500:
            text = message or (str(exc) if exc is not None else HTTPStatus(status).phrase)
            error = MalformedRequest(f"the request cannot be parsed: {text[:200]}")
            self._rejected(error)
        else:
            self._internal(exc or RuntimeError(message or "aiohttp error"))
            error = InternalError("internal error")
        reply = error_reply(error)
        response = web.json_response(reply.body, status=reply.status, headers=reply.headers)
        response.force_close()
        return response
