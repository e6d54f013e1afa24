"""A bare grpc.aio server-streaming echo: S6's yardstick for what one gRPC hop costs on this machine.

It serves `SchedulerService.Stream` with no scheduler behind it: every call at once gets the messages the
scheduler sends for an answer from the instant fake engine (queued, dispatched, one delta holding every
token, finished), built from the request alone. Run as its own process and reached by the same client as
the scheduler, its round trip is the floor any gRPC front end pays: S6 reports the scheduler's added
latency against twice this round trip, measured in the same run.

    python -m bench.servers.grpc_echo --port 50099
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from clients import pb, pb_grpc


class EchoServicer(pb_grpc.SchedulerServiceServicer):
    """`Stream` answers from the request alone; nothing is queued, dispatched or generated."""

    async def Stream(
        self, request: pb.StreamRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.StreamResponse]:
        tokens = max(request.params.max_tokens, 1)
        yield pb.StreamResponse(queued=pb.Queued(request_id="echo", position_in_user_queue=1, model_queue_depth=1))
        yield pb.StreamResponse(dispatched=pb.Dispatched(backend="echo"))
        yield pb.StreamResponse(delta=pb.Delta(text="".join(f" t{i}" for i in range(tokens)), tokens=tokens))
        usage = pb.Usage(prompt_tokens=4, completion_tokens=tokens)
        yield pb.StreamResponse(finished=pb.Finished(finish_reason=pb.FINISH_REASON_LENGTH, usage=usage))

    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.SubmitResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the echo answers Stream only")
        raise AssertionError("unreachable: abort raises")

    async def GetQueueState(
        self, request: pb.GetQueueStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetQueueStateResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the echo answers Stream only")
        raise AssertionError("unreachable: abort raises")

    async def ReloadConfig(
        self, request: pb.ReloadConfigRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReloadConfigResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the echo answers Stream only")
        raise AssertionError("unreachable: abort raises")

    async def DrainBackend(
        self, request: pb.DrainBackendRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DrainBackendResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the echo answers Stream only")
        raise AssertionError("unreachable: abort raises")

    async def UndrainBackend(
        self, request: pb.UndrainBackendRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UndrainBackendResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the echo answers Stream only")
        raise AssertionError("unreachable: abort raises")


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServiceServicer_to_server(EchoServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
