"""A request body that does not decode gets INVALID_ARGUMENT with ErrorInfo, like any other bad request.

grpc.aio decodes a request with the method's `request_deserializer` before it calls our handler, and
answers a deserializer's exception with UNKNOWN "Unexpected <class '...DecodeError'>" and no details: no
handler code of ours runs, so neither `to_grpc_status` nor a servicer `try` can help. `DecodeGuard` is a
server interceptor that gives every method with a single request message (all of llmsched.v1 and health)
a deserializer that turns a DecodeError into an `_Undecodable` marker, and a behaviour that answers the
marker with `MalformedRequest` before the real handler is called. Methods with streamed requests (only
server reflection here) are left as they are.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import grpc
import structlog
from google.protobuf.message import DecodeError

from scheduler_svc.core.errors import MalformedRequest
from scheduler_svc.grpc.status import to_grpc_status

log = structlog.get_logger(__name__)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
if TYPE_CHECKING:  # generic in the stubs only
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.aio.ServerInterceptor


class _Undecodable:
    """Stands in for a request whose bytes did not decode; says why."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except DecodeError as exc:  # its text names the message type and the fault, never the bytes
            return _Undecodable(str(exc))

    return deserialize


async def _refuse(method: str, request: _Undecodable, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
    log.info("request_undecodable", method=method, error=request.error)
    status = to_grpc_status(MalformedRequest(f"the request body does not decode: {request.error}"))
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("unreachable: abort raises")


def _guard(method: str, handler: Handler) -> Handler:
    """`handler` with a tolerant deserializer and a behaviour that refuses undecodable requests."""
    deserializer = handler.request_deserializer
    if handler.request_streaming or deserializer is None:
        return handler
    options: dict[str, Any] = {
        "request_deserializer": _tolerant(deserializer),
        "response_serializer": handler.response_serializer,
    }
    behaviour: Any = handler.unary_stream if handler.response_streaming else handler.unary_unary
    if inspect.isasyncgenfunction(behaviour):  # an async generator of responses (our Stream)

        async def responses(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await _refuse(method, request, context)
            # aclosing: when gRPC closes this generator (client gone), the real one closes at once with it
            async with contextlib.aclosing(behaviour(request, context)) as inner:
                async for response in inner:
                    yield response

        return grpc.unary_stream_rpc_method_handler(responses, **options)
    if inspect.iscoroutinefunction(behaviour):  # a unary answer, or a stream written with context.write

        async def answer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, _Undecodable):
                await _refuse(method, request, context)
            return await behaviour(request, context)

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(answer, **options)
        return grpc.unary_unary_rpc_method_handler(answer, **options)
    return handler  # a synchronous handler: none on this asyncio server


class DecodeGuard(_Interceptor):
    """Server interceptor: undecodable request bodies get INVALID_ARGUMENT (reason MALFORMED_REQUEST).

    The guarded handler is built once per method and reused while the server resolves the method to the
    same handler (registered handlers never change). Only resolved methods are kept, so a client naming
    random methods grows nothing.
    """

    def __init__(self) -> None:
        self._guarded: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)  # always: interceptors after this one must run
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED
            return handler
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._guarded[method] = (handler, _guard(method, handler))
        return cached[1]
