"""The bench's gRPC client keeps the scheduler's own time to first token (its `Finished` timings), so R1 can
split a latecomer's wait into the scheduler's hop (the client's TTFT minus the scheduler's) and the rest."""

from __future__ import annotations

import aiohttp
import grpc

from bench import harness
from bench.clients import DirectClient, RunClock, ScheduledClient
from bench.configs import scheduler_config, validated_toml
from bench.records import RequestRecord
from clients import pb_grpc


async def test_a_scheduled_request_records_the_schedulers_ttft_inside_its_own() -> None:
    async with harness.fake_engine(16) as engine_url:
        config = scheduler_config(engine_url=engine_url, model="bench-model", engine_model="fake-model")
        async with (
            harness.scheduler_process(validated_toml(config)) as scheduler,
            grpc.aio.insecure_channel(scheduler.target) as channel,
        ):
            client = ScheduledClient(pb_grpc.SchedulerServiceStub(channel), "bench-model", RunClock(), "sched")
            record = RequestRecord(user="alice", tag="late", sent=0.0, max_tokens=16)
            await client.run(record, "hi")
    assert record.completed and record.ttft is not None
    assert record.scheduler_ttft is not None and 0 < record.scheduler_ttft <= record.ttft
    assert record.scheduler_hop is not None and record.scheduler_hop > 0  # the two gRPC legs take time
    assert record.scheduler_queue_wait is not None and 0 <= record.scheduler_queue_wait <= record.scheduler_ttft
    assert record.intake is not None and 0 < record.intake <= record.scheduler_ttft - record.scheduler_queue_wait
    assert record.summary()["scheduler_ttft"] is not None


async def test_a_direct_request_records_the_engines_intake_before_its_first_token() -> None:
    async with harness.fake_engine(16) as engine_url, aiohttp.ClientSession() as session:
        record = RequestRecord(user="alice", tag="late", sent=0.0, max_tokens=16)
        await DirectClient(session, engine_url, "fake-model", RunClock(), "direct").run(record, "hi")
    assert record.completed and record.ttft is not None
    assert record.intake is not None and 0 < record.intake <= record.ttft


def test_a_record_without_the_schedulers_figure_has_no_hop() -> None:
    direct = RequestRecord(user="alice", tag="late", sent=1.0, max_tokens=16)
    direct.received(1.25, 1)
    assert direct.ttft == 0.25 and direct.scheduler_hop is None
