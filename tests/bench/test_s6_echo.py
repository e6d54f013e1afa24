"""S6's yardstick: the bare gRPC echo runs as its own process and answers the scheduler's client like the
scheduler does for an instant engine (queued, dispatched, one delta with every token, finished)."""

from __future__ import annotations

import grpc

from bench import harness
from bench.clients import RunClock, ScheduledClient
from bench.records import RequestRecord
from clients import pb, pb_grpc


async def test_the_echo_streams_the_schedulers_four_messages_from_its_own_process() -> None:
    async with harness.grpc_echo() as echo, grpc.aio.insecure_channel(echo.target) as channel:
        stub = pb_grpc.SchedulerServiceStub(channel)
        kinds = [
            event.WhichOneof("event")
            async for event in stub.Stream(
                pb.StreamRequest(params=pb.GenerationParams(model="m", prompt="hi", max_tokens=16))
            )
        ]
        record = RequestRecord(user="u", tag="t", sent=0.0, max_tokens=16)
        await ScheduledClient(stub, "m", RunClock(), "echo").run(record, "hi")
        assert echo.cpu_seconds() > 0  # a separate process, so its CPU is accounted like the scheduler's
    assert kinds == ["queued", "dispatched", "delta", "finished"]
    assert record.completed and record.tokens == 16 and record.first_token is not None
